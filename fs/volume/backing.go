package volume

import (
	"context"
	"errors"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/allocfs/allocfs/fs/killpriv"
	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The operations of a volume node on its backing entries. Each one is
// fd-relative (layer.Loc): the directory holding the entry is opened
// beneath its layer's root and the entry named in it, so no backing path
// is ever built, a task's path is limited only by the mount's PATH_MAX,
// and a symbolic link swapped into a layer is never followed.

// rel is the node's path inside its volume ("" for the root): the names
// from the volume root its parents lead to now. That is n.vroot, but for
// a node the kernel was given back under a root made since. A node ID is
// the inode number (ExternalNodeID) and the kernel evicts a tree's inodes
// in its inode cache's order, not the tree's (a drop of caches, memory
// pressure), so the FORGET of a volume root may be served before those of
// nodes below it, which go-fuse then still holds under their numbers: the
// next lookups make a new root, and the one of such a name hands the old
// node back, with the new parents. Seen from its old root it would be an
// orphan, which go-fuse's Path names ".go-fuse.<n>/deleted/...", a path
// in no layer: every request on it failed with ENOENT, which os.RemoveAll
// takes for gone, so that a chroot's GC failed with ENOTEMPTY further up.
// The new root shows the same volume through the same layers, so the node
// serves it from there as it is, frozen with it.
func (n *Node) rel() string {
	var names []string
	for in := n.EmbeddedInode(); in != n.vroot; {
		name, parent := in.Parent()
		if parent == nil {
			// Removed, or its volume went: go-fuse's orphan path.
			return n.EmbeddedInode().Path(n.vroot)
		}
		names = append(names, name)
		if r, ok := parent.Operations().(*Node); ok && parent != n.vroot && r.EmbeddedInode() == r.vroot {
			if !n.sameVolume(r) {
				return n.EmbeddedInode().Path(n.vroot)
			}
			if r.ReadOnly() {
				n.Freeze()
			}
			break
		}
		in = parent
	}
	slices.Reverse(names)
	return strings.Join(names, "/")
}

// sameVolume reports whether the volume root r shows the volume n's own
// root showed, in the same view: the same layers, the same inode numbers.
func (n *Node) sameVolume(r *Node) bool {
	if r.st == n.st {
		return true
	}
	return r.st != nil && n.st != nil && slices.Equal(r.st.Roots, n.st.Roots) && r.slot == n.slot && r.alloc == n.alloc
}

// at names name in the node's directory (the node's own entry for "") in
// the layer at position i. The caller closes it.
func (n *Node) at(i int, name string) (layer.Loc, syscall.Errno) {
	l, err := n.st.Loc(i, path.Join(n.rel(), name))
	if err != nil {
		return l, ToErrno(n.p.logger, err)
	}
	return l, 0
}

// shownLayer is the layer the node's entry is shown from.
func (n *Node) shownLayer() int {
	if l := n.nodeLayers(); len(l) > 0 {
		return l[0]
	}
	return 0
}

// lstatBirth stats the entry at l and returns its birth time, which
// tells apart two files that had the same inode number in turn.
func lstatBirth(l layer.Loc, st *syscall.Stat_t) (uint64, error) {
	var x unix.Statx_t
	if err := l.Statx(unix.AT_STATX_SYNC_AS_STAT, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x); err != nil {
		return 0, err
	}
	*st = statFromStatx(&x)
	if x.Mask&unix.STATX_BTIME == 0 {
		return 1, nil
	}
	return uint64(x.Btime.Sec)<<30 | uint64(x.Btime.Nsec), nil
}

// statFromStatx is the stat(2) view of a statx(2) answer.
func statFromStatx(x *unix.Statx_t) syscall.Stat_t {
	ts := func(t unix.StatxTimestamp) syscall.Timespec { return syscall.Timespec{Sec: t.Sec, Nsec: int64(t.Nsec)} }
	return syscall.Stat_t{
		Dev:     unix.Mkdev(x.Dev_major, x.Dev_minor),
		Ino:     x.Ino,
		Nlink:   uint64(x.Nlink),
		Mode:    uint32(x.Mode),
		Uid:     x.Uid,
		Gid:     x.Gid,
		Rdev:    unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size:    int64(x.Size),
		Blksize: int64(x.Blksize),
		Blocks:  int64(x.Blocks),
		Atim:    ts(x.Atime),
		Mtim:    ts(x.Mtime),
		Ctim:    ts(x.Ctime),
	}
}

// upperChild returns the node for an entry of the upper layer of this
// directory, whose lstat is st and birth gen: the node the kernel
// already holds for it, or a new one.
func (n *Node) upperChild(ctx context.Context, st *syscall.Stat_t, gen uint64, out *fuse.EntryOut) *gofs.Inode {
	out.Attr.FromStat(st)
	n.shownCtime(&out.Attr) // keyed by the backing inode number
	salted, _ := n.st.Salted(0, st.Ino)
	ino := salted ^ n.slot<<ViewShift
	out.Attr.Ino = ino
	child := n.newChild([]int{0})
	return n.NewInode(ctx, child, gofs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: ino, Gen: gen})
}

