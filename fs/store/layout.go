package store

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
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
// An allocation made through the mount is Nomad's (OriginMount): the
// collector never takes it, since Nomad does not tell anyone when it
// stops, and removes it itself.

// OriginMount is the State.Origin of an allocation made by a mkdir at the
// mount root.
const OriginMount = "mount"

// Errors of layout changes.
var (
	// ErrNotEmpty: the directory a removal names still holds entries.
	ErrNotEmpty = errors.New("directory not empty")
	// ErrOwnedByMount: the API asked to stop or destroy an allocation
	// Nomad's client made through the mount, whose lifecycle is its own.
	ErrOwnedByMount = errors.New("allocation was made through the mount")
)

// DirAttr is what a task or Nomad set on a directory of the skeleton (an
// allocation's root, its alloc/) through the mount: chmod, chown, utimes,
// and the times the directory's own changes stamp.
type DirAttr struct {
	Mode  uint32    `json:"mode"` // permission, set-id and sticky bits
	UID   uint32    `json:"uid"`
	GID   uint32    `json:"gid"`
	Atime time.Time `json:"atime"`
	Mtime time.Time `json:"mtime"`
	Ctime time.Time `json:"ctime"`
}

// Skeleton directories with attributes of their own (State.Dirs).
const (
	// DirRoot is the allocation's own directory, <mount>/<allocID>.
	DirRoot = ""
	// DirShared is its alloc/, which every <task>/alloc view shows too.
	DirShared = allocdir.SharedAllocName
)

// goneDirs are the names, in a task directory, of the layout directories
// that State.Gone can hold besides alloc/ itself.
var goneDirs = []string{allocdir.SharedAllocName, allocdir.TaskSecrets, allocdir.TaskPrivate}

// IsGone reports whether the layout directory dir ("alloc",
// "<task>/alloc", "<task>/secrets", "<task>/private") was removed through
// the mount.
func (s *State) IsGone(dir string) bool { return slices.Contains(s.Gone, dir) }

// validGone checks an entry of State.Gone: alloc/, or a task's alloc/,
// secrets/ or private/.
func (s *State) validGone(dir string) error {
	if dir == DirShared {
		return nil
	}
	task, name, ok := strings.Cut(dir, "/")
	if ok && s.TaskIndex(task) >= 0 && slices.Contains(goneDirs, name) {
		return nil
	}
	return fmt.Errorf("%w: %q is not a removable layout directory", allocdir.ErrInvalidName, dir)
}

// CreateFromMount records a new allocation made by a mkdir at the mount
// root: its alloc-level volumes and no tasks, Nomad's, with attr on its
// root. It fails with ErrExists for an ID the store holds.
func (s *Store) CreateFromMount(id string, attr DirAttr) (*State, error) {
	st, err := s.newState(id, nil)
	if err != nil {
		return nil, err
	}
	st.Origin = OriginMount
	st.Dirs = map[string]*DirAttr{DirRoot: &attr}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.absent(id); err != nil {
		return nil, err
	}
	if err := s.sizeNew(st, Limit{}); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	fresh, err := s.freshVolumes(st)
	if err == nil {
		err = s.change(&intent{Op: "create", Records: map[string]*State{id: st}, Fresh: fresh})
	}
	if err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, errors.Join(err, s.removeFresh(fresh)))
	}
	s.logger.Info("created allocation", "alloc_id", id, "tasks", 0, "origin", OriginMount)
	return s.Get(id)
}

