package fs

import (
	"context"
	"errors"
	iofs "io/fs"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layout"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/volume"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Nomad's client on the mount. With client.alloc_dir on allocfs, Nomad
// makes, migrates and removes allocations with plain syscalls, and the
// skeleton reads its intent from them (docs/design/nomad-client.md):
//
//	mkdir <mount>/<id>                    an allocation (store.CreateFromMount)
//	mkdir <id>/<task>                     a task, its directory empty
//	mkdir <task>/local, tmp, secrets, ... that layout directory
//	rmdir of an empty layout directory    it goes: a volume and its layers,
//	                                      secrets/, a task, the allocation
//	rename <prev>/alloc/data <new>/...    the volume handed over in place
//	rename <prev>/<task>/local <new>/...  (store.AdoptVolume): a remap
//	rename inside an allocation           a task or a volume renamed
//	chmod, chown, utimes of <id>, alloc/  on the layer roots
//
// Other renames of a layout directory between allocations are EXDEV, as
// between mounts; inside one, of a memory volume or an alloc/ view, or of
// a task whose secrets/, private/ or chroot are live, EBUSY, as of a
// mount point. Each change is one journaled change of the store, so a
// restart shows it.
//
// A change made from a request handler must not wait for the kernel: the
// store's OnChange hook would invalidate entries while the kernel holds
// locks for the very request being served (the parents of a rename, say).
// handlerChange has the hook's notifications sent after the handler
// returns; by then the kernel's own dcache already says what the request
// did.

// callerOwner is the uid and gid of the caller of a request.
func callerOwner(ctx context.Context) (uint32, uint32) {
	if c, ok := fuse.FromContext(ctx); ok {
		return c.Uid, c.Gid
	}
	return 0, 0
}

// validMountID checks the name of a mkdir at the mount root: an
// allocation ID (allocdir.ValidID, short enough for its state file), and
// not a hidden name, which tools use for their own temporary files and no
// orchestrator for an allocation.
func validMountID(name string) syscall.Errno {
	if len(name) > volume.MaxNameLen {
		return syscall.ENAMETOOLONG
	}
	if allocdir.ValidID(name) != nil || strings.HasPrefix(name, ".") || len(name)+len(".json") > volume.MaxNameLen {
		return syscall.EINVAL
	}
	return 0
}

var _ = (gofs.NodeMkdirer)((*rootNode)(nil))

// Mkdir at the mount root creates an allocation, owned by the caller,
// with its alloc-level layout in place.
func (r *rootNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := validMountID(name); errno != 0 {
		return nil, errno
	}
	uid, gid := callerOwner(ctx)
	if err := r.m.handlerChange([]string{name}, func() error {
		_, err := r.m.store.CreateFromMount(name, mode&0o7777, uid, gid)
		return err
	}); err != nil {
		return nil, volume.ToErrno(r.m.logger, err)
	}
	if r.m.opts.Created != nil {
		r.m.opts.Created(name)
	}
	r.m.touchRoot()
	return r.Lookup(ctx, name, out)
}

var _ = (gofs.NodeRmdirer)((*rootNode)(nil))

// Rmdir at the mount root destroys an allocation whose directory is
// empty: its tasks, alloc/ and its own entries removed first, as
// os.RemoveAll does it.
func (r *rootNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	st, err := r.m.store.View(name)
	if err != nil {
		return volume.ToErrno(r.m.logger, err)
	}
	if len(layout.Names(st, layout.Place{Kind: layout.Alloc})) > 0 {
		return syscall.ENOTEMPTY
	}
	if empty, errno := r.m.volumeEmpty(st, record.RootVolume); errno != 0 {
		return errno
	} else if !empty {
		return syscall.ENOTEMPTY
	}
	if err := r.m.handlerChange([]string{name}, func() error { return r.m.store.Destroy(name) }); err != nil {
		return volume.ToErrno(r.m.logger, err)
	}
	r.m.touchRoot()
	return 0
}

var _ = (gofs.NodeRenamer)((*rootNode)(nil))

// Rename of an allocation's directory is refused: its name is its ID.
func (r *rootNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EBUSY
}

// touchRoot stamps the mount root's times: an allocation came or went.
func (m *Mount) touchRoot() {
	m.rootTime.Store(time.Now().UnixNano())
}

// Mkdir in an allocation's root makes a task, with its layout, or alloc/
// again after an rmdir; it fails with EEXIST where the allocation's own
// volume holds an entry of that name, as on a local filesystem.
func (a *allocLayout) Mkdir(ctx context.Context, root *volume.Node, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return nil, volume.ToErrno(a.m.logger, err)
	}
	if len(name) > volume.MaxNameLen {
		return nil, syscall.ENAMETOOLONG
	}
	if layout.Child(st, layout.Place{Kind: layout.Alloc}, name).Kind != layout.None {
		return nil, syscall.EEXIST
	}
	if errno := entryAbsent(a.m.logger, root, name); errno != 0 {
		return nil, errno
	}
	if name == allocdir.SharedAllocName {
		err = a.m.handlerChange([]string{a.id}, func() error {
			_, err := a.m.store.AddVolume(a.id, record.SharedVolume)
			return err
		})
	} else {
		uid, gid := callerOwner(ctx)
		err = a.m.handlerChange([]string{a.id}, func() error {
			_, err := a.m.store.AddTask(a.id, name, mode&0o7777, uid, gid)
			return err
		})
	}
	if err != nil {
		return nil, volume.ToErrno(a.m.logger, err)
	}
	return a.Lookup(ctx, root.EmbeddedInode(), name, out)
}

