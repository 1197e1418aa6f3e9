package fs

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layout"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/volume"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// syntheticBit marks inode numbers of nodes that have no backing file
// (the skeleton). Backing inode numbers never reach it.
const syntheticBit = uint64(1) << 63

// syntheticIno derives a stable inode number for a skeleton node from its
// path in the mount.
func syntheticIno(parts ...string) uint64 {
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return h.Sum64() | syntheticBit
}

// skeletonAttr describes the mount root, the one directory of the mount
// that is no volume.
type skeletonAttr struct {
	mode                uint32
	uid, gid            uint32
	atime, mtime, ctime time.Time
}

func (a skeletonAttr) fill(out *fuse.Attr, ino uint64) {
	out.Mode = syscall.S_IFDIR | a.mode
	out.Ino = ino
	out.Uid, out.Gid = a.uid, a.gid
	out.Nlink = 2
	out.Size = 4096
	out.Blksize = 4096
	out.SetTimes(&a.atime, &a.mtime, &a.ctime)
}

var _ = (gofs.NodeGetattrer)((*rootNode)(nil))

func (r *rootNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	r.m.rootAttr().fill(&out.Attr, 1)
	out.Ino = volume.RootIno
	return 0
}

var _ = (gofs.NodeLookuper)((*rootNode)(nil))

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := r.m.store.View(name)
	if err != nil {
		return nil, volume.ToErrno(r.m.logger, err)
	}
	return r.m.volumeInode(ctx, &r.Inode, st, record.RootVolume, 0, &allocLayout{m: r.m, id: st.ID}, syntheticIno("alloc", st.ID), out)
}

var _ = (gofs.NodeReaddirer)((*rootNode)(nil))

func (r *rootNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	ids := r.m.store.IDs()
	entries := make([]fuse.DirEntry, 0, len(ids))
	for _, id := range ids {
		entries = append(entries, fuse.DirEntry{Name: id, Mode: syscall.S_IFDIR, Ino: syntheticIno("alloc", id)})
	}
	return gofs.NewListDirStream(volume.WithDots(r.EmbeddedInode(), entries)), 0
}

// allocLayout presents the layout children of <mount>/<allocID>/ (alloc/
// and a directory per task) over the allocation's own volume, whose root
// volume.Node consults it first; any other entry is the volume's.
type allocLayout struct {
	m  *Mount
	id string
}

var _ volume.Layout = (*allocLayout)(nil)

// Reserved reports whether name is alloc/ or a task's directory.
func (a *allocLayout) Reserved(name string) bool {
	st, err := a.m.store.View(a.id)
	return err == nil && (name == allocdir.SharedAllocName || st.TaskIndex(name) >= 0)
}

// MakesChild reports whether a mkdir of name makes a layout child:
// alloc/, or a task, as Nomad makes one; a name no task can have is a
// plain directory of the allocation's own volume.
func (a *allocLayout) MakesChild(name string) bool {
	return name == allocdir.SharedAllocName || record.ValidTaskName(name) == nil
}

// Names lists alloc/ and the tasks the allocation has now.
func (a *allocLayout) Names() ([]string, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, volume.ToErrno(a.m.logger, err)
	}
	return layout.Names(st, layout.Place{Kind: layout.Alloc}), 0
}

// Lookup finds the layout child name of the allocation's directory.
func (a *allocLayout) Lookup(ctx context.Context, parent *gofs.Inode, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, volume.ToErrno(a.m.logger, err)
	}
	return a.m.layoutInode(ctx, parent, st, layout.Child(st, layout.Place{Kind: layout.Alloc}, name), out)
}

// Chowned: only a task directory starts a chroot build.
func (a *allocLayout) Chowned(*volume.Node, uint32) syscall.Errno { return 0 }

// layoutInode returns the node of the layout directory p (fs/layout),
// a child of parent in the allocation st.
func (m *Mount) layoutInode(ctx context.Context, parent *gofs.Inode, st *record.State, p layout.Place, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	switch p.Kind {
	case layout.Shared:
		ino := syntheticIno("shared", st.ID, strconv.FormatUint(p.View, 10))
		return m.volumeInode(ctx, parent, st, p.Key, p.View, &sharedLayout{m: m, id: st.ID, view: p.View}, ino, out)
	case layout.Task:
		view := uint64(0)
		if m.hasHostLayer(st, p.Key) {
			view = taskRootView + uint64(p.Task)
		}
		return m.volumeInode(ctx, parent, st, p.Key, view, newTaskNode(m, st.ID, p.Key), 0, out)
	case layout.Volume:
		return m.volumeInode(ctx, parent, st, p.Key, p.View, nil, 0, out)
	case layout.Memory:
		return m.memoryInode(ctx, parent, st, p.Task, p.Name, out)
	}
	return nil, syscall.ENOENT
}