// newChild makes a node for an entry of this volume visible in layers.
func (n *Node) newChild(layers []int) *Node {
	return &Node{p: n.p, st: n.st, vroot: n.vroot, slot: n.slot, alloc: n.alloc, ro: n.ro, ovl: n.ovl, layers: layers}
}

// lookupUpper finds name in the upper layer of this directory.
func (n *Node) lookupUpper(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	l, errno := n.at(0, name)
	if errno != 0 {
		return nil, errno
	}
	defer l.Close()
	return n.upperChildAt(ctx, l, out)
}

// upperChildAt is upperChild for the upper entry at l.
func (n *Node) upperChildAt(ctx context.Context, l layer.Loc, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var st syscall.Stat_t
	gen, err := lstatBirth(l, &st)
	if err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	return n.upperChild(ctx, &st, gen, out), 0
}

// daemonIsRoot is whether this daemon runs as root: only then do new
// entries become their callers' (owner). Asked once: os.Geteuid is a
// system call, and the answer does not change.
var daemonIsRoot = os.Geteuid() == 0

// owner is the uid and gid a new entry of the directory dir gets: the
// caller's, with the group of a setgid directory, as a local filesystem
// gives it.
func (n *Node) owner(ctx context.Context, dir layer.Loc) (int, int, bool) {
	c, ok := fuse.FromContext(ctx)
	if !ok || !daemonIsRoot {
		// Without root, entries stay the daemon's.
		return 0, 0, false
	}
	uid, gid := int(c.Uid), int(c.Gid)
	var st syscall.Stat_t
	if dir.Lstat(&st) == nil && st.Mode&syscall.S_ISGID != 0 {
		gid = int(st.Gid)
	}
	return uid, gid, true
}

// ownedBy reports whether an entry whose lstat is st has the owner and
// group of the caller of ctx, or no caller to give it to (a daemon that
// is not root leaves its entries its own).
func ownedBy(ctx context.Context, st *syscall.Stat_t) bool {
	c, ok := fuse.FromContext(ctx)
	return !ok || !daemonIsRoot || st.Uid == c.Uid && st.Gid == c.Gid
}

// made finishes an entry just made at l: it gets its owner (owner), the
// mode bits asked for (killpriv.RestoreMode) and a node. file is the new entry to
// change: l itself, or, for a file made open, its descriptor, so that
// another file renamed onto the name meanwhile is never the one changed.
// An entry that cannot be finished is removed again.
//
// The entry is made as the daemon (root), so it usually has its owner
// already when the caller is root too, as tasks often are: it is stat'ed
// first, and changed (and stat'ed again) only when its owner is not the
// caller's, which costs the directory's lstat (for its setgid bit) only
// then.
func (n *Node) made(ctx context.Context, l, file layer.Loc, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var st syscall.Stat_t
	gen, err := lstatBirth(file, &st)
	if err == nil && !ownedBy(ctx, &st) {
		if uid, gid, ok := n.owner(ctx, layer.Loc{Dir: l.Dir}); ok && (st.Uid != uint32(uid) || st.Gid != uint32(gid)) {
			if err = file.Chown(uid, gid); err == nil {
				gen, err = lstatBirth(file, &st)
			}
		}
	}
	if err == nil && st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		err = killpriv.RestoreMode(file, &st, mode)
	}
	if err != nil {
		n.unmake(l)
		return nil, ToErrno(n.p.logger, err)
	}
	return n.upperChild(ctx, &st, gen, out), 0
}

