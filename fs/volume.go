package fs

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// volNode is a file or directory inside a volume. It serves the volume's
// upper layer through go-fuse's loopback node, which already refuses
// renames and links between volumes (or views) with EXDEV, as between bind
// mounts, and adds NAME_MAX on every name-taking operation.
type volNode struct {
	*gofs.LoopbackNode
	m *Mount
	// slot is mixed into inode numbers; see identity.go.
	slot uint64
	// ro freezes the volume: every change fails with EROFS.
	ro bool
	// ovl is set for a volume with lower layers; layers then says where
	// the node is visible, the layer it is shown from first (0 is the
	// upper layer). Guarded by mu.
	ovl    *layer.Stack
	layers []int

	// nlink caches a merged directory's link count (mergedNlink).
	nlink *mergedCount
	// lowerFiles are the open handles on the node's lower file, which
	// follow it to its copy-up (lowerFile).
	lowerFiles map[*lowerFile]struct{}
	// openFiles are the open handles on the node's own file, which
	// answer for it once its last name is gone.
	openFiles map[*gofs.LoopbackFile]struct{}
	// heldFd is an O_PATH descriptor of a FIFO, socket or device whose
	// name was unlinked (holdSpecial); 0 for none.
	heldFd int
	// orphan is the unnamed upper copy of a lower file unlinked while
	// open (copyUpUnlinked).
	orphan *gofs.LoopbackFile

	// openDirs are this directory's open handles: after the directory
	// is renamed over or removed its path is gone, and fstat of an open
	// handle must still answer from the handle's fd.
	mu       sync.Mutex
	openDirs map[*volDir]struct{}
	// daemonServed counts the open handles of this file whose data the
	// daemon serves (no passthrough); see daemonFile. passthroughOpen
	// counts those the kernel serves: the kernel refuses a handle of one
	// kind while one of the other is open.
	daemonServed    int
	passthroughOpen int
	// task is set on the root of a task directory's volume, whose
	// layout children (local/, tmp/, secrets/, private/, alloc/) are
	// presented over the layer and cannot be replaced.
	task *taskNode
}

var _ = (gofs.NodeWrapChilder)((*volNode)(nil))

// WrapChild makes every node the loopback creates below a volume root a
// volNode.
func (n *volNode) WrapChild(ctx context.Context, ops gofs.InodeEmbedder) gofs.InodeEmbedder {
	if lb, ok := ops.(*gofs.LoopbackNode); ok {
		// Whatever the loopback creates is new, so in the upper layer.
		return &volNode{LoopbackNode: lb, m: n.m, slot: n.slot, ro: n.ro, ovl: n.ovl, layers: []int{0}}
	}
	// A task directory's layout children (volumes, memory trees, the
	// alloc/ view) are nodes of their own.
	return ops
}

