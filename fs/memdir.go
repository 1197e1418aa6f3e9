package fs

import (
	"context"
	"sort"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// memDir is a directory of a memory-only tree. Its children are
// persistent go-fuse inodes, so lookups and listings are served from the
// inode tree itself and never reach the disk.
type memDir struct {
	memNode
}

// A directory's nlink field is 2 while it has a name and 0 once removed;
// what it reports adds its subdirectories.
func newMemDir(v *memVolume, attr memAttr) *memDir {
	return &memDir{memNode: memNode{v: v, attr: attr, nlink: 2}}
}

// fillDir reports what tmpfs reports of a directory: st_size from its
// entries and nlink 2 plus its subdirectories. It walks the children, so
// it costs one step per entry, bounded by the entry cap; d.mu is not
// held, as go-fuse takes the inode's own lock to list them.
func (d *memDir) fillDir(out *fuse.Attr) {
	children := d.Children()
	subdirs := 0
	for _, ch := range children {
		if ch.IsDir() {
			subdirs++
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	nlink := d.nlink
	if nlink > 0 {
		nlink += uint32(subdirs)
	}
	d.attr.fill(out, d.StableAttr().Ino, uint64(memDirentSize*(2+len(children))), nlink)
}

var _ = (gofs.NodeGetattrer)((*memDir)(nil))

func (d *memDir) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fillDir(&out.Attr)
	return 0
}

var _ = (gofs.NodeReaddirer)((*memDir)(nil))

// Readdir lists the directory's children, sorted, after "." and "..",
// as tmpfs lists them.
func (d *memDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	children := d.Children()
	names := make([]string, 0, len(children))
	for name := range children {
		names = append(names, name)
	}
	sort.Strings(names)
	entries := make([]fuse.DirEntry, 0, len(names))
	for _, name := range names {
		sa := children[name].StableAttr()
		entries = append(entries, fuse.DirEntry{Name: name, Mode: sa.Mode, Ino: sa.Ino})
	}
	return gofs.NewListDirStream(withDots(d.EmbeddedInode(), entries)), 0
}

var _ = (gofs.NodeSetattrer)((*memDir)(nil))

func (d *memDir) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	d.mu.Lock()
	d.attr.setattr(in)
	d.mu.Unlock()
	d.fillDir(&out.Attr)
	return 0
}

// touchAt sets d's mtime and ctime to now.
func (d *memDir) touchAt(now time.Time) {
	d.mu.Lock()
	d.attr.mtime, d.attr.ctime = now, now
	d.mu.Unlock()
}

func (d *memDir) touch() { d.touchAt(time.Now()) }

// newEntry checks that name can be created in d and charges it.
func (d *memDir) newEntry(name string) syscall.Errno {
	if len(name) > maxNameLen {
		return syscall.ENAMETOOLONG
	}
	if d.GetChild(name) != nil {
		return syscall.EEXIST
	}
	return d.v.newEntry(name)
}

// add puts a new node called name into d; the entry is charged.
func (d *memDir) add(ctx context.Context, name string, node gofs.InodeEmbedder, mode uint32) *gofs.Inode {
	ch := d.NewPersistentInode(ctx, node, gofs.StableAttr{Mode: mode & syscall.S_IFMT})
	d.AddChild(name, ch, false)
	d.touch()
	return ch
}

var _ = (gofs.NodeMkdirer)((*memDir)(nil))

func (d *memDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := d.newEntry(name); errno != 0 {
		return nil, errno
	}
	child := newMemDir(d.v, newMemAttr(ctx, syscall.S_IFDIR|mode&07777, d))
	ch := d.add(ctx, name, child, syscall.S_IFDIR)
	child.fillDir(&out.Attr)
	return ch, 0
}

// newFile makes an empty regular file called name in d; the entry is
// charged.
func (d *memDir) newFile(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, *memFile) {
	child := &memFile{memNode: memNode{v: d.v, attr: newMemAttr(ctx, syscall.S_IFREG|mode&07777, d), nlink: 1}}
	ch := d.add(ctx, name, child, syscall.S_IFREG)
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, 0, 1)
	return ch, child
}

var _ = (gofs.NodeCreater)((*memDir)(nil))

func (d *memDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := d.newEntry(name); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, f := d.newFile(ctx, name, mode, out)
	f.mu.Lock()
	h := f.openLocked()
	f.mu.Unlock()
	return ch, h, fuse.FOPEN_DIRECT_IO, 0
}

var _ = (gofs.NodeSymlinker)((*memDir)(nil))

