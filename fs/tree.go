package fs

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
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

// skeletonAttr describes a fixed directory of the layout.
type skeletonAttr struct {
	mode                uint32
	uid, gid            uint32
	atime, mtime, ctime time.Time
}

// attrAt is a skeleton directory's attribute with all three times t.
func attrAt(mode, uid, gid uint32, t time.Time) skeletonAttr {
	return skeletonAttr{mode: mode, uid: uid, gid: gid, atime: t, mtime: t, ctime: t}
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

// dirAttr is the record's form of a.
func (a skeletonAttr) dirAttr() record.DirAttr {
	return record.DirAttr{Mode: a.mode, UID: a.uid, GID: a.gid, Atime: a.atime, Mtime: a.mtime, Ctime: a.ctime}
}

// skeletonOf is the attribute the record st sets on its skeleton
// directory dir, or def when it sets none.
func skeletonOf(st *record.State, dir string, def skeletonAttr) skeletonAttr {
	a := st.Dirs[dir]
	if a == nil {
		return def
	}
	return skeletonAttr{mode: a.Mode, uid: a.UID, gid: a.GID, atime: a.Atime, mtime: a.Mtime, ctime: a.Ctime}
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
	n := &allocNode{m: r.m, id: st.ID}
	attr := r.m.allocAttr(st)
	ino := syntheticIno("alloc", st.ID)
	attr.fill(&out.Attr, ino)
	r.m.stableTimeouts(out)
	return r.NewInode(ctx, n, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
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

// allocNode is <mount>/<allocID>/: alloc/ plus one directory per task.
type allocNode struct {
	gofs.Inode
	m  *Mount
	id string
}

var _ = (gofs.NodeGetattrer)((*allocNode)(nil))

func (a *allocNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return volume.ToErrno(a.m.logger, err)
	}
	a.m.allocAttr(st).fill(&out.Attr, a.StableAttr().Ino)
	return 0
}

var _ = (gofs.NodeLookuper)((*allocNode)(nil))

func (a *allocNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, volume.ToErrno(a.m.logger, err)
	}
	return a.m.layoutInode(ctx, &a.Inode, st, layout.Child(st, layout.Place{Kind: layout.Alloc}, name), out)
}

// layoutInode returns the node of the layout directory p (fs/layout),
// a child of parent in the allocation st.
func (m *Mount) layoutInode(ctx context.Context, parent *gofs.Inode, st *record.State, p layout.Place, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	switch p.Kind {
	case layout.Shared:
		return m.sharedInode(ctx, parent, st, p.View, out)
	case layout.Task:
		view := uint64(0)
		if m.hasHostLayer(st, p.Key) {
			view = taskRootView + uint64(p.Task)
		}
		return m.volumeInode(ctx, parent, st, p.Key, view, &taskNode{m: m, id: st.ID, task: p.Key}, out)
	case layout.Volume:
		return m.volumeInode(ctx, parent, st, p.Key, p.View, nil, out)
	case layout.Memory:
		return m.memoryInode(ctx, parent, st, p.Task, p.Name, out)
	}
	return nil, syscall.ENOENT
}

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
	r := volume.Root{Alloc: st.ID, Key: key, View: view, Slot: slot, Stack: m.volumeStack(st, key), ReadOnly: v.ReadOnly}
	if task != nil {
		r.Layout = task
	}
	node, errno := m.vol.NewRoot(ctx, parent, r, out)
	if errno == 0 {
		m.stableTimeouts(out)
	}
	return node, errno
}

var _ = (gofs.NodeReaddirer)((*allocNode)(nil))

func (a *allocNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, volume.ToErrno(a.m.logger, err)
	}
	var entries []fuse.DirEntry
	for _, n := range layout.Names(st, layout.Place{Kind: layout.Alloc}) {
		e := fuse.DirEntry{Name: n, Mode: syscall.S_IFDIR}
		if n == allocdir.SharedAllocName {
			e.Ino = syntheticIno("shared", a.id, "0")
		}
		entries = append(entries, e)
	}
	return gofs.NewListDirStream(volume.WithDots(a.EmbeddedInode(), entries)), 0
}

// sharedNode is an allocation's alloc/ directory: logs/, tmp/ and data/.
// view 0 is <alloc>/alloc; view n>0 is the same content seen as
// <task>/alloc, with its own inode numbers.
type sharedNode struct {
	gofs.Inode
	m    *Mount
	id   string
	view uint64
}

var _ = (gofs.NodeGetattrer)((*sharedNode)(nil))

func (s *sharedNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return volume.ToErrno(s.m.logger, err)
	}
	s.m.sharedAttr(st).fill(&out.Attr, s.StableAttr().Ino)
	return 0
}

