package fs

import (
	"context"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// volNode is a file or directory inside a volume, served from the
// volume's layers fd-relative (backing.go). Renames and links between
// volumes (or views) fail with EXDEV, as between bind mounts, and every
// name-taking operation checks NAME_MAX.
type volNode struct {
	gofs.Inode
	m *Mount
	// st is the volume's stack of layers (only the upper one for a
	// volume without lowers); vroot is the volume's root node, which
	// paths inside the volume start from.
	st    *layer.Stack
	vroot *gofs.Inode
	// slot is mixed into inode numbers; see identity.go.
	slot uint64
	// alloc is the allocation whose volume this is, whose disk limit df
	// shows.
	alloc string
	// ro freezes the volume: every change fails with EROFS. One flag is
	// shared by the root and every node below it, so that a seal freezes
	// the nodes the kernel still holds, or looks up again before it
	// forgets them, at once (Mount.followRecord). nil for a memory
	// volume, which is never frozen.
	ro *atomic.Bool
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
	// openLists are the open handles of an overlay directory that hold
	// a descriptor of it (listDir.fd), for the same purpose.
	openLists map[*listDir]struct{}
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
	// key and view are set on a volume's root: the volume it is
	// (store.State.Volumes) and the view it shows it in, which a change
	// of the record compares it with (Mount.invalidateVolumes).
	key  string
	view uint64
	// mem is set on a memory volume's root (memvol.go).
	mem *memVolume
	// recorded is set when the node's file, unlinked while open, has a
	// record for a daemon taking over (unlinkedrec.go). Guarded by mu.
	recorded bool
}

// readOnly reports whether the node's volume is frozen.
func (n *volNode) readOnly() bool { return n.ro != nil && n.ro.Load() }

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
	stack := m.volumeStack(st, key)
	var rst syscall.Stat_t
	if err := stack.Lstat(0, "", &rst); err != nil {
		m.logger.Error("layer of volume is missing", "alloc_id", st.ID, "volume", key, "layer", v.Upper, "error", err)
		return nil, syscall.EIO
	}
	ro := new(atomic.Bool)
	ro.Store(v.ReadOnly)
	node := &volNode{m: m, st: stack, slot: slot, alloc: st.ID, ro: ro, task: task, layers: []int{0}, key: key, view: view}
	node.vroot = node.EmbeddedInode()
	if len(stack.Roots) > 1 {
		node.ovl = stack
		node.layers = stack.All()
	}
	out.Attr.FromStat(&rst)
	node.mergedNlink("", node.layers, &out.Attr)
	salted, _ := stack.Salted(0, rst.Ino)
	ino := salted ^ slot<<viewShift
	out.Attr.Ino = ino
	m.stableTimeouts(out)
	return parent.NewInode(ctx, node, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
}

var _ = (gofs.NodeLookuper)((*volNode)(nil))

func (n *volNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if strings.HasPrefix(name, unlinkedPrefix) {
		return n.lookupUnlinked(ctx, name, out)
	}
	if len(name) > maxNameLen {
		return nil, syscall.ENAMETOOLONG
	}
	if n.reserved(name) {
		return n.task.Lookup(ctx, n.EmbeddedInode(), name, out)
	}
	if n.ovl != nil {
		return n.ovlLookup(ctx, name, out)
	}
	return n.lookupUpper(ctx, name, out)
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
	switch {
	case n.task != nil:
		return n.taskOpendir()
	case n.ovl != nil:
		return n.ovlOpendir()
	}
	return n.openDir()
}

// taskOpendir lists a task directory: the layout children it has, and
// the entries of its volume (merged with the host layer of a chroot).
func (n *volNode) taskOpendir() (gofs.FileHandle, uint32, syscall.Errno) {
	st, err := n.m.store.View(n.task.id)
	if err != nil {
		return nil, 0, toErrno(n.m.logger, err)
	}
	i := st.TaskIndex(n.task.task)
	if i < 0 {
		return nil, 0, syscall.ENOENT
	}
	var entries []fuse.DirEntry
	for _, c := range layoutNames(st, place{kind: placeTask, key: n.task.task, task: i}) {
		entries = append(entries, fuse.DirEntry{Name: c, Mode: syscall.S_IFDIR})
	}
	if n.ovl != nil {
		merged, err := n.ovl.List(n.rel(), n.nodeLayers())
		if err != nil {
			return nil, 0, toErrno(n.m.logger, err)
		}
		for _, e := range merged {
			if !n.reserved(e.Name) {
				entries = append(entries, fuse.DirEntry{Name: e.Name, Mode: e.Mode})
			}
		}
		return &listDir{plusBatch: plusBatch{node: n}, entries: withDots(n.EmbeddedInode(), entries)}, 0, 0
	}
	fd, err := n.st.Open(0, n.rel(), syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, 0, toErrno(n.m.logger, err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		syscall.Close(fd)
		return nil, 0, errno
	}
	defer ds.Close()
	for ds.HasNext() {
		e, errno := ds.Next()
		if errno != 0 {
			return nil, 0, errno
		}
		if !n.reserved(e.Name) {
			n.mapDirent(&e)
			// The offset of an entry of this list is its position
			// (listDir.Seekdir), not the backing directory's cookie.
			e.Off = 0
			entries = append(entries, e)
		}
	}
	return &listDir{plusBatch: plusBatch{node: n}, entries: entries}, 0, 0
}

// listDir is a directory handle over a fixed list of entries.
type listDir struct {
	plusBatch
	entries []fuse.DirEntry
	pos     int
	// fd is an O_PATH descriptor of an overlay directory in its topmost
	// layer (0 for none), registered in the node's openLists: once the
	// directory is removed or renamed over, fstat of this handle
	// answers from it, as an open directory of a local filesystem does.
	fd int
}

var _ = (gofs.FileReleasedirer)((*listDir)(nil))

// Releasedir forgets the handle's descriptor, if it has one.
func (l *listDir) Releasedir(ctx context.Context, flags uint32) {
	if l.fd <= 0 {
		return
	}
	l.node.mu.Lock()
	delete(l.node.openLists, l)
	l.node.mu.Unlock()
	syscall.Close(l.fd)
}

var _ = (gofs.FileReaddirenter)((*listDir)(nil))

func (l *listDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if l.first == nil {
		names := 0
		for _, e := range l.entries {
			if !isDots(e.Name) {
				names++
			}
		}
		l.started(ctx, names > plusAttrsMax)
	}
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
	if off == 0 {
		l.restart()
	}
	return 0
}

var _ = (gofs.NodeUnlinker)((*volNode)(nil))

func (n *volNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.readOnly() {
		return syscall.EROFS
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	n.holdSpecial(name)
	n.recordUnlinked(name)
	if n.ovl != nil {
		return n.removeEntry(name, false)
	}
	return n.backingUnlink(name, false)
}

var _ = (gofs.NodeRmdirer)((*volNode)(nil))

func (n *volNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.readOnly() {
		return syscall.EROFS
	}
	// Once the directory is gone (or not), whatever was opened by its
	// path is forgotten.
	defer n.m.dirs.Forget()
	if n.reserved(name) {
		return n.task.rmdir(name)
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	if n.ovl != nil {
		return n.removeEntry(name, true)
	}
	return n.backingUnlink(name, true)
}

// movesDir reports whether renaming name to newName in newParent may move
// or replace a directory: either entry is one, or the kernel has no node
// for the name to tell.
func (n *volNode) movesDir(name string, newParent gofs.InodeEmbedder, newName string) bool {
	ch := n.GetChild(name)
	if ch == nil || ch.IsDir() {
		return true
	}
	dst := newParent.EmbeddedInode().GetChild(newName)
	return dst != nil && dst.IsDir()
}

var _ = (gofs.NodeCreater)((*volNode)(nil))

func (n *volNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.readOnly() {
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
	ch, fh, errno := n.backingCreate(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if child, ok := ch.Operations().(*volNode); ok {
		fh, openFlags := child.serveOpenMode(fh, hasSetid(out.Attr.Mode))
		return ch, fh, openFlags, 0
	}
	return ch, n.m.wrapFile(fh), 0, 0
}

var _ = (gofs.NodeMkdirer)((*volNode)(nil))

func (n *volNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.readOnly() {
		return nil, syscall.EROFS
	}
	if n.reserved(name) {
		return n.task.mkdir(ctx, n.EmbeddedInode(), name, out)
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
	ch, errno := n.backingMkdir(ctx, name, mode, out)
	if errno == 0 && hid {
		// The new directory replaces one a lower layer still holds:
		// opaque, it shows none of that directory's entries.
		if err := n.ovl.MarkOpaque(path.Join(n.rel(), name)); err != nil {
			n.m.logger.Error("could not make a new directory opaque", "name", name, "error", err)
			return nil, toErrno(n.m.logger, err)
		}
	}
	return ch, errno
}

var _ = (gofs.NodeMknoder)((*volNode)(nil))

func (n *volNode) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.readOnly() {
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
	return n.backingMknod(ctx, name, mode, rdev, out)
}

var _ = (gofs.NodeSymlinker)((*volNode)(nil))

func (n *volNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.readOnly() {
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
	return n.backingSymlink(ctx, target, name, out)
}

var _ = (gofs.NodeLinker)((*volNode)(nil))

func (n *volNode) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.readOnly() {
		return nil, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, errno
	}
	t, ok := target.(*volNode)
	if !ok || t.vroot != n.vroot {
		return nil, syscall.EXDEV
	}
	if n.ovl != nil {
		return n.ovlLink(t, name, out)
	}
	to, errno := n.backingLink(t, name)
	if errno != 0 {
		return nil, errno
	}
	defer to.Close()
	return n.upperChildAt(ctx, to, out)
}

var _ = (gofs.NodeRenamer)((*volNode)(nil))

func (n *volNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.readOnly() {
		return syscall.EROFS
	}
	if n.movesDir(name, newParent, newName) {
		// Once the directory has moved (or not), whatever was opened
		// by its old path is forgotten.
		defer n.m.dirs.Forget()
	}
	dst, ok := newParent.(*volNode)
	if n.reserved(name) {
		if !ok {
			return syscall.EXDEV
		}
		return n.task.rename(name, dst, newName, flags)
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	if !ok {
		if len(newName) > maxNameLen {
			return syscall.ENAMETOOLONG
		}
		return syscall.EXDEV
	}
	if errno := dst.refuse(newName, false); errno != 0 {
		return errno
	}
	if dst.vroot != n.vroot {
		return syscall.EXDEV
	}
	if flags&renameExchange == 0 {
		dst.holdSpecial(newName)
		dst.recordUnlinked(newName)
	}
	if n.ovl != nil {
		return n.ovlRename(ctx, name, dst, newName, flags)
	}
	if flags&renameWhiteout != 0 && dst.nonEmptyDir(newName) {
		// ext4 makes the whiteout before it finds the target not
		// empty, and stamps the source directory's times on the way
		// out: a failed rename must change nothing.
		return syscall.ENOTEMPTY
	}
	errno := n.backingRename(name, dst, newName, flags)
	if errno == 0 && flags&renameWhiteout != 0 {
		return n.markRealDevice(name)
	}
	return errno
}

// nonEmptyDir reports whether name in this directory is a directory with
// entries. Anything else is never opened: opening a FIFO would wait for
// a writer.
func (n *volNode) nonEmptyDir(name string) bool {
	l, errno := n.at(0, name)
	if errno != 0 {
		return false
	}
	defer l.Close()
	fd, err := l.Open(unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), l.String())
	defer f.Close()
	names, _ := f.Readdirnames(1)
	return len(names) > 0
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
	plusBatch // and its node, the directory's
	fd        int
	// ahead holds the entries read from the stream before the kernel
	// asked for them, to learn whether the listing is large (plusBatch);
	// aheadErr is the error that ended that read, returned after them.
	ahead    []fuse.DirEntry
	aheadErr syscall.Errno
	// sought is set once the stream was rewound after the open, or
	// moved by the kernel: a btrfs directory descriptor lists only the
	// entries it had when it was opened, until it is rewound, and a
	// listing the kernel keeps (FOPEN_CACHE_DIR) must not miss a name
	// made between the OPENDIR and the first READDIR.
	sought bool
}

var _ = (gofs.FileReaddirenter)((*volDir)(nil))

// Readdirent gives each entry the inode number stat gives it.
func (d *volDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if !d.sought {
		d.sought = true
		if errno := d.dirStream.Seekdir(ctx, 0); errno != 0 {
			return nil, errno
		}
	}
	if d.first == nil {
		d.started(ctx, d.readAhead(ctx))
	}
	if len(d.ahead) > 0 {
		e := d.ahead[0]
		d.ahead = d.ahead[1:]
		return &e, 0
	}
	if errno := d.aheadErr; errno != 0 {
		d.aheadErr = 0
		return nil, errno
	}
	return d.next(ctx)
}

// readAhead reads entries into ahead until it has seen plusAttrsMax+1
// names besides "." and "..", and reports whether there were that many.
func (d *volDir) readAhead(ctx context.Context) bool {
	for names := 0; names <= plusAttrsMax; {
		e, errno := d.next(ctx)
		if errno != 0 {
			d.aheadErr = errno
			return false
		}
		if e == nil {
			return false
		}
		d.ahead = append(d.ahead, *e)
		if !isDots(e.Name) {
			names++
		}
	}
	return true
}

// next is the stream's next entry, with its inode number mapped.
func (d *volDir) next(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	e, errno := d.dirStream.Readdirent(ctx)
	if e != nil {
		d.node.mapDirent(e)
	}
	return e, errno
}

var _ = (gofs.FileSeekdirer)((*volDir)(nil))

// Seekdir drops what was read ahead: the stream moves to off.
func (d *volDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.ahead, d.aheadErr, d.sought = nil, 0, true
	if off == 0 {
		d.restart()
	}
	return d.dirStream.Seekdir(ctx, off)
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
			e.Ino, _ = n.st.Salted(0, e.Ino)
			e.Ino ^= n.slot << viewShift
		}
	}
}

// openDir opens the node's directory for listing.
func (n *volNode) openDir() (gofs.FileHandle, uint32, syscall.Errno) {
	// Opened beneath the layer root, never through a symbolic link that
	// a task swapped in for one of the directories on the way.
	fd, err := n.st.Open(0, n.rel(), syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, 0, toErrno(n.m.logger, err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		syscall.Close(fd)
		return nil, 0, errno
	}
	d := &volDir{dirStream: ds.(dirStream), plusBatch: plusBatch{node: n}, fd: fd}
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