// volumeInode returns the root node of the volume at key ("alloc/data",
// "<task>/local", ...) of an allocation, as seen in view. task is set for
// a task directory's own volume, whose layout children it presents.
func (m *Mount) volumeInode(ctx context.Context, parent *gofs.Inode, st *store.State, key string, view uint64, task *taskNode, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	v, ok := st.Volumes[key]
	if !ok {
		return nil, syscall.ENOENT
	}
	slot, errno := m.slots.slot(st.ID, view)
	if errno != 0 {
		m.logger.Error("too many allocation views live at once", "alloc_id", st.ID, "max", maxSlot)
		return nil, errno
	}
	dir := m.store.LayerPath(v.Upper)
	var rst syscall.Stat_t
	if err := syscall.Lstat(dir, &rst); err != nil {
		m.logger.Error("layer of volume is missing", "alloc_id", st.ID, "volume", key, "layer", v.Upper, "error", err)
		return nil, syscall.EIO
	}
	root := &gofs.LoopbackRoot{
		Path: dir,
		// Dev is mixed into every inode number the loopback derives:
		// choosing it this way yields backing inode ^ slot<<viewShift.
		Dev: rst.Dev ^ slot<<(viewShift-32),
	}
	node := &volNode{LoopbackNode: &gofs.LoopbackNode{RootData: root}, m: m, slot: slot, ro: v.ReadOnly, task: task, layers: []int{0}}
	if len(v.Lowers) > 0 {
		o := &layer.Stack{Roots: []string{dir}, Links: &m.links, Ctimes: &m.ctimes}
		for _, l := range v.Lowers {
			o.Roots = append(o.Roots, m.store.LayerPath(l))
		}
		node.ovl = o
		node.layers = o.All()
	}
	root.RootNode = node
	out.Attr.FromStat(&rst)
	node.mergedNlink("", node.layers, &out.Attr)
	ino := rst.Ino ^ slot<<viewShift
	out.Attr.Ino = ino
	m.stableTimeouts(out)
	return parent.NewInode(ctx, node, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
}

var _ = (gofs.NodeLookuper)((*volNode)(nil))

func (n *volNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if len(name) > maxNameLen {
		return nil, syscall.ENAMETOOLONG
	}
	if n.reserved(name) {
		return n.task.Lookup(ctx, n.EmbeddedInode(), name, out)
	}
	if n.ovl != nil {
		return n.ovlLookup(ctx, name, out)
	}
	return n.LoopbackNode.Lookup(ctx, name, out)
}

// reserved reports whether name is a layout child of a task directory.
func (n *volNode) reserved(name string) bool {
	if n.task == nil {
		return false
	}
	for _, c := range taskChildren {
		if c == name {
			return true
		}
	}
	return false
}

// refuse returns the errno for creating (EEXIST) or removing and
// renaming (EBUSY) a layout child: they are mount points, not files.
func (n *volNode) refuse(name string, creating bool) syscall.Errno {
	if len(name) > maxNameLen {
		return syscall.ENAMETOOLONG
	}
	if !n.reserved(name) {
		return 0
	}
	if creating {
		return syscall.EEXIST
	}
	return syscall.EBUSY
}

var _ = (gofs.NodeOpendirHandler)((*volNode)(nil))

// OpendirHandle lists a task directory as its layer's entries plus the
// layout children; any other directory is the loopback's own.
func (n *volNode) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.ovl != nil {
		return n.ovlOpendir()
	}
	if n.task == nil {
		return n.openDir()
	}
	ds, errno := n.LoopbackNode.Readdir(ctx)
	if errno != 0 {
		return nil, 0, errno
	}
	defer ds.Close()
	var entries []fuse.DirEntry
	for _, c := range taskChildren {
		entries = append(entries, fuse.DirEntry{Name: c, Mode: syscall.S_IFDIR})
	}
	for ds.HasNext() {
		e, errno := ds.Next()
		if errno != 0 {
			return nil, 0, errno
		}
		if !n.reserved(e.Name) {
			n.mapDirent(&e)
			entries = append(entries, e)
		}
	}
	return &listDir{entries: entries}, 0, 0
}

// listDir is a directory handle over a fixed list of entries.
type listDir struct {
	entries []fuse.DirEntry
	pos     int
}

var _ = (gofs.FileReaddirenter)((*listDir)(nil))

func (l *listDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if l.pos >= len(l.entries) {
		return nil, 0
	}
	e := l.entries[l.pos]
	l.pos++
	return &e, 0
}

var _ = (gofs.FileSeekdirer)((*listDir)(nil))

func (l *listDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off > uint64(len(l.entries)) {
		return syscall.EINVAL
	}
	l.pos = int(off)
	return 0
}

var _ = (gofs.NodeUnlinker)((*volNode)(nil))

func (n *volNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	n.holdSpecial(name)
	if n.ovl != nil {
		return n.removeEntry(name, false)
	}
	return n.LoopbackNode.Unlink(ctx, name)
}

var _ = (gofs.NodeRmdirer)((*volNode)(nil))

func (n *volNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	if n.ovl != nil {
		return n.removeEntry(name, true)
	}
	return n.LoopbackNode.Rmdir(ctx, name)
}

var _ = (gofs.NodeCreater)((*volNode)(nil))

func (n *volNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro {
		return nil, nil, 0, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, nil, 0, errno
	}
	if n.ovl != nil {
		if _, errno := n.prepareCreate(name); errno != 0 {
			return nil, nil, 0, errno
		}
	}
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	n.inheritGroup(name, &out.Attr)
	if errno := n.restoreMode(name, mode, &out.Attr); errno != 0 {
		releaseHandle(ctx, fh)
		return nil, nil, 0, errno
	}
	if child, ok := ch.Operations().(*volNode); ok {
		if kfh, ok := child.killprivHandle(fh); ok {
			return ch, kfh, fuseFlags, 0
		}
		return ch, child.passthroughFile(fh), fuseFlags, 0
	}
	return ch, n.m.wrapFile(fh), fuseFlags, 0
}

