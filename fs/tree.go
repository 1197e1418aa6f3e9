package fs

import (
	"context"
	"hash/fnv"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

const (
	// maxNameLen is NAME_MAX of the backing filesystems we support; the
	// kernel only checks 1024 bytes, so every name-taking handler checks.
	maxNameLen = 255

	renameNoReplace = 0x1 // RENAME_NOREPLACE
	renameExchange  = 0x2 // RENAME_EXCHANGE
	renameWhiteout  = 0x4 // RENAME_WHITEOUT

	// syntheticBit marks inode numbers of nodes that have no backing file
	// (the skeleton). Backing inode numbers never reach it.
	syntheticBit = uint64(1) << 63
	// viewShift places the slot of the place a volume is shown (see
	// identity.go) in the high bits of the inode numbers it shows, so
	// that one backing inode shown in two places is two nodes.
	viewShift = 48
)

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

// rootNode is the mount root: one directory per allocation.
type rootNode struct {
	gofs.Inode
	m *Mount
}

var _ = (gofs.NodeGetattrer)((*rootNode)(nil))

func (r *rootNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	r.m.rootAttr().fill(&out.Attr, 1)
	out.Ino = rootIno
	return 0
}

var _ = (gofs.NodeLookuper)((*rootNode)(nil))

func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := r.m.store.View(name)
	if err != nil {
		return nil, toErrno(r.m.logger, err)
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
	return gofs.NewListDirStream(withDots(r.EmbeddedInode(), entries)), 0
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
		return toErrno(a.m.logger, err)
	}
	a.m.allocAttr(st).fill(&out.Attr, a.StableAttr().Ino)
	return 0
}

var _ = (gofs.NodeLookuper)((*allocNode)(nil))

func (a *allocNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, toErrno(a.m.logger, err)
	}
	return a.m.layoutInode(ctx, &a.Inode, st, layoutChild(st, place{kind: placeAlloc}, name), out)
}

// layoutInode returns the node of the layout directory p (layout.go),
// a child of parent in the allocation st.
func (m *Mount) layoutInode(ctx context.Context, parent *gofs.Inode, st *record.State, p place, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	switch p.kind {
	case placeShared:
		return m.sharedInode(ctx, parent, st, p.view, out)
	case placeTask:
		view := uint64(0)
		if m.hasHostLayer(st, p.key) {
			view = taskRootView + uint64(p.task)
		}
		return m.volumeInode(ctx, parent, st, p.key, view, &taskNode{m: m, id: st.ID, task: p.key}, out)
	case placeVolume:
		return m.volumeInode(ctx, parent, st, p.key, p.view, nil, out)
	case placeMemory:
		return m.memoryInode(ctx, parent, st, p.task, p.name, out)
	}
	return nil, syscall.ENOENT
}

var _ = (gofs.NodeReaddirer)((*allocNode)(nil))

func (a *allocNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, toErrno(a.m.logger, err)
	}
	var entries []fuse.DirEntry
	for _, n := range layoutNames(st, place{kind: placeAlloc}) {
		e := fuse.DirEntry{Name: n, Mode: syscall.S_IFDIR}
		if n == allocdir.SharedAllocName {
			e.Ino = syntheticIno("shared", a.id, "0")
		}
		entries = append(entries, e)
	}
	return gofs.NewListDirStream(withDots(a.EmbeddedInode(), entries)), 0
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
		return toErrno(s.m.logger, err)
	}
	s.m.sharedAttr(st).fill(&out.Attr, s.StableAttr().Ino)
	return 0
}

var _ = (gofs.NodeLookuper)((*sharedNode)(nil))

func (s *sharedNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, toErrno(s.m.logger, err)
	}
	return s.m.layoutInode(ctx, &s.Inode, st, layoutChild(st, place{kind: placeShared, view: s.view}, name), out)
}

var _ = (gofs.NodeReaddirer)((*sharedNode)(nil))

func (s *sharedNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, toErrno(s.m.logger, err)
	}
	names := layoutNames(st, place{kind: placeShared})
	entries := make([]fuse.DirEntry, 0, len(names))
	for _, n := range names {
		entries = append(entries, fuse.DirEntry{Name: n, Mode: syscall.S_IFDIR})
	}
	return gofs.NewListDirStream(withDots(s.EmbeddedInode(), entries)), 0
}

// taskNode presents the layout children of <alloc>/<task>/ (local/,
// tmp/, secrets/, private/ and the alloc/ view) over the task directory's
// own volume, whose root volNode consults it first.
type taskNode struct {
	m    *Mount
	id   string
	task string
}

// Lookup finds the layout child name of the task directory parent.
func (t *taskNode) Lookup(ctx context.Context, parent *gofs.Inode, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := t.m.store.View(t.id)
	if err != nil {
		return nil, toErrno(t.m.logger, err)
	}
	i := st.TaskIndex(t.task)
	if i < 0 {
		return nil, syscall.ENOENT
	}
	return t.m.layoutInode(ctx, parent, st, layoutChild(st, place{kind: placeTask, key: t.task, task: i}, name), out)
}

// statfs reports the backing store's real numbers, so that df on the
// mount tells how much room the layers have.
func (m *Mount) statfs(out *fuse.StatfsOut) syscall.Errno {
	st, err := m.store.Statfs()
	if err != nil {
		return toErrno(m.logger, err)
	}
	out.Blocks, out.Bfree, out.Bavail = st.Blocks, st.Bfree, st.Bavail
	out.Files, out.Ffree = st.Files, st.Ffree
	out.Bsize = uint32(st.Bsize)
	out.Frsize = uint32(st.Frsize)
	out.NameLen = maxNameLen
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

// withDots puts "." and ".." before entries, the directory n's own and
// its parent's, as every listing of a local filesystem has them: tools
// that count a directory's entries, or walk by "..", expect them.
func withDots(n *gofs.Inode, entries []fuse.DirEntry) []fuse.DirEntry {
	self := inoOf(n)
	parent := self
	if _, p := n.Parent(); p != nil {
		parent = inoOf(p)
	}
	return append([]fuse.DirEntry{
		{Name: ".", Mode: syscall.S_IFDIR, Ino: self},
		{Name: "..", Mode: syscall.S_IFDIR, Ino: parent},
	}, entries...)
}

// rootIno is the mount root's inode number, FUSE's root node ID.
const rootIno = fuse.FUSE_ROOT_ID

// inoOf is the inode number stat shows for n.
func inoOf(n *gofs.Inode) uint64 {
	if n.IsRoot() {
		return rootIno
	}
	return n.StableAttr().Ino
}