// AddTask adds the task name to allocation id with fresh layers for its
// directory, local/ and tmp/, the directory's root of mode and owned by
// uid and gid (a mkdir in the allocation's root). parent is the
// allocation root's attribute before the change, whose times the new
// entry stamps. It fails with ErrExists for a task the allocation has.
func (s *Store) AddTask(id, name string, mode, uid, gid uint32, parent DirAttr) (*State, error) {
	if err := validTaskName(name); err != nil {
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
	specs := taskVolumes(name)
	specs[0].mode = fileMode(mode)
	if os.Geteuid() == 0 {
		specs[0].owner = &allocdir.Owner{UID: int(uid), GID: int(gid)}
	}
	stampDir(st, DirRoot, parent)
	if err := s.commitWithLayers("update", st, specs); err != nil {
		return nil, fmt.Errorf("failed to add task %q to allocation %q: %w", name, id, err)
	}
	s.logger.Info("added task", "alloc_id", id, "task", name)
	return s.Get(id)
}

// AddVolume makes the layout volume key ("alloc/data", "<task>/local",
// ...) of allocation id again, with a fresh layer: a mkdir of a volume
// root that a removal took. parent, when set, is the attribute of the
// skeleton directory that holds it (alloc/), whose times the new entry
// stamps. It fails with ErrExists for a volume the allocation has.
func (s *Store) AddVolume(id, key string, parent *DirAttr) (*State, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	var spec *volumeSpec
	for _, v := range st.volumeSpecs() {
		if v.key == key {
			spec = &v
		}
	}
	switch {
	case spec == nil:
		return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w: not a volume of its layout", key, id, allocdir.ErrInvalidName)
	case st.Volumes[key] != nil:
		return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w", key, id, ErrExists)
	}
	if parent != nil {
		stampDir(st, DirShared, *parent)
	}
	if err := s.commitWithLayers("update", st, []volumeSpec{*spec}); err != nil {
		return nil, fmt.Errorf("failed to make volume %q of allocation %q: %w", key, id, err)
	}
	return s.Get(id)
}

// DropVolume removes the volume key of allocation id (an rmdir of its
// root, which the caller found empty), and every layer of it that no other
// allocation stacks. parent, when set, is alloc/'s attribute, as for
// AddVolume.
func (s *Store) DropVolume(id, key string, parent *DirAttr) error {
	return s.dropLayers(id, "drop volume", func(st *State) error {
		if st.Volumes[key] == nil {
			return fmt.Errorf("allocation %q has no volume %q: %w", id, key, iofs.ErrNotExist)
		}
		delete(st.Volumes, key)
		if parent != nil {
			stampDir(st, DirShared, *parent)
		}
		return nil
	})
}

// DropTask removes the task name of allocation id and its volumes (an
// rmdir of the task's directory, which the caller found empty), and
// every layer of them no other allocation stacks. parent is the
// allocation root's attribute, as for AddTask.
func (s *Store) DropTask(id, name string, parent DirAttr) error {
	return s.dropLayers(id, "drop task", func(st *State) error {
		i := st.TaskIndex(name)
		if i < 0 {
			return fmt.Errorf("allocation %q has no task %q: %w", id, name, iofs.ErrNotExist)
		}
		st.Tasks = slices.Delete(st.Tasks, i, i+1)
		for _, v := range taskVolumes(name) {
			delete(st.Volumes, v.key)
		}
		st.Gone = slices.DeleteFunc(st.Gone, func(d string) bool { return strings.HasPrefix(d, name+"/") })
		st.Chroots = slices.DeleteFunc(st.Chroots, func(t string) bool { return t == name })
		stampDir(st, DirRoot, parent)
		return nil
	})
}

// dropLayers applies edit to a copy of allocation id's record, journals
// it, and removes the layers the old record named that nothing names any
// more.
func (s *Store) dropLayers(id, what string, edit func(*State) error) error {
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
	s.mu.Lock()
	owned := s.claimLocked(sortedKeys(before.layerIDs()))
	s.mu.Unlock()
	s.writeMu.Unlock()
	if _, err := s.removeClaimed(owned, "alloc_id", id, "reason", what); err != nil {
		return fmt.Errorf("%s of allocation %q done; its layers are left for the collector: %w", what, id, err)
	}
	return nil
}

// SetGone records that the layout directory dir of allocation id was
// removed through the mount (gone) or made again (not gone). parent, when
// set, is the allocation root's attribute, whose times a change of alloc/
// stamps; the directories of a task lie in its own volume's root.
func (s *Store) SetGone(id, dir string, gone bool, parent *DirAttr) (*State, error) {
	return s.Update(id, func(st *State) error {
		if err := st.validGone(dir); err != nil {
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
		if parent != nil && dir == DirShared {
			stampDir(st, DirRoot, *parent)
		}
		return nil
	})
}

// SetChroot records that Nomad builds a chroot in the directory of the
// task of allocation id: from then on it shows the node's chroot
// environment below its own layer.
func (s *Store) SetChroot(id, task string) (*State, error) {
	return s.Update(id, func(st *State) error {
		if st.TaskIndex(task) < 0 {
			return fmt.Errorf("no task %q: %w", task, iofs.ErrNotExist)
		}
		if !slices.Contains(st.Chroots, task) {
			st.Chroots = append(st.Chroots, task)
			slices.Sort(st.Chroots)
		}
		return nil
	})
}

// IsChroot reports whether the directory of task shows the node's chroot
// environment.
func (s *State) IsChroot(task string) bool { return slices.Contains(s.Chroots, task) }

// SetDirAttr applies change to the attribute of the skeleton directory
// dir (DirRoot, DirShared) of allocation id, starting from current (what
// the mount shows now) when the record has none yet.
func (s *Store) SetDirAttr(id, dir string, current DirAttr, change func(*DirAttr)) (*State, error) {
	return s.Update(id, func(st *State) error {
		if dir != DirRoot && dir != DirShared {
			return fmt.Errorf("%w: %q is not a skeleton directory", allocdir.ErrInvalidName, dir)
		}
		a := current
		if st.Dirs[dir] != nil {
			a = *st.Dirs[dir]
		}
		change(&a)
		if st.Dirs == nil {
			st.Dirs = make(map[string]*DirAttr)
		}
		st.Dirs[dir] = &a
		return nil
	})
}

// stampDir gives the skeleton directory dir of st the times a change of
// its entries stamps, starting from current when st has no attribute of
// it yet.
func stampDir(st *State, dir string, current DirAttr) {
	a := current
	if st.Dirs[dir] != nil {
		a = *st.Dirs[dir]
	}
	now := time.Now().UTC()
	a.Mtime, a.Ctime = now, now
	if st.Dirs == nil {
		st.Dirs = make(map[string]*DirAttr)
	}
	st.Dirs[dir] = &a
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
	case !next.hasVolumeSpec(key):
		return fmt.Errorf("allocation %q has no place for %q: %w", newID, key, iofs.ErrNotExist)
	}
	before := next.Clone()
	next.Volumes[key] = prev.Volumes[key]
	delete(prev.Volumes, key)
	prev.MigratedTo = newID
	next.Previous = prevID
	if err := s.change(&intent{Op: "remap", Records: map[string]*State{prevID: prev, newID: next}}); err != nil {
		return fmt.Errorf("failed to hand %q of %s to %s: %w", key, prevID, newID, err)
	}
	if old := before.Volumes[key]; old != nil {
		s.mu.Lock()
		owned := s.claimLocked(old.layers())
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
	return name == allocdir.TaskLocal && validTaskName(task) == nil
}