// restoreMode gives the new entry name the mode bits the caller asked for
// (see killpriv.go); a failure leaves an entry with fewer bits than asked,
// so it is reported.
func (n *volNode) restoreMode(name string, mode uint32, attr *fuse.Attr) syscall.Errno {
	if mode&modeSpecial == 0 {
		return 0
	}
	if err := restoreMode(filepath.Join(n.backingPath(), name), mode, attr); err != nil {
		return toErrno(n.m.logger, err)
	}
	return 0
}

var _ = (gofs.NodeMkdirer)((*volNode)(nil))

func (n *volNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro {
		return nil, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, errno
	}
	hid := false
	if n.ovl != nil {
		var errno syscall.Errno
		if hid, errno = n.prepareCreate(name); errno != 0 {
			return nil, errno
		}
	}
	ch, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if errno == 0 && hid {
		// The new directory replaces one a lower layer still holds:
		// opaque, it shows none of that directory's entries.
		if err := layer.MarkOpaque(n.ovl.Path(0, filepath.Join(n.rel(), name))); err != nil {
			n.m.logger.Error("could not make a new directory opaque", "name", name, "error", err)
			return nil, toErrno(n.m.logger, err)
		}
	}
	if errno == 0 {
		n.inheritGroup(name, &out.Attr)
		errno = n.restoreMode(name, mode, &out.Attr)
	}
	return ch, errno
}

var _ = (gofs.NodeMknoder)((*volNode)(nil))

func (n *volNode) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro {
		return nil, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, errno
	}
	if n.ovl != nil {
		if _, errno := n.prepareCreate(name); errno != 0 {
			return nil, errno
		}
	}
	ch, errno := n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
	if errno == 0 && mode&syscall.S_IFMT == syscall.S_IFCHR && rdev == 0 {
		errno = n.markRealDevice(name)
	}
	if errno == 0 {
		n.inheritGroup(name, &out.Attr)
		errno = n.restoreMode(name, mode, &out.Attr)
	}
	return ch, errno
}

var _ = (gofs.NodeSymlinker)((*volNode)(nil))

func (n *volNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro {
		return nil, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, errno
	}
	if n.ovl != nil {
		if _, errno := n.prepareCreate(name); errno != 0 {
			return nil, errno
		}
	}
	ch, errno := n.LoopbackNode.Symlink(ctx, target, name, out)
	if errno == 0 {
		n.inheritGroup(name, &out.Attr)
	}
	return ch, errno
}

var _ = (gofs.NodeLinker)((*volNode)(nil))

func (n *volNode) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ro {
		return nil, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, errno
	}
	if t, ok := target.(*volNode); ok && n.ovl != nil && t.ovl == n.ovl {
		return n.ovlLink(t, name, out)
	}
	return n.LoopbackNode.Link(ctx, target, name, out)
}

var _ = (gofs.NodeRenamer)((*volNode)(nil))

func (n *volNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	if dst, ok := newParent.(*volNode); ok {
		if errno := dst.refuse(newName, false); errno != 0 {
			return errno
		}
	} else if len(newName) > maxNameLen {
		return syscall.ENAMETOOLONG
	}
	if dst, ok := newParent.(*volNode); ok && flags&renameExchange == 0 {
		dst.holdSpecial(newName)
	}
	if dst, ok := newParent.(*volNode); ok && n.ovl != nil && dst.ovl == n.ovl {
		return n.ovlRename(ctx, name, dst, newName, flags)
	}
	if flags&renameWhiteout != 0 {
		if dst, ok := newParent.(*volNode); ok && nonEmptyDir(filepath.Join(dst.backingPath(), newName)) {
			// ext4 makes the whiteout before it finds the target not
			// empty, and stamps the source directory's times on the
			// way out: a failed rename must change nothing.
			return syscall.ENOTEMPTY
		}
	}
	errno := n.LoopbackNode.Rename(ctx, name, newParent, newName, flags)
	if errno == 0 && flags&renameWhiteout != 0 {
		return n.markRealDevice(name)
	}
	return errno
}

// nonEmptyDir reports whether p is a directory with entries. Anything
// else is never opened: opening a FIFO would wait for a writer.
func nonEmptyDir(p string) bool {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) > 0
}

