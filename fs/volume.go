package fs

import (
	"context"
	"fmt"
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

// holdSpecial keeps, before name in the directory n is unlinked or
// replaced, an O_PATH descriptor of its backing entry when it is a FIFO,
// socket or device the kernel holds a node for: a process may have it
// open, and the kernel serves that open itself without telling the
// daemon, so only this descriptor can answer fstat once the name is gone
// (with no links, as a local filesystem shows). It is closed when the
// kernel forgets the node.
func (n *volNode) holdSpecial(name string) {
	ch := n.GetChild(name)
	if ch == nil {
		return
	}
	c, ok := ch.Operations().(*volNode)
	if !ok {
		return
	}
	switch c.StableAttr().Mode & syscall.S_IFMT {
	case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
	default:
		return
	}
	p := filepath.Join(n.backingPath(), name)
	if c.lowerOnly() {
		p = c.shownPath()
	}
	fd, err := unix.Open(p, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	c.mu.Lock()
	old := c.heldFd
	c.heldFd = fd
	c.mu.Unlock()
	if old > 0 {
		unix.Close(old)
	}
}

// setattrHeld changes the unlinked special file held by fd (an O_PATH
// descriptor, reached through /proc/self/fd, which follows it) as SETATTR
// asks, and answers its attributes.
func (n *volNode) setattrHeld(fd int, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	p := fmt.Sprintf("/proc/self/fd/%d", fd)
	var err error
	if mode, ok := in.GetMode(); ok {
		err = syscall.Chmod(p, mode&07777)
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if err == nil && (uok || gok || in.Valid&setattrChanges == 0) {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		err = syscall.Chown(p, u, g)
	}
	if err == nil && in.Valid&(fuse.FATTR_ATIME|fuse.FATTR_MTIME|fuse.FATTR_ATIME_NOW|fuse.FATTR_MTIME_NOW) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if a, ok := in.GetATime(); ok {
			ts[0] = unix.NsecToTimespec(a.UnixNano())
		}
		if in.Valid&fuse.FATTR_ATIME_NOW != 0 {
			ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		if m, ok := in.GetMTime(); ok {
			ts[1] = unix.NsecToTimespec(m.UnixNano())
		}
		if in.Valid&fuse.FATTR_MTIME_NOW != 0 {
			ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
		}
		err = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0)
	}
	if err != nil {
		return toErrno(n.m.logger, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return toErrno(n.m.logger, err)
	}
	out.FromStat(&st)
	out.Ino = n.StableAttr().Ino
	return 0
}

// copyUpUnlinked copies a lower file whose last name is gone, while a
// task has it open, into an unnamed upper file (layer.Stack.CopyAnonymous)
// that its open handles read from then on, and returns a handle on the
// copy for a change through them; nil when the node has no open lower
// handle.
func (n *volNode) copyUpUnlinked() gofs.FileHandle {
	if n.ovl == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	src := -1
	for f := range n.lowerFiles {
		if pf, ok := f.lowerHandle.(gofs.FilePassthroughFder); ok {
			if fd, ok := pf.PassthroughFd(); ok {
				src = fd
				break
			}
		}
	}
	if src < 0 {
		return nil
	}
	tfd, err := n.ovl.CopyAnonymous(src)
	if err != nil {
		n.m.logger.Error("could not copy up an open lower file whose name is gone", "error", err)
		return nil
	}
	for f := range n.lowerFiles {
		if f.upper < 0 {
			if fd, err := unix.Dup(tfd); err == nil {
				f.upper = fd
			}
		}
	}
	lf := gofs.NewLoopbackFile(tfd).(*gofs.LoopbackFile)
	if n.openFiles == nil {
		n.openFiles = make(map[*gofs.LoopbackFile]struct{})
	}
	n.openFiles[lf] = struct{}{}
	n.orphan = lf
	return lf
}

var _ = (gofs.NodeOnForgetter)((*volNode)(nil))

// OnForget closes what holdSpecial and copyUpUnlinked kept.
func (n *volNode) OnForget() {
	n.mu.Lock()
	fd := n.heldFd
	n.heldFd = 0
	orphan := n.orphan
	n.orphan = nil
	if orphan != nil {
		delete(n.openFiles, orphan)
	}
	n.mu.Unlock()
	if fd > 0 {
		unix.Close(fd)
	}
	if orphan != nil {
		orphan.Release(context.Background())
	}
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

var _ = (gofs.NodeOpener)((*volNode)(nil))

func (n *volNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro && flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	if n.lowerOnly() {
		if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) == 0 {
			// Reading a lower file needs no copy: open it where it is.
			fd, err := n.openShown(int(flags &^ (syscall.O_APPEND | syscall.O_CREAT)))
			if err != nil {
				return nil, 0, toErrno(n.m.logger, err)
			}
			lf := gofs.NewLoopbackFile(fd)
			if n.ro {
				// Nothing in a frozen volume is ever copied up.
				return n.passthroughFile(lf), 0, 0
			}
			// No passthrough: the kernel keeps one backing file per
			// inode while any handle is open, and a writer opening the
			// file after its copy-up would be given this lower file to
			// write into.
			return n.daemonFile(n.newLowerFile(lf.(lowerHandle))), fuse.FOPEN_KEEP_CACHE, 0
		}
		if errno := n.copyUp(); errno != 0 {
			return nil, 0, errno
		}
	}
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	if flags&syscall.O_TRUNC != 0 {
		// The open truncated the file: an unprivileged caller's
		// truncate clears set-id bits as a write does.
		if lf, ok := fh.(*gofs.LoopbackFile); ok {
			fd, _ := lf.PassthroughFd()
			if errno := killPrivFd(ctx, n.m.logger, fd); errno != 0 {
				releaseHandle(ctx, fh)
				return nil, 0, errno
			}
		}
	}
	if kfh, ok := n.killprivHandle(fh); ok {
		return kfh, fuseFlags, 0
	}
	n.mu.Lock()
	served := n.daemonServed
	n.mu.Unlock()
	if served > 0 {
		// The kernel refuses passthrough on an inode that has handles
		// served by the daemon open (EIO): stay with the daemon until
		// they are closed.
		return n.daemonFile(fh), fuseFlags, 0
	}
	return n.passthroughFile(fh), fuseFlags, 0
}

// volFile is an open regular file of a volume. Its fd is offered to the
// kernel for passthrough, so with passthrough on, no read or write ever
// reaches it: one that does means go-fuse has turned passthrough off for
// the whole mount (it does so silently, the first time registering a
// backing fd fails), and the mount reports it.
type volFile struct {
	*gofs.LoopbackFile
	m *Mount
	// node counts the handle in its passthroughOpen while it is open,
	// and in its openFiles when tracked is set.
	node    *volNode
	tracked *gofs.LoopbackFile
}

// passthroughFile is m.wrapFile for a handle of n's file, counted in
// n.passthroughOpen until it is released.
func (n *volNode) passthroughFile(fh gofs.FileHandle) gofs.FileHandle {
	wrapped := n.m.wrapFile(fh)
	if vf, ok := wrapped.(*volFile); ok {
		n.mu.Lock()
		n.passthroughOpen++
		n.mu.Unlock()
		vf.node = n
	}
	if lf, ok := fh.(*gofs.LoopbackFile); ok {
		n.trackFile(lf)
		if vf, ok := wrapped.(*volFile); ok {
			vf.tracked = lf
		} else {
			return &trackedFile{LoopbackFile: lf, node: n}
		}
	}
	return wrapped
}

// trackFile counts lf in the node's openFiles until it is released.
func (n *volNode) trackFile(lf *gofs.LoopbackFile) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.openFiles == nil {
		n.openFiles = make(map[*gofs.LoopbackFile]struct{})
	}
	n.openFiles[lf] = struct{}{}
}

func (n *volNode) untrackFile(lf *gofs.LoopbackFile) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.openFiles, lf)
}

