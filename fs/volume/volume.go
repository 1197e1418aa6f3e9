package volume

import (
	"context"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/allocfs/allocfs/fs/killpriv"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/restart"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Node is a file or directory inside a volume, served from the
// volume's layers fd-relative (backing.go). Renames and links between
// volumes (or views) fail with EXDEV, as between bind mounts, and every
// name-taking operation checks NAME_MAX.
type Node struct {
	gofs.Inode
	p *Plane
	// st is the volume's stack of layers (only the upper one for a
	// volume without lowers); vroot is the volume's root node, which
	// paths inside the volume start from.
	st    *layer.Stack
	vroot *gofs.Inode
	// slot is mixed into inode numbers (ViewShift).
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
	// task is set on the root of a volume that holds a layout
	// directory's entries, whose layout children (a task's local/,
	// tmp/, secrets/, private/, alloc/; alloc/'s data/, logs/, tmp/; an
	// allocation's alloc/ and tasks) are presented over the layer and
	// cannot be replaced.
	task Layout
	// key and view are set on a volume's root: the volume it is
	// (record.State.Volumes) and the view it shows it in, which a change
	// of the record compares it with (Mount.invalidateVolumes). A rename
	// of a task's directory changes key (SetKey).
	key  atomic.Pointer[string]
	view uint64
	// recorded is set when the node's file, unlinked while open, has a
	// record for a daemon taking over (unlinkedrec.go). Guarded by mu.
	recorded bool
}

// Root is a volume's root as the tree shows it.
type Root struct {
	// Alloc is the allocation whose volume it is, whose disk limit df
	// shows; empty for a memory volume.
	Alloc string
	// Key is the volume (record.State.Volumes: "alloc/data",
	// "<task>/local", ...) and View the view it is shown in, which a
	// change of the record is compared with (Node.Key, Node.View).
	Key  string
	View uint64
	// Slot is View's slot, mixed into inode numbers (ViewShift).
	Slot uint64
	// Stack is the volume's layers.
	Stack *layer.Stack
	// ReadOnly freezes the volume from the start.
	ReadOnly bool
	// Memory is set for a memory volume, which is never frozen, nor
	// followed to another record.
	Memory bool
	// Layout is set for a volume that holds a layout directory's
	// entries, whose layout children it presents.
	Layout Layout
	// Ino, when set, is the inode number the root shows instead of its
	// layer root's: a layout directory keeps the number it is known by
	// (a listing of its parent names it without a lookup). Gen then
	// tells this root from an earlier one of the same number (an
	// allocation ID used again after its GC): the kernel and go-fuse's
	// bridge would otherwise hand back the earlier node, and its layers.
	Ino, Gen uint64
}

// NewRoot makes the node of the volume root r as a child of parent, and
// fills out with its attributes (not its timeouts, which are the tree's).
func (p *Plane) NewRoot(ctx context.Context, parent *gofs.Inode, r Root, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	var rst syscall.Stat_t
	if err := r.Stack.Lstat(0, "", &rst); err != nil {
		if r.Memory {
			return nil, ToErrno(p.logger, err)
		}
		p.logger.Error("layer of volume is missing", "alloc_id", r.Alloc, "volume", r.Key, "layer", filepath.Base(r.Stack.Roots[0]), "error", err)
		return nil, syscall.EIO
	}
	node := &Node{p: p, st: r.Stack, slot: r.Slot, alloc: r.Alloc, task: r.Layout, layers: []int{0}, view: r.View}
	if r.Key != "" {
		node.SetKey(r.Key)
	}
	node.vroot = node.EmbeddedInode()
	ino := rst.Ino
	if !r.Memory {
		node.ro = new(atomic.Bool)
		node.ro.Store(r.ReadOnly)
		if len(r.Stack.Roots) > 1 {
			node.ovl = r.Stack
			node.layers = r.Stack.All()
		}
		ino, _ = r.Stack.Salted(0, rst.Ino)
	}
	out.Attr.FromStat(&rst)
	node.mergedNlink("", node.layers, &out.Attr)
	ino ^= r.Slot << ViewShift
	if r.Ino != 0 {
		ino = r.Ino
	}
	out.Attr.Ino = ino
	return parent.NewInode(ctx, node, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino, Gen: r.Gen}), 0
}

// Key is the volume whose root n is; "" below a root and on a memory
// volume's root.
func (n *Node) Key() string {
	if k := n.key.Load(); k != nil {
		return *k
	}
	return ""
}

// SetKey makes key the volume the root n is: its directory was renamed
// (a task's, and with it the volumes below it), the layers stay.
func (n *Node) SetKey(key string) { n.key.Store(&key) }

// View is the view the volume root n is shown in.
func (n *Node) View() uint64 { return n.view }

// Slot is the slot of the view n is shown in.
func (n *Node) Slot() uint64 { return n.slot }

// Stack is the stack of layers n is served from.
func (n *Node) Stack() *layer.Stack { return n.st }

// IsMemory reports whether n is a memory volume's.
func (n *Node) IsMemory() bool { return n.ro == nil }

// Layout is the layout children n presents, on the root of a layout
// directory's volume; nil on every other node.
func (n *Node) Layout() Layout { return n.task }

// ReadOnly reports whether n's volume is frozen.
func (n *Node) ReadOnly() bool { return n.ro != nil && n.ro.Load() }

