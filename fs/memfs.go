package fs

import (
	"context"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// quota is the byte budget of one memory-only directory tree (a task's
// secrets/ or private/). It is what a size-capped tmpfs gives Nomad.
type quota struct {
	mu    sync.Mutex
	used  int64
	limit int64
}

// grow reserves delta bytes (negative releases) and refuses growth past
// the limit with ENOSPC, exactly as a full tmpfs would.
func (q *quota) grow(delta int64) syscall.Errno {
	q.mu.Lock()
	defer q.mu.Unlock()
	if delta > 0 && q.used+delta > q.limit {
		return syscall.ENOSPC
	}
	q.used += delta
	return 0
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
	out.Blocks = (size + 511) / 512
	out.Blksize = 4096
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
}

// memNode holds what every memory node keeps: its metadata, and a size
// and link count that do not depend on content (files override both).
type memNode struct {
	gofs.Inode
	mu    sync.Mutex
	attr  memAttr
	size  uint64
	nlink uint32
}

var _ = (gofs.NodeGetattrer)((*memNode)(nil))

func (n *memNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attr.fill(&out.Attr, n.StableAttr().Ino, n.size, n.nlink)
	return 0
}

var _ = (gofs.NodeSetattrer)((*memNode)(nil))

func (n *memNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.attr.setattr(in)
	n.attr.fill(&out.Attr, n.StableAttr().Ino, n.size, n.nlink)
	return 0
}

// memDir is a directory of a memory-only tree. Its children are
// persistent go-fuse inodes, so lookups and listings are served from the
// inode tree itself and never reach the disk.
type memDir struct {
	memNode
	q *quota
}

func newMemDir(q *quota, attr memAttr) *memDir {
	return &memDir{memNode: memNode{attr: attr, size: 4096, nlink: 2}, q: q}
}

func (d *memDir) touch() {
	d.mu.Lock()
	now := time.Now()
	d.attr.mtime, d.attr.ctime = now, now
	d.mu.Unlock()
}

func (d *memDir) checkName(name string) syscall.Errno {
	if len(name) > maxNameLen {
		return syscall.ENAMETOOLONG
	}
	if d.GetChild(name) != nil {
		return syscall.EEXIST
	}
	return 0
}

var _ = (gofs.NodeMkdirer)((*memDir)(nil))

func (d *memDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := d.checkName(name); errno != 0 {
		return nil, errno
	}
	child := newMemDir(d.q, newMemAttr(ctx, syscall.S_IFDIR|mode&07777, d))
	ch := d.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: syscall.S_IFDIR})
	d.AddChild(name, ch, false)
	d.touch()
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, 4096, 2)
	return ch, 0
}

var _ = (gofs.NodeCreater)((*memDir)(nil))

func (d *memDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := d.checkName(name); errno != 0 {
		return nil, nil, 0, errno
	}
	child := &memFile{memNode: memNode{attr: newMemAttr(ctx, syscall.S_IFREG|mode&07777, d), nlink: 1}, q: d.q}
	ch := d.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: syscall.S_IFREG})
	d.AddChild(name, ch, false)
	d.touch()
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, 0, 1)
	return ch, nil, fuse.FOPEN_DIRECT_IO, 0
}

var _ = (gofs.NodeSymlinker)((*memDir)(nil))

func (d *memDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := d.checkName(name); errno != 0 {
		return nil, errno
	}
	if errno := d.q.grow(int64(len(target))); errno != 0 {
		return nil, errno
	}
	child := &memLink{memNode: memNode{attr: newMemAttr(ctx, syscall.S_IFLNK|0o777, d), size: uint64(len(target)), nlink: 1}, target: []byte(target)}
	ch := d.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: syscall.S_IFLNK})
	d.AddChild(name, ch, false)
	d.touch()
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, uint64(len(target)), 1)
	return ch, 0
}

var _ = (gofs.NodeMknoder)((*memDir)(nil))

// Mknod makes FIFOs and sockets (a task API socket may live in secrets/);
// device nodes are refused: secrets/ is mounted nodev in Nomad too.
func (d *memDir) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFIFO, syscall.S_IFSOCK:
	default:
		return nil, syscall.EPERM
	}
	if errno := d.checkName(name); errno != 0 {
		return nil, errno
	}
	child := &memNode{attr: newMemAttr(ctx, mode, d), nlink: 1}
	ch := d.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: mode & syscall.S_IFMT})
	d.AddChild(name, ch, false)
	d.touch()
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, 0, 1)
	return ch, 0
}

var _ = (gofs.NodeUnlinker)((*memDir)(nil))

func (d *memDir) Unlink(ctx context.Context, name string) syscall.Errno {
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	if ch.IsDir() {
		return syscall.EISDIR
	}
	switch n := ch.Operations().(type) {
	case *memFile:
		n.release()
	case *memLink:
		d.q.grow(-int64(len(n.target)))
	}
	d.touch()
	return 0
}