// volumeInode returns the root node of the volume at key ("alloc/data",
// "<task>/local", ...) of an allocation, as seen in view. lay is set for
// a layout directory's own volume, whose layout children it presents; ino,
// when set, is the number its root shows.
func (m *Mount) volumeInode(ctx context.Context, parent *gofs.Inode, st *record.State, key string, view uint64, lay volume.Layout, ino uint64, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	v, ok := st.Volumes[key]
	if !ok {
		return nil, syscall.ENOENT
	}
	slot, errno := m.slots.slot(st.ID, view)
	if errno != 0 {
		m.logger.Error("too many allocation views live at once", "alloc_id", st.ID, "max", maxSlot)
		return nil, errno
	}
	r := volume.Root{Alloc: st.ID, Key: key, View: view, Slot: slot, Stack: m.volumeStack(st, key), ReadOnly: v.ReadOnly, Layout: lay, Ino: ino}
	if ino != 0 {
		r.Gen = st.Gen ^ v.Gen
	}
	node, errno := m.vol.NewRoot(ctx, parent, r, out)
	if errno == 0 {
		m.stableTimeouts(out)
	}
	return node, errno
}

// sharedLayout presents alloc/'s layout children (data/, logs/, tmp/)
// over alloc/'s own volume. view 0 is <alloc>/alloc; view n>0 is the same
// directory seen as <task>/alloc, with its own inode numbers.
type sharedLayout struct {
	m    *Mount
	id   string
	view uint64
}

var _ volume.Layout = (*sharedLayout)(nil)

// Reserved reports whether name is data/, logs/ or tmp/, or a volume
// renamed into alloc/.
func (s *sharedLayout) Reserved(name string) bool {
	if slices.Contains(allocdir.SharedAllocDirs, name) {
		return true
	}
	st, err := s.m.store.View(s.id)
	return err == nil && st.Volumes[allocdir.SharedAllocName+"/"+name] != nil
}

// MakesChild reports whether a mkdir of name makes data/, logs/ or tmp/
// again; any other is a directory of alloc/'s volume.
func (s *sharedLayout) MakesChild(name string) bool {
	return slices.Contains(allocdir.SharedAllocDirs, name)
}

// Names lists the volumes of alloc/ the allocation has now.
func (s *sharedLayout) Names() ([]string, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, volume.ToErrno(s.m.logger, err)
	}
	return layout.Names(st, layout.Place{Kind: layout.Shared, Key: record.SharedVolume}), 0
}

// Lookup finds the layout child name of alloc/.
func (s *sharedLayout) Lookup(ctx context.Context, parent *gofs.Inode, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, volume.ToErrno(s.m.logger, err)
	}
	return s.m.layoutInode(ctx, parent, st, layout.Child(st, layout.Place{Kind: layout.Shared, Key: record.SharedVolume, View: s.view}, name), out)
}

// Chowned: only a task directory starts a chroot build.
func (s *sharedLayout) Chowned(*volume.Node, uint32) syscall.Errno { return 0 }

// taskNode presents the layout children of <alloc>/<task>/ (local/,
// tmp/, secrets/, private/ and the alloc/ view) over the task directory's
// own volume, whose root volume.Node consults it first.
type taskNode struct {
	m  *Mount
	id string
	// task is the task's name, which a rename of its directory changes
	// while the kernel holds the node (rename).
	task atomic.Pointer[string]
}

func newTaskNode(m *Mount, id, task string) *taskNode {
	t := &taskNode{m: m, id: id}
	t.task.Store(&task)
	return t
}

// name is the task's name now.
func (t *taskNode) name() string { return *t.task.Load() }

// rename follows a rename of the task's directory to task.
func (t *taskNode) rename(task string) { t.task.Store(&task) }

var _ volume.Layout = (*taskNode)(nil)

// Reserved reports whether name is one of a task directory's layout
// children, which the task directory's volume never shows, or a volume
// renamed into it.
func (t *taskNode) Reserved(name string) bool {
	if slices.Contains(layout.TaskChildren, name) {
		return true
	}
	st, err := t.m.store.View(t.id)
	return err == nil && st.Volumes[t.name()+"/"+name] != nil
}

