package store

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// Changes of an allocation's layout made through the mount.
//
// Nomad's client, with its alloc_dir on the mount, makes and removes
// allocations with plain syscalls: a mkdir at the mount root is an
// allocation's create, a mkdir in its root a task's, a rename of
// <prev>/alloc/data onto <new>/alloc/data a migration, and os.RemoveAll
// of the allocation its destroy, one rmdir at a time. Each of those is one
// change of the records here, journaled like any other, so that what the
// client did survives a restart of the daemon and shows in the CLI, the
// API and the metrics like an allocation made through the API.
//
// An allocation made through the mount is Nomad's (record.OriginMount): the
// collector never takes it, since Nomad does not tell anyone when it
// stops, and removes it itself.

// Errors of layout changes.
var (
	// ErrNotEmpty: the directory a removal names still holds entries.
	ErrNotEmpty = errors.New("directory not empty")
	// ErrOwnedByMount: the API asked to stop or destroy an allocation
	// Nomad's client made through the mount, whose lifecycle is its own.
	ErrOwnedByMount = errors.New("allocation was made through the mount")
)

// CreateFromMount records a new allocation made by a mkdir at the mount
// root: its alloc-level volumes and no tasks, Nomad's, its own directory
// of mode and owned by uid and gid (the caller of the mkdir). It fails
// with ErrExists for an ID the store holds.
func (s *Store) CreateFromMount(id string, mode, uid, gid uint32) (*record.State, error) {
	return s.create(id, nil, CreateOptions{}, &mountRoot{mode: mode, uid: uid, gid: gid})
}

// mountRoot is an allocation's own directory as a mkdir at the mount root
// makes it.
type mountRoot struct{ mode, uid, gid uint32 }

// apply gives the root volume of specs the mkdir's mode and, where the
// daemon may chown, its caller as owner, rather than the agent's.
func (r mountRoot) apply(specs []record.VolumeSpec) {
	for i := range specs {
		if specs[i].Key == record.RootVolume {
			specs[i].Mode = fileMode(r.mode)
			specs[i].Agent = false
			if os.Geteuid() == 0 {
				specs[i].Owner = &allocdir.Owner{UID: int(r.uid), GID: int(r.gid)}
			}
		}
	}
}

