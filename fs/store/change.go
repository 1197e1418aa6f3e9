package store

import (
	"errors"
	"fmt"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
)

// Create records a new allocation with one fresh layer per volume:
// alloc/data, alloc/logs and alloc/tmp, and each task's local/ and tmp/.
// It either succeeds completely or leaves nothing behind: no layer, no
// state file, no entry.
func (s *Store) Create(id string, tasks []allocdir.Task) (*record.State, error) {
	if len(tasks) == 0 {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, ErrNoTasks)
	}
	return s.create(id, tasks, record.Limit{})
}

// CreateSized is Create of an allocation with disk limit lim: its
// volumes' bytes count against it, and a write past it fails with
// EDQUOT. A zero lim gives the store's default (Options.DefaultLimit).
// A store whose data dir cannot enforce a limit refuses one
// (ErrNoQuota).
func (s *Store) CreateSized(id string, tasks []allocdir.Task, lim record.Limit) (*record.State, error) {
	if len(tasks) == 0 {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, ErrNoTasks)
	}
	return s.create(id, tasks, lim)
}

// Build makes sure allocation id exists, creating it with its alloc-level
// volumes and no tasks if it does not: the allocdir contract builds an
// allocation before its tasks. An existing allocation is returned as is.
func (s *Store) Build(id string) (*record.State, error) {
	st, err := s.create(id, nil, record.Limit{})
	if errors.Is(err, ErrExists) {
		return s.Get(id)
	}
	return st, err
}

func (s *Store) create(id string, tasks []allocdir.Task, lim record.Limit) (*record.State, error) {
	st, err := s.newState(id, tasks)
	if err != nil {
		return nil, err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.absent(id); err != nil {
		return nil, err
	}
	if err := s.sizeNew(st, lim); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	fresh, err := s.freshVolumes(st)
	if err == nil {
		err = s.change(&intent{Op: "create", Records: map[string]*record.State{id: st}, Fresh: fresh})
	}
	if err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, errors.Join(err, s.removeFresh(fresh)))
	}
	s.logger.Info("created allocation", "alloc_id", id, "tasks", len(tasks))
	return s.Get(id)
}