// entryAbsent fails with EEXIST when the volume whose root is root holds
// an entry name in its upper layer (the volumes of layout directories
// have no lower ones).
func entryAbsent(logger hclog.Logger, root *volume.Node, name string) syscall.Errno {
	var st syscall.Stat_t
	err := root.Stack().Lstat(0, name, &st)
	switch {
	case err == nil:
		return syscall.EEXIST
	case errors.Is(err, iofs.ErrNotExist):
		return 0
	}
	return volume.ToErrno(logger, err)
}

// Rmdir in an allocation's root removes alloc/ once its volumes and its
// own entries are gone, or a task whose directory is empty: its own
// entries, local/, tmp/, secrets/, private/ and its alloc/ view removed
// first.
func (a *allocLayout) Rmdir(name string) syscall.Errno {
	st, err := a.m.store.View(a.id)
	if err != nil {
		return volume.ToErrno(a.m.logger, err)
	}
	p := layout.Child(st, layout.Place{Kind: layout.Alloc}, name)
	switch p.Kind {
	case layout.Shared, layout.Task:
		if empty, errno := a.m.taskEmpty(st, p); errno != 0 {
			return errno
		} else if !empty {
			return syscall.ENOTEMPTY
		}
	default:
		return syscall.ENOENT
	}
	if p.Kind == layout.Shared {
		err = a.m.handlerChange([]string{a.id}, func() error { return a.m.store.DropVolume(a.id, p.Key) })
	} else {
		err = a.m.handlerChange([]string{a.id}, func() error { return a.m.store.DropTask(a.id, name) })
	}
	return volume.ToErrno(a.m.logger, err)
}

// Rename of a task's directory to another name in the allocation's own
// directory renames the task, as a rename of a directory does on a local
// filesystem; one that holds a memory volume or shows a chroot is
// refused, as a mount point is (EBUSY), and so is alloc/. Into any other
// directory it is EXDEV: that is another volume.
func (a *allocLayout) Rename(_ *volume.Node, name string, dst *volume.Node, newName string, flags uint32) syscall.Errno {
	if t, ok := dst.Layout().(*allocLayout); !ok || t.id != a.id {
		return syscall.EXDEV
	}
	st, err := a.m.store.View(a.id)
	if err != nil {
		return volume.ToErrno(a.m.logger, err)
	}
	p := layout.Child(st, layout.Place{Kind: layout.Alloc}, name)
	switch {
	case p.Kind != layout.Task:
		return syscall.EBUSY
	case flags&^unix.RENAME_NOREPLACE != 0:
		return syscall.EBUSY
	case st.IsChroot(name) || !st.IsGone(name+"/"+allocdir.TaskSecrets) || !st.IsGone(name+"/"+allocdir.TaskPrivate):
		return syscall.EBUSY
	case len(newName) > volume.MaxNameLen:
		return syscall.ENAMETOOLONG
	case newName == name:
		return 0
	}
	q := layout.Child(st, layout.Place{Kind: layout.Alloc}, newName)
	if q.Kind == layout.None && record.ValidTaskName(newName) != nil {
		// Not a name a task can have: the directory would have to
		// become one of the allocation's own volume's.
		return syscall.EXDEV
	}
	replace := false
	switch q.Kind {
	case layout.Task:
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		if empty, errno := a.m.taskEmpty(st, q); errno != 0 {
			return errno
		} else if !empty {
			return syscall.ENOTEMPTY
		}
		replace = true
	case layout.None:
		if errno := entryAbsent(a.m.logger, dst, newName); errno == syscall.EEXIST {
			// A directory of the allocation's own volume, or a file:
			// replacing it would take the two volumes at once.
			return syscall.EXDEV
		} else if errno != 0 {
			return errno
		}
	default:
		return syscall.EBUSY
	}
	err = a.m.handlerChange([]string{a.id}, func() error {
		return a.m.store.RenameTask(a.id, name, newName, replace)
	})
	if err != nil {
		return volume.ToErrno(a.m.logger, err)
	}
	// The kernel keeps the directory's node, and those below it, under
	// the new name, as it would on a local filesystem: they follow.
	if ch := dst.EmbeddedInode().GetChild(name); ch != nil {
		retargetTask(ch, name, newName)
	}
	return 0
}