// AddTask adds the task name to allocation id with a fresh layer for its
// directory, whose root is of mode and owned by uid and gid (a mkdir in
// the allocation's root). The directory starts empty, as a new directory
// does on a local filesystem: Nomad makes local/, tmp/, secrets/,
// private/ and (for a chroot) alloc/ in it itself, and each such mkdir
// makes that layout directory (AddVolume, SetGone). It fails with
// ErrExists for a task the allocation has.
func (s *Store) AddTask(id, name string, mode, uid, gid uint32) (*record.State, error) {
	if err := record.ValidTaskName(name); err != nil {
		return nil, fmt.Errorf("failed to add task to allocation %q: %w", id, err)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	if st.TaskIndex(name) >= 0 {
		return nil, fmt.Errorf("failed to add task %q to allocation %q: %w", name, id, ErrExists)
	}
	st.Tasks = append(st.Tasks, allocdir.Task{Name: name})
	for _, d := range record.TaskGoneDirs {
		st.Gone = append(st.Gone, name+"/"+d)
	}
	slices.Sort(st.Gone)
	specs := record.TaskVolumes(name)[:1]
	specs[0].Mode = fileMode(mode)
	if os.Geteuid() == 0 {
		specs[0].Owner = &allocdir.Owner{UID: int(uid), GID: int(gid)}
	}
	if err := s.commitWithLayers("update", st, specs); err != nil {
		return nil, fmt.Errorf("failed to add task %q to allocation %q: %w", name, id, err)
	}
	s.touchParent(st, name)
	s.logger.Info("added task", "alloc_id", id, "task", name)
	return s.Get(id)
}

// AddVolume makes the layout volume key ("alloc", "alloc/data",
// "<task>/local", ...) of allocation id again, with a fresh layer: a
// mkdir of a volume root that a removal took. It fails with ErrExists for
// a volume the allocation has.
func (s *Store) AddVolume(id, key string) (*record.State, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	var spec *record.VolumeSpec
	for _, v := range st.VolumeSpecs() {
		if v.Key == key {
			spec = &v
		}
	}
	switch {
	case spec == nil || key == record.RootVolume:
		return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w: not a volume of its layout", key, id, allocdir.ErrInvalidName)
	case st.Volumes[key] != nil:
		return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w", key, id, ErrExists)
	}
	if key == record.SharedVolume {
		g, err := randomGen()
		if err != nil {
			return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w", key, id, err)
		}
		spec.Gen = g
	}
	if err := s.commitWithLayers("update", st, []record.VolumeSpec{*spec}); err != nil {
		return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w", key, id, err)
	}
	s.touchParent(st, key)
	return s.Get(id)
}

// DropVolume removes the volume key of allocation id (an rmdir of its
// root, which the caller found empty), and every layer of it that no other
// allocation stacks.
func (s *Store) DropVolume(id, key string) error {
	return s.dropLayers(id, key, "drop volume", func(st *record.State) error {
		if st.Volumes[key] == nil || key == record.RootVolume {
			return fmt.Errorf("allocation %q has no volume %q: %w", id, key, iofs.ErrNotExist)
		}
		delete(st.Volumes, key)
		return nil
	})
}

// DropTask removes the task name of allocation id and its volumes (an
// rmdir of the task's directory, which the caller found empty), and
// every layer of them no other allocation stacks.
func (s *Store) DropTask(id, name string) error {
	return s.dropLayers(id, name, "drop task", func(st *record.State) error {
		if st.TaskIndex(name) < 0 {
			return fmt.Errorf("allocation %q has no task %q: %w", id, name, iofs.ErrNotExist)
		}
		dropTaskOf(st, name)
		return nil
	})
}

// RenameTask renames the task from of allocation id to to, a rename of
// its directory inside the allocation's own: its volumes and what State
// says of its layout directories go with it, each volume on the same
// layers. replace names a task to, empty, that the rename replaces as a
// rename replaces an empty directory; its layers go. The caller refuses a
// task whose memory volumes or chroot are live, which the name keys
// outside the record.
func (s *Store) RenameTask(id, from, to string, replace bool) error {
	return s.dropLayers(id, to, "rename task", func(st *record.State) error {
		if err := record.ValidTaskName(to); err != nil {
			return err
		}
		i := st.TaskIndex(from)
		if i < 0 {
			return fmt.Errorf("no task %q: %w", from, iofs.ErrNotExist)
		}
		if j := st.TaskIndex(to); j >= 0 {
			if !replace {
				return fmt.Errorf("task %q: %w", to, ErrExists)
			}
			dropTaskOf(st, to)
			i = st.TaskIndex(from)
		}
		st.Tasks[i].Name = to
		moved := func(k string) (string, bool) {
			if k == from {
				return to, true
			}
			if rest, ok := strings.CutPrefix(k, from+"/"); ok {
				return to + "/" + rest, true
			}
			return k, false
		}
		vols := make(map[string]*record.Volume, len(st.Volumes))
		for k, v := range st.Volumes {
			k, _ = moved(k)
			vols[k] = v
		}
		st.Volumes = vols
		for j, d := range st.Gone {
			st.Gone[j], _ = moved(d)
		}
		slices.Sort(st.Gone)
		for j, t := range st.Chroots {
			st.Chroots[j], _ = moved(t)
		}
		slices.Sort(st.Chroots)
		return nil
	})
}

// RenameVolume renames the volume from of allocation id to to, a rename
// of its root inside the allocation ("alloc/data" to "alloc/d2", or into a
// task's directory): the same layers under the new key. Both keys name a
// directory of the layout (alloc/ or a task's) and an entry of it.
// replace names a volume to, empty, that the rename replaces as a rename
// replaces an empty directory; its layers go.
func (s *Store) RenameVolume(id, from, to string, replace bool) error {
	return s.dropLayers(id, to, "rename volume", func(st *record.State) error {
		if st.Volumes[from] == nil || !volumeKeyIn(st, from) {
			return fmt.Errorf("no volume %q to rename: %w", from, iofs.ErrNotExist)
		}
		if !volumeKeyIn(st, to) {
			return fmt.Errorf("%w: %q is no entry of a layout directory", allocdir.ErrInvalidName, to)
		}
		if st.Volumes[to] != nil && !replace {
			return fmt.Errorf("volume %q: %w", to, ErrExists)
		}
		st.Volumes[to] = st.Volumes[from]
		delete(st.Volumes, from)
		return nil
	})
}

// volumeKeyIn reports whether key names an entry of alloc/ or of a task's
// directory of st, where a volume may be.
func volumeKeyIn(st *record.State, key string) bool {
	dir, name, ok := strings.Cut(key, "/")
	if !ok || allocdir.ValidName(name) != nil {
		return false
	}
	return dir == record.SharedVolume || st.TaskIndex(dir) >= 0
}

// dropTaskOf removes the task name, its volumes and what State says of
// its layout directories from st.
func dropTaskOf(st *record.State, name string) {
	i := st.TaskIndex(name)
	st.Tasks = slices.Delete(st.Tasks, i, i+1)
	for k := range st.Volumes {
		if k == name || strings.HasPrefix(k, name+"/") {
			delete(st.Volumes, k)
		}
	}
	st.Gone = slices.DeleteFunc(st.Gone, func(d string) bool { return strings.HasPrefix(d, name+"/") })
	st.Chroots = slices.DeleteFunc(st.Chroots, func(t string) bool { return t == name })
}

// dropLayers applies edit to a copy of allocation id's record, journals
// it, stamps the times of the directory that held key, and removes the
// layers the old record named that nothing names any more.
func (s *Store) dropLayers(id, key, what string, edit func(*record.State) error) error {
	s.writeMu.Lock()
	st, err := s.Get(id)
	if err != nil {
		s.writeMu.Unlock()
		return err
	}
	before := st.Clone()
	if err := edit(st); err != nil {
		s.writeMu.Unlock()
		return fmt.Errorf("failed to %s of allocation %q: %w", what, id, err)
	}
	if err := s.commit("update", st); err != nil {
		s.writeMu.Unlock()
		return fmt.Errorf("failed to %s of allocation %q: %w", what, id, err)
	}
	s.touchParent(st, key)
	s.mu.Lock()
	owned := s.claimLocked(sortedKeys(before.LayerIDs()))
	s.mu.Unlock()
	s.writeMu.Unlock()
	if _, err := s.removeClaimed(owned, "alloc_id", id, "reason", what); err != nil {
		return fmt.Errorf("%s of allocation %q done; its layers are left for the collector: %w", what, id, err)
	}
	return nil
}

// touchParent stamps the modification and change times of the directory
// that holds the layout directory key of st ("alloc/data" is in alloc/,
// a task's directory and alloc/ in the allocation's own), as a local
// filesystem does when an entry comes or goes. The times are not
// journaled: a crash may lose them, as it may lose an unsynced directory
// change on a local filesystem.
func (s *Store) touchParent(st *record.State, key string) {
	parent := record.RootVolume
	if dir := path.Dir(key); dir != "." {
		parent = dir
	}
	v := st.Volumes[parent]
	if v == nil {
		return
	}
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_NOW}}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, s.LayerPath(v.Upper), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		s.logger.Debug("could not stamp a layout directory's times", "alloc_id", st.ID, "volume", parent, "error", err)
	}
}