// EnsureTask adds task to an existing allocation, with fresh layers for
// its local/ and tmp/, or updates the secrets size and user of a task it
// already has. Adding a task that is there already is not an error:
// drivers register tasks again after a restart.
func (s *Store) EnsureTask(id string, task allocdir.Task) (*record.State, error) {
	if err := record.ValidTaskName(task.Name); err != nil {
		return nil, fmt.Errorf("failed to add task to allocation %q: %w", id, err)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	// Get's copy is current: every change holds writeMu.
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	changed := false
	if i := st.TaskIndex(task.Name); i < 0 {
		st.Tasks = append(st.Tasks, task)
		changed = true
	} else if st.Tasks[i].SecretsMB != task.SecretsMB || st.Tasks[i].User != task.User {
		st.Tasks[i].SecretsMB = task.SecretsMB
		st.Tasks[i].User = task.User
		changed = true
	}
	// A volume may be missing for a task that is already recorded, if a
	// record was edited by hand: give it a fresh layer rather than fail.
	var specs []record.VolumeSpec
	for _, v := range record.TaskVolumes(task.Name) {
		if st.Volumes[v.Key] == nil {
			specs = append(specs, v)
		}
	}
	if !changed && len(specs) == 0 {
		return st, nil
	}
	if err := s.commitWithLayers("update", st, specs); err != nil {
		return nil, fmt.Errorf("failed to add task %q to allocation %q: %w", task.Name, id, err)
	}
	s.logger.Debug("ensured task", "alloc_id", id, "task", task.Name)
	return s.Get(id)
}

// commitWithLayers creates a fresh upper layer for each spec, records them
// in st, and journals st as one change. On failure it removes the layers
// it created and leaves the store as it was. The caller holds writeMu.
func (s *Store) commitWithLayers(op string, st *record.State, specs []record.VolumeSpec) (err error) {
	var fresh []freshLayer
	defer func() {
		if err != nil {
			err = errors.Join(err, s.removeFresh(fresh))
		}
	}()
	for _, spec := range specs {
		f, err := s.specLayer(spec)
		if err != nil {
			return fmt.Errorf("failed to create layer for %s: %w", spec.Key, err)
		}
		fresh = append(fresh, f)
		st.Volumes[spec.Key] = &record.Volume{Upper: f.ID, Gen: spec.Gen}
	}
	return s.change(&intent{Op: op, Records: map[string]*record.State{st.ID: st}, Fresh: fresh})
}

// commit journals st as the new record of its allocation. The caller holds
// writeMu and no longer touches st.
func (s *Store) commit(op string, st *record.State) error {
	return s.change(&intent{Op: op, Records: map[string]*record.State{st.ID: st}})
}

// Update applies fn to a copy of the record of id and, if fn returns nil
// and the result is valid, writes it and makes it the current record. If
// fn fails, or the write does (a full disk), nothing changes, on disk or
// in memory. Every layer the result references must exist under layers/.
//
// fn runs while other changes wait, so it must be quick and must not call
// Create, EnsureTask, Update or Destroy (Get and List are fine).
func (s *Store) Update(id string, fn func(*record.State) error) (*record.State, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	edit, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	if err := fn(edit); err != nil {
		return nil, fmt.Errorf("failed to update allocation %q: %w", id, err)
	}
	// fn may have kept a reference to edit: record a copy of its own.
	st := edit.Clone()
	if st.ID != id {
		return nil, fmt.Errorf("failed to update allocation %q: the ID cannot change (got %q)", id, st.ID)
	}
	st.Normalize()
	if err := st.Validate(); err != nil {
		return nil, fmt.Errorf("failed to update allocation %q: %w", id, err)
	}
	for _, l := range sortedKeys(st.LayerIDs()) {
		s.mu.RLock()
		_, dying := s.dying[l]
		s.mu.RUnlock()
		if dying {
			return nil, fmt.Errorf("failed to update allocation %q: layer %s is being removed", id, l)
		}
		if err := s.checkLayer(l); err != nil {
			return nil, fmt.Errorf("failed to update allocation %q: layer %s: %w", id, l, err)
		}
	}
	// The record journaled is not handed out again: return a copy.
	out := st.Clone()
	if err := s.commit("update", st); err != nil {
		return nil, fmt.Errorf("failed to update allocation %q: %w", id, err)
	}
	return out, nil
}

// Destroy removes an allocation and every layer it references that no
// other allocation does. Its record goes in one journaled intent; from
// then on the layers only it named are orphans, which Destroy removes at
// once. Every removal is attempted and all failures are returned
// together; a layer that could not be removed, or that a crash stopped
// Destroy from removing, is removed by the next sweep of the collector.
func (s *Store) Destroy(id string) error {
	s.writeMu.Lock()
	s.mu.RLock()
	st, err := s.lookup(id)
	pins := s.pins[id]
	s.mu.RUnlock()
	if err != nil {
		s.writeMu.Unlock()
		return err
	}
	if pins > 0 {
		s.writeMu.Unlock()
		return fmt.Errorf("failed to destroy allocation %q (%d readers): %w", id, pins, ErrPinned)
	}
	if err := s.change(&intent{Op: "destroy", Records: map[string]*record.State{id: nil}}); err != nil {
		s.writeMu.Unlock()
		return fmt.Errorf("failed to destroy allocation %q: %w", id, err)
	}
	s.mu.Lock()
	owned := s.claimLocked(sortedKeys(st.AllLayerIDs()))
	s.mu.Unlock()
	// Others may change the store while the trees are deleted: the layers
	// are no longer referenced and dying keeps them from being reused.
	s.writeMu.Unlock()

	removed, err := s.removeClaimed(owned, "alloc_id", id)
	s.logger.Info("destroyed allocation", "alloc_id", id, "layers_removed", removed)
	if err != nil {
		return fmt.Errorf("allocation %q destroyed; its layers are left for the collector: %w", id, err)
	}
	return nil
}

// Pin keeps allocation id from being destroyed until the returned func
// is called: a migration streaming its snapshot holds one.
func (s *Store) Pin(id string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.lookup(id); err != nil {
		return nil, err
	}
	s.pins[id]++
	released := false
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if released {
			return
		}
		released = true
		if s.pins[id]--; s.pins[id] <= 0 {
			delete(s.pins, id)
		}
	}, nil
}

// Pinned reports whether something that must finish first (a migration
// streaming a snapshot) keeps allocation id from being destroyed.
func (s *Store) Pinned(id string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.pins[id] > 0
}