// retargetTask makes the task directory node in, and the volume roots
// below it that the kernel holds, those of the task renamed from from to
// to.
func retargetTask(in *gofs.Inode, from, to string) {
	n, ok := in.Operations().(*volume.Node)
	if !ok || n.IsMemory() {
		return
	}
	k := n.Key()
	if k != from && !strings.HasPrefix(k, from+"/") {
		return
	}
	n.SetKey(to + strings.TrimPrefix(k, from))
	if t, ok := n.Layout().(*taskNode); ok {
		t.rename(to)
	}
	for _, ch := range in.Children() {
		retargetTask(ch, from, to)
	}
}

// taskEmpty reports whether the task directory p of st holds nothing:
// no layout directory, no entry of its own.
func (m *Mount) taskEmpty(st *record.State, p layout.Place) (bool, syscall.Errno) {
	if len(layout.Names(st, p)) > 0 {
		return false, 0
	}
	return m.volumeEmpty(st, p.Key)
}

// Mkdir in alloc/ (or a <task>/alloc view) makes data/, logs/ or tmp/
// again after an rmdir, with a fresh layer.
func (s *sharedLayout) Mkdir(ctx context.Context, root *volume.Node, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return nil, volume.ToErrno(s.m.logger, err)
	}
	if layout.Child(st, layout.Place{Kind: layout.Shared, Key: record.SharedVolume}, name).Kind != layout.None {
		return nil, syscall.EEXIST
	}
	if err := s.m.handlerChange([]string{s.id}, func() error {
		_, err := s.m.store.AddVolume(s.id, allocdir.SharedAllocName+"/"+name)
		return err
	}); err != nil {
		return nil, volume.ToErrno(s.m.logger, err)
	}
	return s.Lookup(ctx, root.EmbeddedInode(), name, out)
}

// Rmdir in alloc/ removes an empty data/, logs/ or tmp/ and its layers.
func (s *sharedLayout) Rmdir(name string) syscall.Errno {
	st, err := s.m.store.View(s.id)
	if err != nil {
		return volume.ToErrno(s.m.logger, err)
	}
	p := layout.Child(st, layout.Place{Kind: layout.Shared, Key: record.SharedVolume}, name)
	if p.Kind != layout.Volume {
		return syscall.ENOENT
	}
	if empty, errno := s.m.volumeEmpty(st, p.Key); errno != 0 {
		return errno
	} else if !empty {
		return syscall.ENOTEMPTY
	}
	return volume.ToErrno(s.m.logger, s.m.handlerChange([]string{s.id}, func() error { return s.m.store.DropVolume(s.id, p.Key) }))
}

// Rename of <prev>/alloc/data onto <new>/alloc/data is Nomad's Move of a
// sticky or migrating disk: the volume is handed over (adoptVolume).
// Inside the allocation, data/, logs/ and tmp/ rename as directories do
// (renameVolume); other renames between allocations are EXDEV.
func (s *sharedLayout) Rename(src *volume.Node, name string, dst *volume.Node, newName string, flags uint32) syscall.Errno {
	from := layout.Place{Kind: layout.Shared, Key: record.SharedVolume, View: s.view}
	switch to := dst.Layout().(type) {
	case *sharedLayout:
		if to.id == s.id {
			return s.m.renameVolume(s.id, src, from, name, dst, layout.Place{Kind: layout.Shared, Key: record.SharedVolume, View: to.view}, newName, flags)
		}
		if name != allocdir.SharedDataName || newName != allocdir.SharedDataName {
			return syscall.EXDEV
		}
		return s.m.adoptVolume(s.id, to.id, allocdir.SharedAllocName+"/"+allocdir.SharedDataName, flags)
	case *taskNode:
		if to.id == s.id {
			if _, p, errno := to.place(); errno != 0 {
				return errno
			} else {
				return s.m.renameVolume(s.id, src, from, name, dst, p, newName, flags)
			}
		}
	}
	return syscall.EXDEV
}