// SetGone records that the layout directory dir ("<task>/alloc",
// "<task>/secrets", "<task>/private") of allocation id was removed
// through the mount (gone) or made again (not gone).
func (s *Store) SetGone(id, dir string, gone bool) (*record.State, error) {
	return s.Update(id, func(st *record.State) error {
		if err := st.ValidGone(dir); err != nil {
			return err
		}
		if gone == st.IsGone(dir) {
			if gone {
				return fmt.Errorf("%q: %w", dir, iofs.ErrNotExist)
			}
			return fmt.Errorf("%q: %w", dir, ErrExists)
		}
		if gone {
			st.Gone = append(st.Gone, dir)
			slices.Sort(st.Gone)
		} else {
			st.Gone = slices.DeleteFunc(st.Gone, func(d string) bool { return d == dir })
		}
		return nil
	})
}

// SetChroot records whether the directory of the task of allocation id
// shows the node's chroot environment below its own layer: on once Nomad
// builds a chroot there, off once Nomad tears the directory down.
func (s *Store) SetChroot(id, task string, on bool) (*record.State, error) {
	return s.Update(id, func(st *record.State) error {
		if st.TaskIndex(task) < 0 {
			return fmt.Errorf("no task %q: %w", task, iofs.ErrNotExist)
		}
		st.Chroots = slices.DeleteFunc(st.Chroots, func(t string) bool { return t == task })
		if on {
			st.Chroots = append(st.Chroots, task)
			slices.Sort(st.Chroots)
		}
		return nil
	})
}