var _ = (gofs.NodeRmdirer)((*memDir)(nil))

func (d *memDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	if !ch.IsDir() {
		return syscall.ENOTDIR
	}
	if len(ch.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	d.touch()
	return 0
}

var _ = (gofs.NodeRenamer)((*memDir)(nil))

// Rename within one memory tree; the bridge moves the inode in the tree
// once this returns OK.
func (d *memDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	dst, ok := newParent.(*memDir)
	if !ok || dst.q != d.q {
		return syscall.EXDEV
	}
	if len(newName) > maxNameLen {
		return syscall.ENAMETOOLONG
	}
	src := d.GetChild(name)
	if src == nil {
		return syscall.ENOENT
	}
	existing := dst.GetChild(newName)
	switch {
	case flags&renameExchange != 0:
		if existing == nil {
			return syscall.ENOENT
		}
	case flags&renameNoReplace != 0 && existing != nil:
		return syscall.EEXIST
	case existing != nil:
		if existing.IsDir() != src.IsDir() {
			if existing.IsDir() {
				return syscall.EISDIR
			}
			return syscall.ENOTDIR
		}
		if existing.IsDir() && len(existing.Children()) > 0 {
			return syscall.ENOTEMPTY
		}
		if f, ok := existing.Operations().(*memFile); ok {
			f.release()
		}
	}
	d.touch()
	dst.touch()
	return 0
}

// memFile is a regular file held in memory. Its bytes count against the
// tree's quota.
type memFile struct {
	memNode
	q    *quota
	data []byte
}

// release returns the file's bytes to the quota when its last name goes.
func (f *memFile) release() {
	f.mu.Lock()
	n := len(f.data)
	f.data = nil
	f.mu.Unlock()
	f.q.grow(-int64(n))
}

var _ = (gofs.NodeOpener)((*memFile)(nil))

// Open needs no handle: reads and writes go to the node. Direct I/O keeps
// the kernel from caching secrets in the page cache of the mount.
func (f *memFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		f.mu.Lock()
		errno := f.truncate(0)
		f.mu.Unlock()
		if errno != 0 {
			return nil, 0, errno
		}
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

var _ = (gofs.NodeReader)((*memFile)(nil))

func (f *memFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if off >= int64(len(f.data)) {
		return fuse.ReadResultData(nil), 0
	}
	end := off + int64(len(dest))
	if end > int64(len(f.data)) {
		end = int64(len(f.data))
	}
	out := make([]byte, end-off)
	copy(out, f.data[off:end])
	return fuse.ReadResultData(out), 0
}

var _ = (gofs.NodeWriter)((*memFile)(nil))

func (f *memFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := off + int64(len(data))
	if end > int64(len(f.data)) {
		if errno := f.truncate(end); errno != 0 {
			return 0, errno
		}
	}
	copy(f.data[off:], data)
	now := time.Now()
	f.attr.mtime, f.attr.ctime = now, now
	// Writing drops set-id bits, as the kernel would on a local file.
	f.attr.mode &^= syscall.S_ISUID | syscall.S_ISGID
	return uint32(len(data)), 0
}

// truncate resizes the data within the quota; f.mu is held.
func (f *memFile) truncate(size int64) syscall.Errno {
	delta := size - int64(len(f.data))
	if errno := f.q.grow(delta); errno != 0 {
		return errno
	}
	if delta > 0 {
		f.data = append(f.data, make([]byte, delta)...)
	} else {
		f.data = f.data[:size:size]
	}
	now := time.Now()
	f.attr.mtime, f.attr.ctime = now, now
	return 0
}

var _ = (gofs.NodeGetattrer)((*memFile)(nil))

func (f *memFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attr.fill(&out.Attr, f.StableAttr().Ino, uint64(len(f.data)), 1)
	return 0
}

var _ = (gofs.NodeSetattrer)((*memFile)(nil))

func (f *memFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if size, ok := in.GetSize(); ok {
		if errno := f.truncate(int64(size)); errno != 0 {
			return errno
		}
	}
	f.attr.setattr(in)
	f.attr.fill(&out.Attr, f.StableAttr().Ino, uint64(len(f.data)), 1)
	return 0
}

var _ = (gofs.NodeFsyncer)((*memFile)(nil))

// Fsync has nothing to flush: memory is the only copy, by design.
func (f *memFile) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return 0
}

// memLink is a symbolic link in a memory tree.
type memLink struct {
	memNode
	target []byte
}

var _ = (gofs.NodeReadlinker)((*memLink)(nil))

func (l *memLink) Readlink(ctx context.Context) ([]byte, syscall.Errno) { return l.target, 0 }