// Freeze makes n's volume read-only, for n and every node below its root
// at once: a seal freezes the nodes the kernel still holds, or looks up
// again before it forgets them.
func (n *Node) Freeze() {
	if n.ro != nil {
		n.ro.Store(true)
	}
}

var _ = (gofs.NodeLookuper)((*Node)(nil))

func (n *Node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if strings.HasPrefix(name, restart.UnlinkedPrefix) {
		return n.lookupUnlinked(ctx, name, out)
	}
	if len(name) > MaxNameLen {
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

// reserved reports whether name is a layout child of the directory n.
func (n *Node) reserved(name string) bool {
	return n.task != nil && n.task.Reserved(name)
}

// refuse returns the errno for creating (EEXIST) or removing and
// renaming (EBUSY) a layout child: they are mount points, not files.
func (n *Node) refuse(name string, creating bool) syscall.Errno {
	if len(name) > MaxNameLen {
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

var _ = (gofs.NodeUnlinker)((*Node)(nil))

func (n *Node) Unlink(ctx context.Context, name string) syscall.Errno {
	if n.ReadOnly() {
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

var _ = (gofs.NodeRmdirer)((*Node)(nil))

func (n *Node) Rmdir(ctx context.Context, name string) syscall.Errno {
	if n.ReadOnly() {
		return syscall.EROFS
	}
	// Once the directory is gone (or not), whatever was opened by its
	// path is forgotten.
	defer n.p.dirs.Forget()
	if n.reserved(name) {
		return n.task.Rmdir(name)
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
func (n *Node) movesDir(name string, newParent gofs.InodeEmbedder, newName string) bool {
	ch := n.GetChild(name)
	if ch == nil || ch.IsDir() {
		return true
	}
	dst := newParent.EmbeddedInode().GetChild(newName)
	return dst != nil && dst.IsDir()
}

// beginCreate checks that a new entry name may be made in the directory
// n (a writable volume, a name that is no layout child's and not too
// long) and, in an overlay, readies the upper layer for it.
func (n *Node) beginCreate(name string) syscall.Errno {
	if n.ReadOnly() {
		return syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return errno
	}
	if n.ovl != nil {
		if _, errno := n.prepareCreate(name); errno != 0 {
			return errno
		}
	}
	return 0
}

var _ = (gofs.NodeCreater)((*Node)(nil))

func (n *Node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if errno := n.beginCreate(name); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, fh, errno := n.backingCreate(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if child, ok := ch.Operations().(*Node); ok {
		fh, openFlags := child.serveOpenMode(fh, killpriv.HasSetid(out.Attr.Mode))
		return ch, fh, openFlags, 0
	}
	return ch, n.p.wrapFile(fh), 0, 0
}

var _ = (gofs.NodeMkdirer)((*Node)(nil))

func (n *Node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ReadOnly() {
		return nil, syscall.EROFS
	}
	if n.task != nil && n.task.MakesChild(name) {
		return n.task.Mkdir(ctx, n, name, mode, out)
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
			n.p.logger.Error("could not make a new directory opaque", "name", name, "error", err)
			return nil, ToErrno(n.p.logger, err)
		}
	}
	return ch, errno
}

var _ = (gofs.NodeMknoder)((*Node)(nil))

func (n *Node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.beginCreate(name); errno != 0 {
		return nil, errno
	}
	return n.backingMknod(ctx, name, mode, rdev, out)
}

var _ = (gofs.NodeSymlinker)((*Node)(nil))

func (n *Node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := n.beginCreate(name); errno != 0 {
		return nil, errno
	}
	return n.backingSymlink(ctx, target, name, out)
}

var _ = (gofs.NodeLinker)((*Node)(nil))

func (n *Node) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.ReadOnly() {
		return nil, syscall.EROFS
	}
	if errno := n.refuse(name, true); errno != 0 {
		return nil, errno
	}
	t, ok := target.(*Node)
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

var _ = (gofs.NodeRenamer)((*Node)(nil))

func (n *Node) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if n.ReadOnly() {
		return syscall.EROFS
	}
	if n.movesDir(name, newParent, newName) {
		// Once the directory has moved (or not), whatever was opened
		// by its old path is forgotten.
		defer n.p.dirs.Forget()
	}
	dst, ok := newParent.(*Node)
	if n.reserved(name) {
		if !ok {
			return syscall.EXDEV
		}
		return n.task.Rename(n, name, dst, newName, flags)
	}
	if errno := n.refuse(name, false); errno != 0 {
		return errno
	}
	if !ok {
		if len(newName) > MaxNameLen {
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
	if flags&unix.RENAME_EXCHANGE == 0 {
		dst.holdSpecial(newName)
		dst.recordUnlinked(newName)
	}
	if n.ovl != nil {
		return n.ovlRename(ctx, name, dst, newName, flags)
	}
	if flags&unix.RENAME_WHITEOUT != 0 && dst.nonEmptyDir(newName) {
		// ext4 makes the whiteout before it finds the target not
		// empty, and stamps the source directory's times on the way
		// out: a failed rename must change nothing.
		return syscall.ENOTEMPTY
	}
	errno := n.backingRename(name, dst, newName, flags)
	if errno == 0 && flags&unix.RENAME_WHITEOUT != 0 {
		return n.markRealDevice(name)
	}
	return errno
}

// nonEmptyDir reports whether name in this directory is a directory with
// entries. Anything else is never opened: opening a FIFO would wait for
// a writer.
func (n *Node) nonEmptyDir(name string) bool {
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