func (d *memDir) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := d.newEntry(name); errno != 0 {
		return nil, errno
	}
	if errno := d.v.charge(int64(len(target)), 0); errno != 0 {
		d.v.release(int64(len(name)), memEntrySpace)
		return nil, errno
	}
	child := &memLink{memNode: memNode{v: d.v, attr: newMemAttr(ctx, syscall.S_IFLNK|0o777, d), size: uint64(len(target)), nlink: 1}, target: []byte(target)}
	ch := d.add(ctx, name, child, syscall.S_IFLNK)
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, uint64(len(target)), 1)
	return ch, 0
}

var _ = (gofs.NodeMknoder)((*memDir)(nil))

// Mknod makes regular files, FIFOs, sockets and device nodes, as tmpfs
// does. The kernel has already refused device nodes to callers without
// CAP_MKNOD, and the mount is nodev, so a device node here is inert: the
// kernel refuses to open it (EACCES) without asking the daemon, and FIFOs
// and sockets are served by the kernel too.
func (d *memDir) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
	default:
		return nil, syscall.EINVAL
	}
	if errno := d.newEntry(name); errno != 0 {
		return nil, errno
	}
	if mode&syscall.S_IFMT == syscall.S_IFREG {
		ch, _ := d.newFile(ctx, name, mode, out)
		return ch, 0
	}
	child := &memNode{v: d.v, attr: newMemAttr(ctx, mode, d), nlink: 1}
	if mode&syscall.S_IFMT == syscall.S_IFCHR || mode&syscall.S_IFMT == syscall.S_IFBLK {
		child.rdev = rdev
	}
	ch := d.add(ctx, name, child, mode)
	child.attr.fill(&out.Attr, ch.StableAttr().Ino, 0, 1)
	out.Attr.Rdev = child.rdev
	return ch, 0
}

var _ = (gofs.NodeLinker)((*memDir)(nil))

// Link gives target another name in d. The new name takes an entry of
// the budget, as tmpfs's shmem_link reserves an inode for it; the kernel
// has already refused directories and links across mounts.
func (d *memDir) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	t, ok := target.(memNoder)
	if !ok || t.node().v != d.v {
		return nil, syscall.EXDEV
	}
	n := t.node()
	if n.EmbeddedInode().IsDir() {
		return nil, syscall.EPERM
	}
	if errno := d.newEntry(name); errno != 0 {
		return nil, errno
	}
	now := time.Now()
	n.mu.Lock()
	if n.nlink == 0 {
		// Unlinked while open: not linkable, as the kernel says of a
		// tmpfs file that is not O_TMPFILE.
		n.mu.Unlock()
		d.v.release(int64(len(name)), memEntrySpace)
		return nil, syscall.ENOENT
	}
	n.nlink++
	n.attr.ctime = now
	n.mu.Unlock()
	ch := n.EmbeddedInode()
	d.AddChild(name, ch, false)
	d.touchAt(now)
	var attr fuse.AttrOut
	t.(gofs.NodeGetattrer).Getattr(ctx, nil, &attr)
	out.Attr = attr.Attr
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
	d.v.dropName(name, ch)
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
	d.v.dropName(name, ch)
	d.touch()
	return 0
}

var _ = (gofs.NodeRenamer)((*memDir)(nil))

// Rename within one memory tree; the bridge moves the inode in the tree
// once this returns OK. A longer name is charged first; an entry the
// rename replaces loses that name. Times change as tmpfs's
// simple_rename_timestamp changes them: mtime and ctime of both
// directories, ctime of the moved node and of the one it replaces.
func (d *memDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	dst, ok := newParent.(*memDir)
	if !ok || dst.v != d.v {
		return syscall.EXDEV
	}
	if flags&^(renameExchange|renameNoReplace) != 0 {
		// RENAME_WHITEOUT would need go-fuse to put a new node where
		// the moved one was, after its own move of the tree.
		return syscall.EINVAL
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
		// The two names trade places: nothing to charge.
		renamed(d, dst, src, existing)
		return 0
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
	}
	switch grow := int64(len(newName) - len(name)); {
	case existing != nil:
		// The moved entry inherits the charge of the name it replaces;
		// its old name goes, with one link of the replaced node.
		d.v.dropName(name, existing)
	case grow > 0:
		if errno := d.v.charge(grow, 0); errno != 0 {
			return errno
		}
	default:
		d.v.release(-grow, 0)
	}
	renamed(d, dst, src, existing)
	return 0
}

// renamed sets the times a rename changes; existing may be nil.
func renamed(from, to *memDir, moved, existing *gofs.Inode) {
	now := time.Now()
	from.touchAt(now)
	to.touchAt(now)
	for _, ch := range []*gofs.Inode{moved, existing} {
		if ch == nil {
			continue
		}
		n := ch.Operations().(memNoder).node()
		n.mu.Lock()
		n.attr.ctime = now
		n.mu.Unlock()
	}
}