// unmake removes an entry an operation made and then failed to finish.
func (n *Node) unmake(l layer.Loc) {
	err := l.Unlink()
	if err != nil {
		err = l.Rmdir()
	}
	if err != nil {
		n.p.logger.Error("could not remove an entry left by a failed operation", "path", l.String(), "error", err)
	}
}

func (n *Node) backingMkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	l, errno := n.at(0, name)
	if errno != 0 {
		return nil, errno
	}
	defer l.Close()
	if err := l.Mkdir(mode & 0o777); err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	return n.made(ctx, l, l, mode, out)
}

func (n *Node) backingMknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	l, errno := n.at(0, name)
	if errno != 0 {
		return nil, errno
	}
	defer l.Close()
	if err := l.Mknod(mode&^0o7000, int(rdev)); err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	if mode&syscall.S_IFMT == syscall.S_IFCHR && rdev == 0 && n.st.Held == nil {
		// The task's own device 0/0, never to be taken for a whiteout.
		// A memory volume is never stacked on, and its tmpfs would
		// charge the mark to the task's entry cap.
		if err := layer.MarkRealDevice(l); err != nil {
			n.p.logger.Error("could not mark a task's device 0/0 as its own", "path", l.String(), "error", err)
			n.unmake(l)
			return nil, ToErrno(n.p.logger, err)
		}
	}
	return n.made(ctx, l, l, mode, out)
}

func (n *Node) backingSymlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	l, errno := n.at(0, name)
	if errno != 0 {
		return nil, errno
	}
	defer l.Close()
	if err := l.Symlink(target); err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	return n.made(ctx, l, l, 0, out)
}

// backingCreate makes and opens a regular file. Its handle is returned
// unwrapped: the caller chooses how it is served.
func (n *Node) backingCreate(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, *gofs.LoopbackFile, syscall.Errno) {
	l, errno := n.at(0, name)
	if errno != 0 {
		return nil, nil, errno
	}
	defer l.Close()
	flags &^= syscall.O_APPEND
	fd, err := l.Open(int(flags)|syscall.O_CREAT|syscall.O_EXCL, mode&0o777)
	if errors.Is(err, syscall.EEXIST) && flags&syscall.O_EXCL == 0 {
		// The kernel sent CREATE on a negative entry that is stale
		// (the name was made through another view, or by allocfs).
		// It checks no permission on a file a CREATE opens, so the
		// existing file must not be opened here: ESTALE makes the
		// kernel look the name up again and open it with the checks
		// an open of an existing file gets.
		return nil, nil, syscall.ESTALE
	}
	if err != nil {
		return nil, nil, ToErrno(n.p.logger, err)
	}
	ch, errno := n.made(ctx, l, layer.Loc{Dir: fd}, mode, out)
	if errno != 0 {
		syscall.Close(fd)
		return nil, nil, errno
	}
	return ch, gofs.NewLoopbackFile(fd).(*gofs.LoopbackFile), 0
}