// renameVolume renames the volume root name of the layout directory from
// (src its node) to newName in the layout directory to (dst), both of
// allocation id, as a rename of a directory on a local filesystem: the
// volume keeps its layers under its new key, an empty volume there is
// replaced. A rename between two views of alloc/ (<id>/alloc and
// <task>/alloc, a bind mount of it on a plain disk) is EXDEV, as between
// two mounts; onto a name of the layout that is not a volume's, or from a
// memory volume or alloc/ view, EBUSY.
func (m *Mount) renameVolume(id string, src *volume.Node, from layout.Place, name string, dst *volume.Node, to layout.Place, newName string, flags uint32) syscall.Errno {
	st, err := m.store.View(id)
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	p := layout.Child(st, from, name)
	switch {
	case p.Kind != layout.Volume || flags&^unix.RENAME_NOREPLACE != 0:
		return syscall.EBUSY
	case len(newName) > volume.MaxNameLen:
		return syscall.ENAMETOOLONG
	case from.View != to.View:
		return syscall.EXDEV
	case !layout.Renamable(to, newName):
		return syscall.EBUSY
	}
	dir := record.SharedVolume
	if to.Kind == layout.Task {
		dir = st.Tasks[to.Task].Name
	}
	key := dir + "/" + newName
	if key == p.Key {
		return 0
	}
	replace := false
	switch q := layout.Child(st, to, newName); q.Kind {
	case layout.Volume:
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		if empty, errno := m.volumeEmpty(st, q.Key); errno != 0 {
			return errno
		} else if !empty {
			return syscall.ENOTEMPTY
		}
		replace = true
	case layout.None:
		if errno := entryAbsent(m.logger, dst, newName); errno == syscall.EEXIST {
			return syscall.EXDEV
		} else if errno != 0 {
			return errno
		}
	default:
		return syscall.EBUSY
	}
	if err := m.handlerChange([]string{id}, func() error { return m.store.RenameVolume(id, p.Key, key, replace) }); err != nil {
		return volume.ToErrno(m.logger, err)
	}
	// The kernel keeps the volume's node under the new name, as it
	// would on a local filesystem: it follows.
	if ch := src.EmbeddedInode().GetChild(name); ch != nil {
		if n, ok := ch.Operations().(*volume.Node); ok && n.Key() == p.Key {
			n.SetKey(key)
		}
	}
	return 0
}

// adoptVolume hands the volume key of allocation prevID to newID, for a
// rename whose target is that volume's place in newID: the target may be
// missing (Nomad removed it) or an empty volume, replaced as a rename
// replaces an empty directory.
func (m *Mount) adoptVolume(prevID, newID, key string, flags uint32) syscall.Errno {
	switch {
	case flags&(unix.RENAME_EXCHANGE|unix.RENAME_WHITEOUT) != 0:
		return syscall.EXDEV
	}
	prev, err := m.store.View(prevID)
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	next, err := m.store.View(newID)
	if err != nil {
		return volume.ToErrno(m.logger, err)
	}
	if prev.Volumes[key] == nil {
		return syscall.ENOENT
	}
	if next.Volumes[key] != nil {
		if flags&unix.RENAME_NOREPLACE != 0 {
			return syscall.EEXIST
		}
		empty, errno := m.volumeEmpty(next, key)
		if errno != 0 {
			return errno
		}
		if !empty {
			return syscall.ENOTEMPTY
		}
	}
	// The kernel moves its entry, and the node the previous allocation
	// showed the volume with, to the new name; that node numbers inodes
	// in the previous allocation's slot. The store's change hook, once
	// the rename is answered, drops the entry (invalidateVolumes), and the
	// next lookup gives the new allocation's own node.
	return volume.ToErrno(m.logger, m.handlerChange([]string{prevID, newID}, func() error { return m.store.AdoptVolume(prevID, newID, key) }))
}

