package fs

import (
	"context"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// A memory volume (a task's secrets/ or private/) is what a tmpfs mounted
// with size= and nr_inodes= gives Nomad, held in the daemon's heap. Its
// accounting follows mm/shmem.c where a task can see it, and is stricter
// where the daemon's memory is at stake:
//
//   - File data is kept and charged in pages, allocated on first write
//     (holes cost nothing): a write past the byte cap is cut short at a
//     page boundary and the next one fails with ENOSPC, as on tmpfs, and
//     st_blocks tells the truth.
//   - Every entry takes memEntrySpace of the entry budget, nr_inodes times
//     that in all, the root included, as tmpfs's "ispace" does; xattrs
//     take simple_xattr_space() of it. Creating an entry, or setting an
//     xattr, that does not fit fails with ENOSPC.
//   - Unlike tmpfs, names, symbolic link targets and xattrs also count
//     against the byte cap: they live in the daemon's heap, not in the
//     kernel's slabs, so the cap bounds everything a task can make the
//     daemon hold, apart from a fixed per-entry overhead that the entry cap
//     bounds (see defaultMemInodes). A volume filled with data to the last
//     page therefore holds a page less than tmpfs, and a rename to a
//     longer name can fail with ENOSPC.
//   - A hard link takes an entry of the budget, as tmpfs's shmem_link
//     reserves an inode for each new name; the last name's entry, and the
//     content, are returned when the node is gone for good: at the last
//     close of a file unlinked while open, as tmpfs does at eviction.
//   - Two differences remain that the daemon cannot see past: an open with
//     O_TRUNC of an empty file leaves its times (without
//     FUSE_ATOMIC_O_TRUNC the kernel sends the same SETATTR as for a
//     truncate(2) that keeps the size, which tmpfs leaves alone), and
//     renameat2 RENAME_WHITEOUT gives EINVAL (go-fuse moves the node in
//     its tree after the daemon answers, leaving no way to put the
//     whiteout in its place).
const (
	memPageSize = 4096
	// memEntrySpace is tmpfs's BOGO_INODE_SIZE: what one entry costs of
	// the entry budget.
	memEntrySpace = 1024
	// memXattrOverhead is the fixed part of the kernel's
	// simple_xattr_space(); it is also about what a name and value
	// header cost here.
	memXattrOverhead = 40
	// memMinInodes is the smallest entry cap a memory volume gets.
	memMinInodes = 1024
)

// defaultMemInodes is the entry cap (nr_inodes) of a memory volume of size
// bytes when nobody sets one: one entry per KiB of the byte cap, and never
// fewer than memMinInodes (what the default 1 MiB volume gets). tmpfs's
// default, half the machine's pages, would let one task make the daemon
// hold millions of nodes. An entry costs the daemon roughly 0.5 to 1 KiB
// beyond what the byte cap counts (go-fuse's Inode, the node's metadata,
// the directory's map slot; TestMemVolumeManyEntries measures it), so with
// one entry per KiB the whole volume stays within about twice its byte
// cap, while a 1 MiB secrets/ still holds a thousand files.
func defaultMemInodes(size int64) int64 {
	return max(size/1024, memMinInodes)
}

// memVolume is the budget of one memory volume: bytes (size=) and
// entries (nr_inodes=), both charged before anything is allocated.
type memVolume struct {
	mu     sync.Mutex
	limit  int64 // byte cap
	used   int64
	inodes int64 // entry cap
	// freeEntry is what is left of inodes*memEntrySpace.
	freeEntry int64
	// dead is set when the allocation is destroyed: nodes the kernel
	// still holds can no longer grow or gain children.
	dead bool
}

func newMemVolume(limit, inodes int64) *memVolume {
	return &memVolume{limit: limit, inodes: inodes, freeEntry: inodes * memEntrySpace}
}

// charge reserves bytes of the byte cap and entry of the entry budget, or
// neither: ENOSPC when either does not fit.
func (v *memVolume) charge(bytes, entry int64) syscall.Errno {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead || v.used+bytes > v.limit || entry > v.freeEntry {
		return syscall.ENOSPC
	}
	v.used += bytes
	v.freeEntry -= entry
	return 0
}

// release returns what charge reserved.
func (v *memVolume) release(bytes, entry int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dead {
		return
	}
	v.used -= bytes
	v.freeEntry += entry
}

// newEntry charges an entry called name: ENOENT once the volume is gone,
// as creating in a removed directory gives.
func (v *memVolume) newEntry(name string) syscall.Errno {
	v.mu.Lock()
	dead := v.dead
	v.mu.Unlock()
	if dead {
		return syscall.ENOENT
	}
	return v.charge(int64(len(name)), memEntrySpace)
}

// kill marks the volume destroyed; its usage no longer matters.
func (v *memVolume) kill() {
	v.mu.Lock()
	v.dead = true
	v.used, v.freeEntry = v.limit, 0
	v.mu.Unlock()
}

// statfs reports the caps as tmpfs does: blocks of 4 KiB from the byte cap,
// files from the entry cap.
func (v *memVolume) statfs(out *fuse.StatfsOut) {
	v.mu.Lock()
	defer v.mu.Unlock()
	out.Bsize, out.Frsize = memPageSize, memPageSize
	out.Blocks = uint64((v.limit + memPageSize - 1) / memPageSize)
	free := max(v.limit-v.used, 0)
	out.Bfree = uint64(free / memPageSize)
	out.Bavail = out.Bfree
	out.Files = uint64(v.inodes)
	out.Ffree = uint64(max(v.freeEntry, 0) / memEntrySpace)
	out.NameLen = maxNameLen
}

// memAttr is the metadata every memory node keeps.
type memAttr struct {
	mode  uint32
	uid   uint32
	gid   uint32
	atime time.Time
	mtime time.Time
	ctime time.Time
}

func newMemAttr(ctx context.Context, mode uint32, parent *memDir) memAttr {
	now := time.Now()
	a := memAttr{mode: mode, atime: now, mtime: now, ctime: now}
	if c, ok := fuse.FromContext(ctx); ok {
		a.uid, a.gid = c.Uid, c.Gid
	}
	if parent != nil {
		parent.mu.Lock()
		if parent.attr.mode&syscall.S_ISGID != 0 {
			a.gid = parent.attr.gid
			if mode&syscall.S_IFMT == syscall.S_IFDIR {
				a.mode |= syscall.S_ISGID
			}
		}
		parent.mu.Unlock()
	}
	return a
}

func (a *memAttr) fill(out *fuse.Attr, ino uint64, size uint64, nlink uint32) {
	out.Mode = a.mode
	out.Uid, out.Gid = a.uid, a.gid
	out.Ino = ino
	out.Size = size
	out.Blksize = memPageSize
	out.Nlink = nlink
	out.SetTimes(&a.atime, &a.mtime, &a.ctime)
}

// setattr applies the metadata part of a SETATTR.
func (a *memAttr) setattr(in *fuse.SetAttrIn) {
	now := time.Now()
	if m, ok := in.GetMode(); ok {
		a.mode = a.mode&syscall.S_IFMT | m&07777
		a.ctime = now
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok {
		a.uid = uid
	}
	if gok {
		a.gid = gid
	}
	if uok || gok {
		a.ctime = now
	}
	if t, ok := in.GetATime(); ok {
		a.atime = t
		a.ctime = now
	}
	if t, ok := in.GetMTime(); ok {
		a.mtime = t
		a.ctime = now
	}
	kill := in.Valid&fuse.FATTR_KILL_SUIDGID != 0
	if in.Valid&^(fuse.FATTR_FH|fuse.FATTR_LOCKOWNER) == 0 {
		// Only chown(-1, -1) reaches a FUSE server as an empty SETATTR:
		// tmpfs changes ctime and drops the set-id bits for it, as for
		// any chown.
		a.ctime = now
		kill = true
	}
	if kill {
		a.killSetid()
	}
}

// killSetid drops the set-id bits of a non-directory as the kernel does
// when a file is changed by someone without CAP_FSETID, or chowned:
// set-user-ID always, set-group-ID only with group execute (without it
// the bit means mandatory locking, not privilege).
func (a *memAttr) killSetid() {
	if a.mode&syscall.S_IFMT == syscall.S_IFDIR {
		return
	}
	a.mode &^= syscall.S_ISUID
	if a.mode&syscall.S_IXGRP != 0 {
		a.mode &^= syscall.S_ISGID
	}
}

// memXattr is one extended attribute of a memory node.
type memXattr struct {
	name  string
	value []byte
}

// space is what the xattr costs, of both budgets: the kernel's
// simple_xattr_space(), so that the entry budget runs out where tmpfs's
// does.
func (x memXattr) space() int64 {
	return memXattrOverhead + int64(len(x.name)+len(x.value))
}

// memNode holds what every memory node keeps: its volume, metadata and
// xattrs, and a size and link count that do not depend on content (files
// override both).
type memNode struct {
	gofs.Inode
	v      *memVolume
	mu     sync.Mutex
	attr   memAttr
	size   uint64
	nlink  uint32
	rdev   uint32 // device number of a device node
	xattrs []memXattr
	// opens counts the open handles of a file: an unlinked file keeps
	// its content and its entry until the last one is released.
	opens int
	// freed is set once the content and the entry have been returned.
	freed bool
}

// node gives the memNode every memory node embeds.
func (n *memNode) node() *memNode { return n }

// memNoder is any node of a memory tree.
type memNoder interface {
	node() *memNode
	memContent
}

// memContent is a node whose content can be freed when its volume goes.
type memContent interface {
	// clear frees the node's content and returns what it was charged,
	// in bytes and of the entry budget (the entry itself excluded).
	clear() (bytes, entry int64)
}

var _ = (memContent)((*memNode)(nil))

func (n *memNode) clear() (bytes, entry int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, x := range n.xattrs {
		bytes += x.space()
		entry += x.space()
	}
	n.xattrs = nil
	return bytes, entry
}

// dropName returns what the name of ch was charged and takes one link
// from ch: a directory has no other, a node left with no link and no open
// handle is freed, and one still open is freed at its last release.
func (v *memVolume) dropName(name string, ch *gofs.Inode) {
	ops := ch.Operations().(memNoder)
	n := ops.node()
	n.mu.Lock()
	if ch.IsDir() || n.nlink == 0 {
		n.nlink = 0
	} else {
		n.nlink--
	}
	n.attr.ctime = time.Now()
	linked := n.nlink > 0
	gone := n.takeFree()
	n.mu.Unlock()
	if f, ok := ops.(*memFile); ok && !linked && !gone {
		gone = f.awaitClosing()
	}
	switch {
	case linked:
		// Another name keeps the node: this one's entry goes back, as
		// tmpfs's unlink frees an inode of a node with more links.
		v.release(int64(len(name)), memEntrySpace)
	default:
		v.release(int64(len(name)), 0)
	}
	if gone {
		v.free(ops)
	}
}

// takeFree reports whether the node is unreachable (no link, no open
// handle) and not yet freed, and marks it freed; n.mu is held.
func (n *memNode) takeFree() bool {
	if n.nlink > 0 || n.opens > 0 || n.freed {
		return false
	}
	n.freed = true
	return true
}

// free returns a node's content and its entry to the volume.
func (v *memVolume) free(ops memNoder) {
	bytes, entry := ops.clear()
	v.release(bytes, entry+memEntrySpace)
}

var _ = (gofs.NodeGetattrer)((*memNode)(nil))

func (n *memNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attr.fill(&out.Attr, n.StableAttr().Ino, n.size, n.nlink)
	out.Rdev = n.rdev
	return 0
}

var _ = (gofs.NodeSetattrer)((*memNode)(nil))

func (n *memNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attr.setattr(in)
	n.attr.fill(&out.Attr, n.StableAttr().Ino, n.size, n.nlink)
	out.Rdev = n.rdev
	return 0
}

var _ = (gofs.NodeStatfser)((*memNode)(nil))

func (n *memNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	n.v.statfs(out)
	return 0
}

// xattrPrefixes are the namespaces tmpfs stores. The kernel has already
// applied the VFS rules before a request reaches the daemon: trusted.*
// needs CAP_SYS_ADMIN, user.* only on regular files and directories,
// names of 1 to 255 bytes, values up to 64 KiB. POSIX ACLs
// (system.posix_acl_*) are refused with EOPNOTSUPP, as on a tmpfs built
// without them: the kernel enforces a FUSE file's ACL only when the daemon
// negotiates FUSE_POSIX_ACL, and an ACL that is stored but not enforced
// would mislead.
var xattrPrefixes = []string{"security.", "trusted.", "user."}

// checkXattrName answers as tmpfs's handler lookup does: EOPNOTSUPP for a
// namespace it does not store, EINVAL for a bare prefix.
func checkXattrName(name string) syscall.Errno {
	for _, p := range xattrPrefixes {
		if strings.HasPrefix(name, p) {
			if len(name) == len(p) {
				return syscall.EINVAL
			}
			return 0
		}
	}
	return syscall.EOPNOTSUPP
}

// findXattr returns the index of name in n.xattrs, or -1; n.mu is held.
func (n *memNode) findXattr(name string) int {
	for i, x := range n.xattrs {
		if x.name == name {
			return i
		}
	}
	return -1
}

var _ = (gofs.NodeSetxattrer)((*memNode)(nil))

// Setxattr charges the new value before the flags are looked at and frees
// the old one after, as tmpfs does: a replacement needs room for both.
func (n *memNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if errno := checkXattrName(attr); errno != 0 {
		return errno
	}
	x := memXattr{name: attr, value: append([]byte{}, data...)}
	if errno := n.v.charge(x.space(), x.space()); errno != 0 {
		return errno
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.findXattr(attr)
	switch {
	case i >= 0 && flags&xattrCreate != 0:
		n.v.release(x.space(), x.space())
		return syscall.EEXIST
	case i < 0 && flags&xattrReplace != 0:
		n.v.release(x.space(), x.space())
		return syscall.ENODATA
	case i >= 0:
		old := n.xattrs[i]
		n.xattrs[i] = x
		n.v.release(old.space(), old.space())
	default:
		n.xattrs = append(n.xattrs, x)
	}
	n.attr.ctime = time.Now()
	return 0
}

const (
	xattrCreate  = 0x1 // XATTR_CREATE
	xattrReplace = 0x2 // XATTR_REPLACE
)

var _ = (gofs.NodeGetxattrer)((*memNode)(nil))

func (n *memNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if errno := checkXattrName(attr); errno != 0 {
		return 0, errno
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.findXattr(attr)
	if i < 0 {
		return 0, syscall.ENODATA
	}
	v := n.xattrs[i].value
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

var _ = (gofs.NodeListxattrer)((*memNode)(nil))

// Listxattr lists names in descending byte order, the order tmpfs lists
// them in on Linux 6.18, and leaves trusted.* out for callers without
// CAP_SYS_ADMIN, as tmpfs does (the kernel checks nothing of a FUSE list).
func (n *memNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	n.mu.Lock()
	names := make([]string, 0, len(n.xattrs))
	for _, x := range n.xattrs {
		names = append(names, x.name)
	}
	n.mu.Unlock()
	trusted := -1 // unknown until a trusted.* name needs it
	out := names[:0]
	for _, name := range names {
		if strings.HasPrefix(name, "trusted.") {
			if trusted < 0 {
				trusted = 0
				if callerHasCap(ctx, capSysAdmin) {
					trusted = 1
				}
			}
			if trusted == 0 {
				continue
			}
		}
		out = append(out, name)
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	size := 0
	for _, name := range out {
		size += len(name) + 1
	}
	if len(dest) < size {
		return uint32(size), syscall.ERANGE
	}
	off := 0
	for _, name := range out {
		off += copy(dest[off:], name)
		dest[off] = 0
		off++
	}
	return uint32(size), 0
}

var _ = (gofs.NodeRemovexattrer)((*memNode)(nil))

func (n *memNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if errno := checkXattrName(attr); errno != 0 {
		return errno
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	i := n.findXattr(attr)
	if i < 0 {
		return syscall.ENODATA
	}
	old := n.xattrs[i]
	n.xattrs = append(n.xattrs[:i], n.xattrs[i+1:]...)
	n.v.release(old.space(), old.space())
	n.attr.ctime = time.Now()
	return 0
}

// memDirentSize is tmpfs's BOGO_DIRENT_SIZE: a directory's st_size is
// that for each entry, "." and ".." included.
const memDirentSize = 20

const (
	fallocKeepSize  = 0x1 // FALLOC_FL_KEEP_SIZE
	fallocPunchHole = 0x2 // FALLOC_FL_PUNCH_HOLE
)

// dropMemVolume frees everything a destroyed allocation's memory volume
// holds: it marks the volume dead, clears every node's content and cuts
// the tree out of go-fuse's, so that nothing of it stays reachable. Nodes
// the kernel still holds (an open file, a process's working directory)
// stay known to go-fuse until the kernel forgets them, empty.
func dropMemVolume(root *memDir) {
	root.v.kill()
	var walk func(n *gofs.Inode)
	walk = func(n *gofs.Inode) {
		for _, ch := range n.Children() {
			walk(ch)
		}
		if c, ok := n.Operations().(memContent); ok {
			c.clear()
		}
	}
	walk(root.EmbeddedInode())
	root.RmAllChildren()
}