// backingTmpfile makes an unnamed file (O_TMPFILE) in this directory.
func (n *Node) backingTmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, *gofs.LoopbackFile, syscall.Errno) {
	l, errno := n.at(0, "")
	if errno != 0 {
		return nil, nil, errno
	}
	defer l.Close()
	fd, err := l.Open(int(flags)&^syscall.O_APPEND|unix.O_TMPFILE, mode&0o777)
	if err != nil {
		return nil, nil, ToErrno(n.p.logger, err)
	}
	file := layer.Loc{Dir: fd}
	if uid, gid, ok := n.owner(ctx, l); ok {
		if err := unix.Fchown(fd, uid, gid); err != nil {
			syscall.Close(fd)
			return nil, nil, ToErrno(n.p.logger, err)
		}
	}
	var st syscall.Stat_t
	gen, err := lstatBirth(file, &st)
	if err == nil {
		err = killpriv.RestoreMode(file, &st, mode)
	}
	if err != nil {
		syscall.Close(fd)
		return nil, nil, ToErrno(n.p.logger, err)
	}
	return n.upperChild(ctx, &st, gen, out), gofs.NewLoopbackFile(fd).(*gofs.LoopbackFile), 0
}

func (n *Node) backingUnlink(name string, dir bool) syscall.Errno {
	l, errno := n.at(0, name)
	if errno != 0 {
		return errno
	}
	defer l.Close()
	if dir {
		return ToErrno(n.p.logger, l.Rmdir())
	}
	return ToErrno(n.p.logger, l.Unlink())
}

// backingLink gives the upper entry of t the name name in this directory.
// A file with no name yet (made with O_TMPFILE: the linkat(2) that names
// it comes as LINK without a descriptor) is linked from one of its open
// handles.
func (n *Node) backingLink(t *Node, name string) (layer.Loc, syscall.Errno) {
	from, errno := t.linkSource()
	if errno != 0 {
		return from, errno
	}
	defer from.Close()
	to, errno := n.at(0, name)
	if errno != 0 {
		return to, errno
	}
	if err := layer.Link(from, to); err != nil {
		to.Close()
		return to, ToErrno(n.p.logger, err)
	}
	return to, 0
}

// linkSource names t's file for a link: its entry, or, when it has none,
// a duplicate of an open handle's descriptor, taken while the handle is
// still tracked, so that a RELEASE racing the link cannot close it and
// hand its number to another file.
func (t *Node) linkSource() (layer.Loc, syscall.Errno) {
	if _, parent := t.Parent(); parent != nil {
		return t.at(0, "")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for lf := range t.openFiles {
		fd, ok := lf.PassthroughFd()
		if !ok {
			continue
		}
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return layer.Loc{Dir: -1}, ToErrno(t.p.logger, err)
		}
		return layer.FdLoc(dup, "unnamed file"), 0
	}
	return layer.Loc{Dir: -1}, syscall.ENOENT
}

// backingRename renames name in this directory to newName in dst on the
// upper layer.
func (n *Node) backingRename(name string, dst *Node, newName string, flags uint32) syscall.Errno {
	from, errno := n.at(0, name)
	if errno != 0 {
		return errno
	}
	defer from.Close()
	to, errno := dst.at(0, newName)
	if errno != 0 {
		return errno
	}
	defer to.Close()
	return ToErrno(n.p.logger, layer.Rename(from, to, uint(flags)))
}

// backingGetattr stats the node's upper entry.
func (n *Node) backingGetattr(out *fuse.AttrOut) syscall.Errno {
	l, errno := n.at(0, "")
	if errno != 0 {
		return errno
	}
	defer l.Close()
	var st syscall.Stat_t
	if err := l.Lstat(&st); err != nil {
		return ToErrno(n.p.logger, err)
	}
	out.FromStat(&st)
	return 0
}

