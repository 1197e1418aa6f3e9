package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
)

// CreateOptions says what a new allocation starts with besides its tasks.
// The zero value is an allocation with the store's default limit whose
// volumes all start empty.
type CreateOptions struct {
	// Limit is the allocation's disk limit: its volumes' bytes count
	// against it, and a write past it fails with EDQUOT. Zero gives the
	// store's default (Options.DefaultLimit). A store whose data dir
	// cannot enforce a limit refuses one (ErrNoQuota).
	Limit record.Limit
	// Previous is the allocation whose data the new one takes, and
	// Migration how; either both are set or neither is.
	//
	// MigrationAdopt and MigrationSnapshot take it from a terminal
	// allocation of this store, as Migrate does, for alloc/data and the
	// local/ of each task both have; the previous allocation's change is
	// part of the intent that creates the new one. An adopt onto a limit
	// smaller than the data it takes over is carried out: the data is
	// the task's, and refusing would lose it for the new allocation,
	// which starts over its limit, gets EDQUOT for every write until it
	// deletes enough, and is logged with a warning.
	//
	// MigrationRemote takes it from Imported, what was received of
	// Previous, an allocation of another node.
	Previous  string
	Migration MigrationKind
	// Imported maps volume keys ("alloc/data", "<task>/local") to
	// directories inside the staging dir, fully received and checked:
	// the data of a MigrationRemote, and of nothing else. They are
	// synced, measured against the limit (ErrTooBig, with nothing
	// created, when they do not fit) and each becomes the volume's layer
	// by one rename. Keys for tasks the new allocation does not have are
	// left in staging; on failure the layers made of the others are
	// removed.
	Imported map[string]string
}

// ErrBadOptions: CreateOptions that contradict themselves, or a
// MigrationKind a call cannot carry out.
var ErrBadOptions = errors.New("invalid migration options")

// check refuses options that contradict themselves: the caller is
// mistaken, and guessing what it meant could lose data.
func (o CreateOptions) check() error {
	switch o.Migration {
	case "":
		if o.Previous != "" {
			return fmt.Errorf("%w: previous allocation %q, and no Migration says how its data comes", ErrBadOptions, o.Previous)
		}
		if o.Imported != nil {
			return fmt.Errorf("%w: imported directories without a %s migration", ErrBadOptions, MigrationRemote)
		}
		return nil
	case MigrationAdopt, MigrationSnapshot:
		if o.Imported != nil {
			return fmt.Errorf("%w: imported directories are a %s migration's, not %s", ErrBadOptions, MigrationRemote, o.Migration)
		}
	case MigrationRemote:
	default:
		return fmt.Errorf("%w: unknown migration %q", ErrBadOptions, o.Migration)
	}
	if o.Previous == "" {
		return fmt.Errorf("%w: a %s migration needs the previous allocation", ErrBadOptions, o.Migration)
	}
	return nil
}

// Create records a new allocation of tasks (at least one) with a fresh
// layer for each volume its previous allocation (opts) does not give it:
// alloc/data, alloc/logs and alloc/tmp, and each task's local/ and tmp/.
// It is one journaled intent, which changes the previous allocation's
// record too where it hands its data over: it either succeeds completely
// or leaves nothing behind (no layer, no state file, no entry, and the
// previous allocation as it was).
func (s *Store) Create(id string, tasks []allocdir.Task, opts CreateOptions) (_ *record.State, err error) {
	if err := opts.check(); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	if opts.Migration != "" {
		defer s.observeMigration(opts.Migration, time.Now(), &err)
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, ErrNoTasks)
	}
	return s.create(id, tasks, opts, nil)
}

// Build makes sure allocation id exists, creating it with its alloc-level
// volumes and no tasks if it does not: the allocdir contract builds an
// allocation before its tasks. An existing allocation is returned as is.
func (s *Store) Build(id string) (*record.State, error) {
	st, err := s.create(id, nil, CreateOptions{}, nil)
	if errors.Is(err, ErrExists) {
		return s.Get(id)
	}
	return st, err
}

// create makes every new allocation, Create's, Build's and
// CreateFromMount's (root set), after the checks all of them need: a
// valid ID the store does not hold, valid tasks, a limit the store can
// keep, and a previous allocation able to hand its data over.
func (s *Store) create(id string, tasks []allocdir.Task, opts CreateOptions, root *mountRoot) (*record.State, error) {
	st, err := s.newState(id, tasks)
	if err != nil {
		return nil, err
	}
	specs := st.VolumeSpecs()
	if root != nil {
		st.Origin = record.OriginMount
		root.apply(specs)
	}
	local := opts.Migration.local()
	var keys []string
	if local {
		if keys, err = allocdir.MigratedDirs(taskNames(tasks)); err != nil {
			return nil, err
		}
	}
	if opts.Migration == MigrationRemote {
		// Outside writeMu: the sync takes what the received data takes.
		if err := s.syncStaged(opts.Imported); err != nil {
			return nil, err
		}
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.absent(id); err != nil {
		return nil, err
	}
	var prev *record.State
	if local {
		if prev, err = s.previous(opts.Previous, id, true); err != nil {
			return nil, err
		}
	}
	if err := s.sizeNew(st, opts.Limit); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	in := &intent{Op: opts.Migration.op(), Records: map[string]*record.State{id: st}}
	// imported are the layers made of received trees; over, the fresh
	// ones a store with subvolumes stacks on them.
	var imported []string
	var over []freshLayer
	switch {
	case local:
		in.Records[prev.ID] = prev
		in.Fresh, _, err = s.handover(prev, st, keys, opts.Migration)
	case opts.Migration == MigrationRemote:
		imported, over, err = s.importInto(st, opts.Imported)
		in.Fresh = over
		st.Previous = opts.Previous
	}
	if err == nil {
		var fresh []freshLayer
		fresh, err = s.freshVolumes(st, specs)
		in.Fresh = append(in.Fresh, fresh...)
	}
	if err == nil {
		err = s.change(in)
	}
	if err != nil {
		err = errors.Join(err, s.removeFresh(in.Fresh), s.removeImported(imported))
		if local {
			return nil, fmt.Errorf("failed to hand %s's data to %s: %w", prev.ID, id, err)
		}
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	log := []any{"alloc_id", id, "tasks", len(tasks)}
	switch {
	case root != nil:
		log = append(log, "origin", record.OriginMount)
	case opts.Migration == MigrationRemote:
		log = append(log, "previous_alloc_id", opts.Previous, "op", in.Op, "imported_layers", len(imported)+len(over))
	case local:
		log = append(log, "previous_alloc_id", opts.Previous, "op", in.Op)
	}
	s.logger.Info("created allocation", log...)
	if local {
		s.warnOverLimit(id)
	}
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
	if err := s.commit("update", st); err != nil {
		return nil, fmt.Errorf("failed to update allocation %q: %w", id, err)
	}
	// Not st, which the store keeps, nor a copy taken before the change,
	// which lacks the tags it gave new layers: Get's, while writeMu holds.
	return s.Get(id)
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