// AdoptVolume hands the volume key of allocation prevID to newID, as a
// rename of <prev>/alloc/data onto <new>/alloc/data (or of a task's
// local/) asks: newID stacks prevID's layers from now on, written in
// place, and prevID has no such volume any more. newID's own volume at
// key, an empty one a rename may replace, goes with its layers. Both
// records change in one journaled intent. prevID need not be stopped: its
// open files keep working, as they would across a rename on a local
// filesystem, and several volumes may go to the same allocation one at a
// time (Nomad moves alloc/data, then each task's local/).
func (s *Store) AdoptVolume(prevID, newID, key string) (err error) {
	defer s.observeMigration(MigrationAdopt, time.Now(), &err)
	if !migratedKey(key) {
		return fmt.Errorf("failed to hand %q of %s to %s: %w: not a migrated volume", key, prevID, newID, allocdir.ErrInvalidName)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if prevID == newID {
		return fmt.Errorf("failed to hand %q of %s to itself: %w", key, prevID, allocdir.ErrInvalidName)
	}
	prev, err := s.Get(prevID)
	if err != nil {
		return err
	}
	next, err := s.Get(newID)
	if err != nil {
		return err
	}
	switch {
	case prev.MigratedTo != "" && prev.MigratedTo != newID:
		return fmt.Errorf("previous allocation %q already handed its data to %q: %w", prevID, prev.MigratedTo, ErrExists)
	case prev.Volumes[key] == nil:
		return fmt.Errorf("allocation %q has no volume %q: %w", prevID, key, iofs.ErrNotExist)
	case !next.HasVolumeSpec(key):
		return fmt.Errorf("allocation %q has no place for %q: %w", newID, key, iofs.ErrNotExist)
	}
	before := next.Clone()
	next.Volumes[key] = prev.Volumes[key]
	delete(prev.Volumes, key)
	prev.MigratedTo = newID
	next.Previous = prevID
	if err := s.change(&intent{Op: "remap", Records: map[string]*record.State{prevID: prev, newID: next}}); err != nil {
		return fmt.Errorf("failed to hand %q of %s to %s: %w", key, prevID, newID, err)
	}
	if old := before.Volumes[key]; old != nil {
		s.mu.Lock()
		owned := s.claimLocked(old.Layers())
		s.mu.Unlock()
		s.removeClaimed(owned, "alloc_id", newID, "reason", "placeholder replaced by a migration")
	}
	s.logger.Info("handed volume over", "volume", key, "alloc_id", newID, "previous_alloc_id", prevID, "op", "remap")
	return nil
}

// fileMode turns the permission, set-id and sticky bits of a mode into an
// os.FileMode, as a fresh layer's root takes it.
func fileMode(mode uint32) os.FileMode {
	m := os.FileMode(mode & 0o777)
	if mode&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

// migratedKey reports whether key is a volume a migration hands over:
// alloc/data, or a task's local/.
func migratedKey(key string) bool {
	task, name, ok := strings.Cut(key, "/")
	if !ok || strings.Contains(name, "/") {
		return false
	}
	if task == allocdir.SharedAllocName {
		return name == allocdir.SharedDataName
	}
	return name == allocdir.TaskLocal && record.ValidTaskName(task) == nil
}