// backingSetattr changes the node's upper entry as SETATTR asks, through
// the handle h when there is one, and answers its attributes.
func (n *Node) backingSetattr(ctx context.Context, h gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if fsa, ok := h.(gofs.FileSetattrer); ok {
		return fsa.Setattr(ctx, in, out)
	}
	l, errno := n.at(0, "")
	if errno != 0 {
		return errno
	}
	defer l.Close()
	if mode, ok := in.GetMode(); ok {
		if err := l.Chmod(mode & 0o7777); err != nil {
			return ToErrno(n.p.logger, err)
		}
	}
	uid, gid := -1, -1
	if v, ok := in.GetUID(); ok {
		uid = int(v)
	}
	if v, ok := in.GetGID(); ok {
		gid = int(v)
	}
	if uid != -1 || gid != -1 {
		if err := l.Chown(uid, gid); err != nil {
			return ToErrno(n.p.logger, err)
		}
	}
	// The size before the times: a truncate would stamp over them.
	if size, ok := in.GetSize(); ok {
		fd, err := l.Open(unix.O_WRONLY|unix.O_NONBLOCK, 0)
		if err == nil {
			err = unix.Ftruncate(fd, int64(size))
			unix.Close(fd)
		}
		if err != nil {
			return ToErrno(n.p.logger, err)
		}
	}
	if ts, ok := setattrTimes(in); ok {
		if err := l.Utimes(ts); err != nil {
			return ToErrno(n.p.logger, err)
		}
	}
	var st syscall.Stat_t
	if err := l.Lstat(&st); err != nil {
		return ToErrno(n.p.logger, err)
	}
	out.FromStat(&st)
	return 0
}

// setattrTimes is the utimensat(2) argument for SETATTR's times, and
// false when it sets none.
func setattrTimes(in *fuse.SetAttrIn) ([]unix.Timespec, bool) {
	pick := func(set, now uint32, sec uint64, nsec uint32) unix.Timespec {
		switch {
		case in.Valid&set == 0:
			return unix.Timespec{Nsec: unix.UTIME_OMIT}
		case in.Valid&now != 0:
			return unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		return unix.Timespec{Sec: int64(sec), Nsec: int64(nsec)}
	}
	if in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME) == 0 {
		return nil, false
	}
	return []unix.Timespec{
		pick(fuse.FATTR_ATIME, fuse.FATTR_ATIME_NOW, in.Atime, in.Atimensec),
		pick(fuse.FATTR_MTIME, fuse.FATTR_MTIME_NOW, in.Mtime, in.Mtimensec),
	}, true
}

// backingOpen opens the node's entry in the layer at position i.
func (n *Node) backingOpen(i int, flags uint32) (*gofs.LoopbackFile, syscall.Errno) {
	flags &^= syscall.O_APPEND | syscall.O_CREAT | syscall.O_EXCL | fuse.FMODE_EXEC
	fd, err := n.st.Open(i, n.rel(), int(flags))
	if err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	return gofs.NewLoopbackFile(fd).(*gofs.LoopbackFile), 0
}

var _ = (gofs.NodeStatfser)((*Node)(nil))

// Statfs answers for the filesystem of the volume's upper layer.
func (n *Node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	fd, err := n.st.Open(0, "", unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return ToErrno(n.p.logger, err)
	}
	defer unix.Close(fd)
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil {
		return ToErrno(n.p.logger, err)
	}
	out.FromStatfsT(&st)
	if n.alloc != "" {
		n.p.host.LimitStatfs(n.alloc, out)
	}
	return 0
}

var _ = (gofs.NodeCopyFileRanger)((*Node)(nil))

// CopyFileRange copies between two open files of volumes with
// copy_file_range(2), which the backing filesystem may do by reference.
func (n *Node) CopyFileRange(ctx context.Context, fhIn gofs.FileHandle, offIn uint64, out *gofs.Inode, fhOut gofs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	// A handle without a descriptor of its own: the kernel copies
	// through reads and writes instead.
	in, ok := readFd(fhIn)
	if !ok {
		return 0, syscall.EOPNOTSUPP
	}
	dst, ok := handleFd(fhOut)
	if !ok {
		return 0, syscall.EOPNOTSUPP
	}
	roff, woff := int64(offIn), int64(offOut)
	c, err := unix.CopyFileRange(in, &roff, dst, &woff, int(length), int(flags))
	return uint32(c), ToErrno(n.p.logger, err)
}

// readFd is the descriptor a handle reads from: a lower file's copy once
// it has one.
func readFd(f gofs.FileHandle) (int, bool) {
	if fd, ok := lowerFd(f); ok {
		return fd, true
	}
	return handleFd(f)
}