// openFile returns one of the node's open handles on its own file, or
// nil.
func (n *volNode) openFile() gofs.FileHandle {
	n.mu.Lock()
	defer n.mu.Unlock()
	for lf := range n.openFiles {
		return lf
	}
	return nil
}

// pathLeads reports whether the node's path still names an entry, in
// the layer the node is shown from.
func (n *volNode) pathLeads() bool {
	p := n.backingPath()
	if n.lowerOnly() {
		p = n.shownPath()
	}
	var st syscall.Stat_t
	return syscall.Lstat(p, &st) == nil
}

// trackedFile is a loopback handle served without passthrough wrapping
// (passthrough off), counted in its node's openFiles while open.
type trackedFile struct {
	*gofs.LoopbackFile
	node *volNode
}

var _ = (gofs.FileReleaser)((*trackedFile)(nil))

func (f *trackedFile) Release(ctx context.Context) syscall.Errno {
	f.node.untrackFile(f.LoopbackFile)
	return f.LoopbackFile.Release(ctx)
}

var _ = (gofs.FileReleaser)((*volFile)(nil))

func (f *volFile) Release(ctx context.Context) syscall.Errno {
	if f.node != nil {
		f.node.mu.Lock()
		f.node.passthroughOpen--
		f.node.mu.Unlock()
		if f.tracked != nil {
			f.node.untrackFile(f.tracked)
		}
	}
	return f.LoopbackFile.Release(ctx)
}