// volumeEmpty reports whether the volume key of st holds no entry, its
// lower layers included; a task directory's volume is empty when it holds
// nothing besides the layout.
func (m *Mount) volumeEmpty(st *record.State, key string) (bool, syscall.Errno) {
	stack := m.volumeStack(st, key)
	if stack == nil {
		return true, 0
	}
	entries, err := stack.List("", stack.All())
	if err != nil {
		return false, volume.ToErrno(m.logger, err)
	}
	return len(entries) == 0, 0
}

// Mkdir makes the layout directory name of a task directory again
// after an rmdir: local/ and tmp/ with a fresh layer, secrets/, private/
// and the alloc/ view as they were made first.
func (t *taskNode) Mkdir(ctx context.Context, root *volume.Node, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	st, task, errno := t.place()
	if errno != 0 {
		return nil, errno
	}
	if layout.Child(st, task, name).Kind != layout.None {
		return nil, syscall.EEXIST
	}
	err := t.m.handlerChange([]string{t.id}, func() error {
		var err error
		switch name {
		case allocdir.TaskLocal, allocdir.TmpDirName:
			_, err = t.m.store.AddVolume(t.id, t.name()+"/"+name)
		default:
			_, err = t.m.store.SetGone(t.id, t.name()+"/"+name, false)
		}
		return err
	})
	if err != nil {
		return nil, volume.ToErrno(t.m.logger, err)
	}
	return t.Lookup(ctx, root.EmbeddedInode(), name, out)
}

// Rmdir removes the layout directory name of a task directory when it is
// empty: a volume with its layers; secrets/ or private/, whose memory
// goes; the alloc/ view once alloc/'s volumes are gone.
func (t *taskNode) Rmdir(name string) syscall.Errno {
	st, task, errno := t.place()
	if errno != 0 {
		return errno
	}
	p := layout.Child(st, task, name)
	switch p.Kind {
	case layout.Volume:
		if empty, errno := t.m.volumeEmpty(st, p.Key); errno != 0 {
			return errno
		} else if !empty {
			return syscall.ENOTEMPTY
		}
		return volume.ToErrno(t.m.logger, t.m.handlerChange([]string{t.id}, func() error { return t.m.store.DropVolume(t.id, p.Key) }))
	case layout.Shared:
		if len(layout.Names(st, p)) > 0 {
			return syscall.ENOTEMPTY
		}
	case layout.Memory:
		if v := t.m.existingMemVolume(t.id, t.name(), name); v != nil {
			if empty, err := v.empty(); err != nil {
				return volume.ToErrno(t.m.logger, err)
			} else if !empty {
				return syscall.ENOTEMPTY
			}
		}
	default:
		return syscall.ENOENT
	}
	var after *record.State
	err := t.m.handlerChange([]string{t.id}, func() error {
		var err error
		after, err = t.m.store.SetGone(t.id, t.name()+"/"+name, true)
		return err
	})
	if err == nil && p.Kind == layout.Memory {
		t.m.dropMemRoot(t.id, t.name(), name)
		if after.IsChroot(t.name()) && after.IsGone(t.name()+"/"+allocdir.TaskSecrets) && after.IsGone(t.name()+"/"+allocdir.TaskPrivate) {
			t.m.tearDownChroot(t.id, t.name())
		}
	}
	return volume.ToErrno(t.m.logger, err)
}

// Rename handles a rename of the layout directory name of this task
// directory: <prev>/<task>/local onto <new>/<task>/local is Nomad's Move
// (adoptVolume); inside the allocation, local/ and tmp/ rename as
// directories do (renameVolume); any other rename between allocations is
// EXDEV.
func (t *taskNode) Rename(src *volume.Node, name string, dst *volume.Node, newName string, flags uint32) syscall.Errno {
	_, from, errno := t.place()
	if errno != 0 {
		return errno
	}
	switch to := dst.Layout().(type) {
	case *taskNode:
		if to.id == t.id {
			_, p, errno := to.place()
			if errno != 0 {
				return errno
			}
			return t.m.renameVolume(t.id, src, from, name, dst, p, newName, flags)
		}
		if name != allocdir.TaskLocal || newName != allocdir.TaskLocal || to.name() != t.name() {
			return syscall.EXDEV
		}
		return t.m.adoptVolume(t.id, to.id, t.name()+"/"+allocdir.TaskLocal, flags)
	case *sharedLayout:
		if to.id == t.id {
			return t.m.renameVolume(t.id, src, from, name, dst, layout.Place{Kind: layout.Shared, Key: record.SharedVolume, View: to.view}, newName, flags)
		}
	}
	return syscall.EXDEV
}