// place returns the allocation's committed record and the task
// directory's place in its layout.
func (t *taskNode) place() (*record.State, layout.Place, syscall.Errno) {
	st, err := t.m.store.View(t.id)
	if err != nil {
		return nil, layout.Place{}, volume.ToErrno(t.m.logger, err)
	}
	i := st.TaskIndex(t.name())
	if i < 0 {
		return nil, layout.Place{}, syscall.ENOENT
	}
	return st, layout.Place{Kind: layout.Task, Key: t.name(), Task: i}, 0
}

// MakesChild reports whether a mkdir of name makes a layout child of the
// task directory again.
func (t *taskNode) MakesChild(name string) bool { return slices.Contains(layout.TaskChildren, name) }

// Names lists the layout children the task directory has now.
func (t *taskNode) Names() ([]string, syscall.Errno) {
	st, p, errno := t.place()
	if errno != 0 {
		return nil, errno
	}
	return layout.Names(st, p), 0
}

// Lookup finds the layout child name of the task directory parent.
func (t *taskNode) Lookup(ctx context.Context, parent *gofs.Inode, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, p, errno := t.place()
	if errno != 0 {
		return nil, errno
	}
	return t.m.layoutInode(ctx, parent, st, layout.Child(st, p, name), out)
}

// statfs reports the backing store's real numbers, so that df on the
// mount tells how much room the layers have.
func (m *Mount) statfs(out *fuse.StatfsOut) syscall.Errno {
	st, err := m.store.Statfs()
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.Bfree, st.Bavail
	out.Files, out.Ffree = st.Files, st.Ffree
	out.Bsize = uint32(st.Bsize)
	out.Frsize = uint32(st.Frsize)
	out.NameLen = volume.MaxNameLen
	return 0
}

var _ = (gofs.NodeStatfser)((*rootNode)(nil))

func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return r.m.statfs(out)
}

// limitStatfs makes out, the backing filesystem's numbers, those of
// allocation id's disk where it has a limit: as a container sees its
// disk, df inside an allocation shows its size, what it holds and what
// it may still write (never more than the backing filesystem has free).
// The mount root keeps the backing store's, which Nomad fingerprints.
func (m *Mount) limitStatfs(id string, out *fuse.StatfsOut) {
	u, ok, err := m.store.Usage(id)
	if err != nil || !ok || out.Frsize == 0 {
		return
	}
	if u.Limit.Bytes > 0 {
		frsize := uint64(out.Frsize)
		blocks := uint64(u.Limit.Bytes) / frsize
		used := uint64(max(u.Bytes, 0)) / frsize
		free := blocks - min(blocks, used)
		out.Blocks = blocks
		out.Bfree = min(free, out.Bfree)
		out.Bavail = min(free, out.Bavail)
	}
	if u.Limit.Inodes > 0 {
		files := uint64(u.Limit.Inodes)
		out.Files = files
		out.Ffree = min(files-min(files, uint64(max(u.Inodes, 0))), out.Ffree)
	}
}

// Chowned turns on the host layer of the task root n when the chown in
// of the SETATTR is the first step of Nomad's chroot build: the directory
// of a task Nomad made, holding nothing of its own yet but the local/
// Nomad made first, given to root.
func (t *taskNode) Chowned(n *volume.Node, uid uint32) syscall.Errno {
	m := t.m
	if uid != 0 || m.chroot == nil || n.Stack().Host == nil {
		return 0
	}
	st, err := m.store.View(t.id)
	if err != nil || st.IsChroot(t.name()) || st.Volumes[t.name()+"/"+allocdir.TaskLocal] == nil {
		// Nomad makes local/ before it embeds the chroot; a directory
		// without it is a plain one given to root.
		return 0
	}
	entries, err := n.Stack().List("", []int{0})
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	if len(entries) > 0 {
		return 0
	}
	err = m.handlerChange([]string{t.id}, func() error {
		_, err := m.store.SetChroot(t.id, t.name(), true)
		return err
	})
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	m.logger.Info("Nomad builds a chroot in a task directory: it shows the chroot environment", "alloc_id", t.id, "task", t.name())
	return 0
}

// rootAttr is the mount root's attribute.
func (m *Mount) rootAttr() skeletonAttr {
	t := m.started
	if ns := m.rootTime.Load(); ns != 0 {
		t = time.Unix(0, ns)
	}
	return skeletonAttr{mode: 0o755, atime: m.started, mtime: t, ctime: t}
}
