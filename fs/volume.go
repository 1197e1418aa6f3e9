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
	"github.com/allocfs/allocfs/fs/store/record"

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
	// (record.State.Volumes) and the view it shows it in, which a change
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
func (m *Mount) volumeInode(ctx context.Context, parent *gofs.Inode, st *record.State, key string, view uint64, task *taskNode, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
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