// backingPath is the node's path on the backing store.
func (n *volNode) backingPath() string {
	return filepath.Join(n.RootData.Path, n.EmbeddedInode().Path(n.RootData.RootNode.EmbeddedInode()))
}

// inheritGroup gives a new entry the group of a setgid parent, as a local
// filesystem does. The loopback chowns every new entry to the caller's
// uid and primary gid, which is right only when the parent is not setgid.
// A failure here leaves the caller's group, which is what the caller
// would have had without setgid, so it is logged, not returned.
func (n *volNode) inheritGroup(name string, attr *fuse.Attr) {
	dir := n.backingPath()
	var st syscall.Stat_t
	if err := syscall.Lstat(dir, &st); err != nil || st.Mode&syscall.S_ISGID == 0 || attr.Gid == st.Gid {
		return
	}
	p := filepath.Join(dir, name)
	if err := syscall.Lchown(p, -1, int(st.Gid)); err != nil {
		n.m.logger.Warn("could not give a new entry its setgid parent's group", "path", p, "error", err)
		return
	}
	// chown may also have cleared set-id bits of a file: report what is
	// on disk now.
	var cst syscall.Stat_t
	if err := syscall.Lstat(p, &cst); err == nil {
		ino := attr.Ino
		attr.FromStat(&cst)
		attr.Ino = ino
	}
}

// dirStream is what go-fuse's loopback directory stream offers a handle.
type dirStream interface {
	gofs.FileReaddirenter
	gofs.FileSeekdirer
	gofs.FileReleasedirer
	gofs.FileFsyncdirer
}

// volDir is an open directory of a volume: go-fuse's loopback stream,
// plus the fd kept for attributes once the path no longer leads to it.
type volDir struct {
	dirStream
	fd   int
	node *volNode
}

var _ = (gofs.FileReaddirenter)((*volDir)(nil))

// Readdirent gives each entry the inode number stat gives it.
func (d *volDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	e, errno := d.dirStream.Readdirent(ctx)
	if e != nil {
		d.node.mapDirent(e)
	}
	return e, errno
}

// mapDirent gives a directory entry of the backing layer the inode number
// the mount shows for it: the backing one with the view's slot mixed in
// (identity.go), the node's own for "." and its parent's for "..", so
// that d_ino agrees with st_ino as on a local filesystem.
func (n *volNode) mapDirent(e *fuse.DirEntry) {
	switch e.Name {
	case ".":
		e.Ino = n.StableAttr().Ino
	case "..":
		e.Ino = n.StableAttr().Ino
		if _, p := n.Parent(); p != nil {
			e.Ino = p.StableAttr().Ino
		}
	default:
		if e.Ino != 0 {
			e.Ino ^= n.slot << viewShift
		}
	}
}

// openDir opens the node's directory for listing.
func (n *volNode) openDir() (gofs.FileHandle, uint32, syscall.Errno) {
	// Opened beneath the layer root, never through a symbolic link that
	// a task swapped in for one of the directories on the way.
	fd, err := layer.OpenBeneath(n.RootData.Path, n.rel(), syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, 0, toErrno(n.m.logger, err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		syscall.Close(fd)
		return nil, 0, errno
	}
	d := &volDir{dirStream: ds.(dirStream), fd: fd, node: n}
	n.mu.Lock()
	if n.openDirs == nil {
		n.openDirs = make(map[*volDir]struct{})
	}
	n.openDirs[d] = struct{}{}
	n.mu.Unlock()
	// The kernel may keep the listing: every change to a volume's
	// directories passes through it (which drops the cached listing),
	// and allocfs's own changes replace whole volumes.
	return d, fuse.FOPEN_CACHE_DIR, 0
}

var _ = (gofs.FileReleasedirer)((*volDir)(nil))

// Releasedir forgets the handle, then closes the stream (and its fd).
func (d *volDir) Releasedir(ctx context.Context, flags uint32) {
	d.node.mu.Lock()
	delete(d.node.openDirs, d)
	d.node.mu.Unlock()
	d.dirStream.Releasedir(ctx, flags)
}

func (*lowerFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return 0, syscall.EBADF
}

// Getattr and Setattr are never called (see attrHandle); they exist to
// complete daemonHandle.
func (*lowerFile) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return syscall.ENOSYS
}

func (*lowerFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.ENOSYS
}

func (*lowerFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return syscall.EBADF
}