var _ = (gofs.NodeLookuper)((*sharedNode)(nil))

func (s *sharedNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, volume.ToErrno(s.m.logger, err)
	}
	return s.m.layoutInode(ctx, &s.Inode, st, layout.Child(st, layout.Place{Kind: layout.Shared, View: s.view}, name), out)
}

var _ = (gofs.NodeReaddirer)((*sharedNode)(nil))

func (s *sharedNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, volume.ToErrno(s.m.logger, err)
	}
	names := layout.Names(st, layout.Place{Kind: layout.Shared})
	entries := make([]fuse.DirEntry, 0, len(names))
	for _, n := range names {
		entries = append(entries, fuse.DirEntry{Name: n, Mode: syscall.S_IFDIR})
	}
	return gofs.NewListDirStream(volume.WithDots(s.EmbeddedInode(), entries)), 0
}

// taskNode presents the layout children of <alloc>/<task>/ (local/,
// tmp/, secrets/, private/ and the alloc/ view) over the task directory's
// own volume, whose root volume.Node consults it first.
type taskNode struct {
	m    *Mount
	id   string
	task string
}

var _ volume.Layout = (*taskNode)(nil)

// Reserved reports whether name is one of a task directory's layout
// children, which the task directory's volume never shows.
func (t *taskNode) Reserved(name string) bool { return slices.Contains(layout.TaskChildren, name) }

// place returns the allocation's committed record and the task
// directory's place in its layout.
func (t *taskNode) place() (*record.State, layout.Place, syscall.Errno) {
	st, err := t.m.store.View(t.id)
	if err != nil {
		return nil, layout.Place{}, volume.ToErrno(t.m.logger, err)
	}
	i := st.TaskIndex(t.task)
	if i < 0 {
		return nil, layout.Place{}, syscall.ENOENT
	}
	return st, layout.Place{Kind: layout.Task, Key: t.task, Task: i}, 0
}

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

var _ = (gofs.NodeStatfser)((*allocNode)(nil))

func (a *allocNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := a.m.statfs(out); errno != 0 {
		return errno
	}
	a.m.limitStatfs(a.id, out)
	return 0
}

var _ = (gofs.NodeStatfser)((*sharedNode)(nil))

func (s *sharedNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if errno := s.m.statfs(out); errno != 0 {
		return errno
	}
	s.m.limitStatfs(s.id, out)
	return 0
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
// of the SETATTR is the first step of Nomad's chroot build: the still
// empty directory of a task Nomad made, given to root.
func (t *taskNode) Chowned(n *volume.Node, uid uint32) syscall.Errno {
	m := t.m
	if uid != 0 || m.chroot == nil || n.Stack().Host == nil {
		return 0
	}
	st, err := m.store.View(t.id)
	if err != nil || st.IsChroot(t.task) {
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
		_, err := m.store.SetChroot(t.id, t.task)
		return err
	})
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	m.logger.Info("Nomad builds a chroot in a task directory: it shows the chroot environment", "alloc_id", t.id, "task", t.task)
	return 0
}

// sharedInode returns the alloc/ node of an allocation in a view.
func (m *Mount) sharedInode(ctx context.Context, parent *gofs.Inode, st *record.State, view uint64, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ino := syntheticIno("shared", st.ID, strconv.FormatUint(view, 10))
	m.sharedAttr(st).fill(&out.Attr, ino)
	m.stableTimeouts(out)
	n := &sharedNode{m: m, id: st.ID, view: view}
	return parent.NewInode(ctx, n, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
}

// rootAttr is the mount root's attribute.
func (m *Mount) rootAttr() skeletonAttr {
	t := m.started
	if ns := m.rootTime.Load(); ns != 0 {
		t = time.Unix(0, ns)
	}
	return skeletonAttr{mode: 0o755, atime: m.started, mtime: t, ctime: t}
}

// allocAttr is the attribute of <mount>/<allocID>: what was set on it
// through the mount, else 0755, owned by the agent.
func (m *Mount) allocAttr(st *record.State) skeletonAttr {
	return skeletonOf(st, record.DirRoot, attrAt(0o755, m.agent.uid, m.agent.gid, st.Created))
}

// sharedAttr is the attribute of alloc/ and of its <task>/alloc views:
// what was set on it through the mount, else 0777, owned by nobody when
// running as root.
func (m *Mount) sharedAttr(st *record.State) skeletonAttr {
	return skeletonOf(st, record.DirShared, attrAt(0o777, m.shared.uid, m.shared.gid, st.Created))
}