func (m *Mount) wrapFile(fh gofs.FileHandle) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok || !m.passthrough.Load() {
		return fh
	}
	return &volFile{LoopbackFile: lf, m: m}
}

var _ = (gofs.FileReader)((*volFile)(nil))

func (f *volFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.m.dataThroughDaemon("read")
	return f.LoopbackFile.Read(ctx, dest, off)
}

var _ = (gofs.FileWriter)((*volFile)(nil))

func (f *volFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.m.dataThroughDaemon("write")
	return f.LoopbackFile.Write(ctx, data, off)
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
	if dst, ok := newParent.(*volNode); ok && n.ovl != nil && dst.ovl == n.ovl {
		return n.ovlRename(ctx, name, dst, newName, flags)
	}
	if dst, ok := newParent.(*volNode); ok && flags&renameExchange == 0 {
		dst.holdSpecial(newName)
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

var _ = (gofs.NodeGetattrer)((*volNode)(nil))

// Getattr stats the node's path; a directory whose path is gone (renamed
// over, removed) while it is open answers from an open handle, as an
// unlinked but open directory does on a local filesystem.
func (n *volNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.lowerOnly() {
		var st syscall.Stat_t
		if err := syscall.Lstat(n.shownPath(), &st); err != nil {
			// Unlinked while open: the handle still has the file,
			// which a local filesystem shows with no links.
			fd, ok := lowerFd(f)
			if !ok {
				n.mu.Lock()
				fd, ok = n.heldFd, n.heldFd > 0
				n.mu.Unlock()
			}
			if !ok || syscall.Fstat(fd, &st) != nil {
				return toErrno(n.m.logger, err)
			}
			st.Nlink = 0
		}
		out.FromStat(&st)
		out.Ino = n.StableAttr().Ino
		n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
		return 0
	}
	errno := n.LoopbackNode.Getattr(ctx, attrHandle(f), out)
	if errno == 0 {
		n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
		n.shownCtime(&out.Attr)
	}
	if errno != syscall.ENOENT {
		return errno
	}
	n.mu.Lock()
	held := n.heldFd
	n.mu.Unlock()
	if held > 0 {
		var st syscall.Stat_t
		if syscall.Fstat(held, &st) == nil {
			out.FromStat(&st)
			out.Ino = n.StableAttr().Ino
			return 0
		}
	}
	if h := n.openFile(); h != nil {
		// Unlinked while open.
		if errno := h.(gofs.FileGetattrer).Getattr(ctx, out); errno == 0 {
			n.shownCtime(&out.Attr)
			out.Ino = n.StableAttr().Ino
			return 0
		}
	}
	if fd, ok := lowerFd(f); ok {
		// Copied up, then unlinked while open.
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			out.FromStat(&st)
			n.shownCtime(&out.Attr)
			out.Ino = n.StableAttr().Ino
			return 0
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for d := range n.openDirs {
		var st syscall.Stat_t
		if err := syscall.Fstat(d.fd, &st); err != nil {
			continue
		}
		out.FromStat(&st)
		n.shownCtime(&out.Attr)
		out.Ino = n.StableAttr().Ino
		return 0
	}
	return errno
}

var _ = (gofs.NodeSetattrer)((*volNode)(nil))

// setattrChanges are the SETATTR fields that change something besides the
// change time.
const setattrChanges = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_SIZE |
	fuse.FATTR_ATIME | fuse.FATTR_MTIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW

// Setattr copies a lower entry up first: metadata changes are writes.
func (n *volNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	leads := n.pathLeads()
	if leads {
		if errno := n.copyUp(); errno != 0 {
			return errno
		}
	}
	h := attrHandle(f)
	if h == nil && !leads {
		// fchmod, fchown and futimens come without a handle: a file
		// unlinked while open is changed through one of its handles,
		// a FIFO, socket or device through what holdSpecial kept.
		if h = n.openFile(); h == nil {
			n.mu.Lock()
			held := n.heldFd
			n.mu.Unlock()
			if held > 0 {
				return n.setattrHeld(held, in, out)
			}
			h = n.copyUpUnlinked()
		}
	}
	if in.Valid&setattrChanges == 0 {
		// Nothing but the change time: chown(f, -1, -1), say. A local
		// filesystem still stamps ctime (and clears set-id bits, which
		// the kernel sends as a mode change when there are any); a
		// chown that changes nothing does the same to the backing file.
		err := unix.Lchown(n.backingPath(), -1, -1)
		if fd, ok := handleFd(h); ok && h != nil {
			err = unix.Fchown(fd, -1, -1)
		}
		if err != nil {
			return toErrno(n.m.logger, err)
		}
	}
	if errno := n.LoopbackNode.Setattr(ctx, h, in, out); errno != 0 {
		return errno
	}
	killed, errno := n.killprivSetattr(ctx, h, in)
	if errno != 0 {
		return errno
	}
	if killed {
		// The mode lost its set-id bits since out was filled.
		return n.Getattr(ctx, attrHandle(f), out)
	}
	n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
	n.shownCtime(&out.Attr)
	return 0
}

var _ = (gofs.NodeReadlinker)((*volNode)(nil))

func (n *volNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if n.lowerOnly() {
		target, err := os.Readlink(n.shownPath())
		if err != nil {
			return nil, toErrno(n.m.logger, err)
		}
		return []byte(target), 0
	}
	return n.LoopbackNode.Readlink(ctx)
}

var _ = (gofs.NodeGetxattrer)((*volNode)(nil))

func (n *volNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	p := n.backingPath()
	if n.lowerOnly() {
		p = n.shownPath()
	}
	sz, err := unix.Lgetxattr(p, layer.StoredXattr(attr), dest)
	return uint32(sz), toErrno(n.m.logger, err)
}

var _ = (gofs.NodeSetxattrer)((*volNode)(nil))

func (n *volNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Setxattr(ctx, layer.StoredXattr(attr), data, flags)
}

var _ = (gofs.NodeRemovexattrer)((*volNode)(nil))

func (n *volNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Removexattr(ctx, layer.StoredXattr(attr))
}

var _ = (gofs.NodeListxattrer)((*volNode)(nil))

// Listxattr lists what the task set, never the layer format's own marks
// (see xattr.go).
func (n *volNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p := n.backingPath()
	if n.lowerOnly() {
		p = n.shownPath()
	}
	sz, err := layer.ListShownXattrs(p, dest)
	if err != nil {
		return 0, toErrno(n.m.logger, err)
	}
	return sz, 0
}

var _ = (gofs.NodeStatxer)((*volNode)(nil))

func (n *volNode) Statx(ctx context.Context, f gofs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if n.lowerOnly() {
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, n.shownPath(), int(flags)|unix.AT_SYMLINK_NOFOLLOW, int(mask), &st); err != nil {
			return toErrno(n.m.logger, err)
		}
		out.FromStatx(&st)
		return 0
	}
	if h, ok := attrHandle(f).(gofs.FileStatxer); ok {
		errno := h.Statx(ctx, flags, mask, out)
		if errno == 0 {
			n.shownStatxCtime(out)
		}
		return errno
	}
	// By path: the node is the entry itself, so a final symbolic link
	// (swapped in by a task, say) is never followed.
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, n.backingPath(), int(flags)|unix.AT_SYMLINK_NOFOLLOW, int(mask), &st); err != nil {
		return toErrno(n.m.logger, err)
	}
	out.FromStatx(&st)
	n.shownStatxCtime(out)
	return 0
}

var _ = (gofs.NodeTmpfiler)((*volNode)(nil))

// Tmpfile needs the directory in the upper layer, like any creation.
func (n *volNode) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ro {
		return nil, nil, 0, syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, fh, fuseFlags, errno := n.LoopbackNode.Tmpfile(ctx, flags, mode, out)
	if errno == 0 {
		if child, ok := ch.Operations().(*volNode); ok {
			return ch, child.passthroughFile(fh), fuseFlags, 0
		}
	}
	return ch, n.m.wrapFile(fh), fuseFlags, errno
}

// daemonHandle is what a file handle served by the daemon offers: the
// loopback file's operations, without its passthrough fd.
type daemonHandle interface {
	gofs.FileReader
	gofs.FileWriter
	gofs.FileReleaser
	gofs.FileFlusher
	gofs.FileFsyncer
	gofs.FileGetattrer
	gofs.FileSetattrer
	gofs.FileLseeker
	gofs.FileAllocater
}

// lowerHandle is what a handle on a lower file offers: reading. go-fuse
// answers GETATTR and SETATTR through any open handle of a node, and this
// one would show, or change, the lower file after a copy-up: it has
// neither, so they go by path to the copied-up file.
type lowerHandle interface {
	gofs.FileReader
	gofs.FileReleaser
	gofs.FileFlusher
	gofs.FileFsyncer
	gofs.FileLseeker
}

// lowerFile is a loopback file on a lower layer, reduced to lowerHandle.
// Once its node is copied up it reads the upper copy instead (upper): an
// fd opened before a copy-up reads what one opened after it reads, as on
// a local filesystem, where there is only one file.
type lowerFile struct {
	lowerHandle
	node *volNode
	// upper is the copied-up file, opened by repoint; -1 before. Guarded
	// by node.mu.
	upper int
}

// newLowerFile wraps fh, open on n's lower file, and counts it in
// n.lowerFiles until it is released.
func (n *volNode) newLowerFile(fh lowerHandle) *lowerFile {
	f := &lowerFile{lowerHandle: fh, node: n, upper: -1}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lowerFiles == nil {
		n.lowerFiles = make(map[*lowerFile]struct{})
	}
	n.lowerFiles[f] = struct{}{}
	return f
}

// repointLocked opens the upper copy for every open lower handle of the
// node, just copied up. n.mu is held. A handle whose copy cannot be
// opened reads on from the lower file, which holds the same bytes until
// a write changes the copy; the failure is logged.
func (n *volNode) repointLocked() {
	if len(n.lowerFiles) == 0 {
		return
	}
	rel := n.rel()
	for f := range n.lowerFiles {
		if f.upper >= 0 {
			continue
		}
		fd, err := layer.OpenBeneath(n.ovl.Roots[0], rel, syscall.O_RDONLY)
		if err != nil {
			n.m.logger.Error("an fd opened before a copy-up cannot follow it", "path", rel, "error", err)
			continue
		}
		f.upper = fd
	}
}

// current is the descriptor the handle reads from now.
func (f *lowerFile) current() (int, bool) {
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	return f.upper, f.upper >= 0
}

func (f *lowerFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	fd, ok := f.current()
	if !ok {
		return f.lowerHandle.Read(ctx, dest, off)
	}
	n, err := unix.Pread(fd, dest, off)
	if err != nil {
		return nil, toErrno(f.node.m.logger, err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *lowerFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	fd, ok := f.current()
	if !ok {
		return f.lowerHandle.Lseek(ctx, off, whence)
	}
	n, err := unix.Seek(fd, int64(off), int(whence))
	return uint64(n), toErrno(f.node.m.logger, err)
}

func (f *lowerFile) Release(ctx context.Context) syscall.Errno {
	f.node.mu.Lock()
	delete(f.node.lowerFiles, f)
	upper := f.upper
	f.upper = -1
	f.node.mu.Unlock()
	if upper >= 0 {
		syscall.Close(upper)
	}
	return f.lowerHandle.Release(ctx)
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

// lowerFd is the descriptor of f, if it is a handle opened on a lower
// file: the copied-up file's once it has one.
func lowerFd(f gofs.FileHandle) (int, bool) {
	df, ok := f.(*daemonFile)
	if !ok {
		return 0, false
	}
	lf, ok := df.daemonHandle.(*lowerFile)
	if !ok {
		return 0, false
	}
	if fd, ok := lf.current(); ok {
		return fd, true
	}
	pf, ok := lf.lowerHandle.(gofs.FilePassthroughFder)
	if !ok {
		return 0, false
	}
	return pf.PassthroughFd()
}

// attrHandle is f unless it is a handle on a lower file, whose attributes
// are not the node's once it has been copied up.
func attrHandle(f gofs.FileHandle) gofs.FileHandle {
	if df, ok := f.(*daemonFile); ok {
		if _, lower := df.daemonHandle.(*lowerFile); lower {
			return nil
		}
	}
	return f
}

func (*lowerFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return syscall.EBADF
}

// daemonFile is an open file whose data the daemon serves: it hides the
// loopback file's passthrough fd, and counts itself in its node's
// daemonServed while open.
type daemonFile struct {
	daemonHandle
	node *volNode
	// tracked is the handle's own file, counted in node.openFiles.
	tracked *gofs.LoopbackFile
}

func (n *volNode) daemonFile(fh gofs.FileHandle) gofs.FileHandle {
	n.mu.Lock()
	n.daemonServed++
	n.mu.Unlock()
	df := &daemonFile{daemonHandle: fh.(daemonHandle), node: n}
	switch h := fh.(type) {
	case *gofs.LoopbackFile:
		df.tracked = h
	case *killprivFile:
		df.tracked = h.LoopbackFile
	}
	if df.tracked != nil {
		n.trackFile(df.tracked)
	}
	return df
}

var _ = (gofs.FileReleaser)((*daemonFile)(nil))

func (f *daemonFile) Release(ctx context.Context) syscall.Errno {
	f.node.mu.Lock()
	f.node.daemonServed--
	f.node.mu.Unlock()
	if f.tracked != nil {
		f.node.untrackFile(f.tracked)
	}
	return f.daemonHandle.Release(ctx)
}
