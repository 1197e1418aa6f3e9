package store

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// MigratedToName is the file a previous allocation shows, read-only, in
// each volume whose data was adopted by its replacement.
const MigratedToName = "MIGRATED-TO"

// Remap is the adopt migration: for every volume key (alloc/data,
// <task>/local) that prevID has, newID takes over prevID's layers, and
// prevID gets in their place a fresh read-only layer holding only a
// MIGRATED-TO file that says where the data went. No file is copied or
// moved. Both records change in one journaled intent, so a crash leaves
// the data with one of them, never with both; newID's own placeholders
// are removed afterwards. It returns how many volumes moved.
func (s *Store) Remap(prevID, newID string, keys []string) (int, error) {
	return s.migrate(prevID, newID, keys, false)
}

// Seal is the snapshot migration: for every volume key that prevID has,
// newID gets a fresh writable layer over prevID's layers, and prevID's
// volume is frozen read-only, so the previous allocation keeps a
// read-only view of its data and the new one copies a file up on its
// first write. Nothing is copied now, and both records change in one
// journaled intent. It returns how many volumes were sealed.
func (s *Store) Seal(prevID, newID string, keys []string) (int, error) {
	return s.migrate(prevID, newID, keys, true)
}

func (s *Store) migrate(prevID, newID string, keys []string, snapshot bool) (_ int, err error) {
	verb, op := "remap", "remap"
	if snapshot {
		verb, op = "seal", "seal"
	}
	defer s.observeMigration(migrationKind(snapshot), time.Now(), &err)
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	prev, next, err := s.migrationPair(prevID, newID)
	if err != nil {
		return 0, err
	}
	before := next.Clone()
	fresh, n, err := s.handover(prev, next, keys, snapshot)
	if err != nil || n == 0 {
		return 0, errors.Join(err, s.removeFresh(fresh))
	}
	if err := s.change(&intent{Op: op, Records: map[string]*record.State{prevID: prev, newID: next}, Fresh: fresh}); err != nil {
		return 0, fmt.Errorf("failed to %s %s into %s: %w", verb, prevID, newID, errors.Join(err, s.removeFresh(fresh)))
	}
	s.removePlaceholders(newID, before)
	return n, nil
}

// handover moves, in the copies prev and next, the volumes in keys that
// prev has: adopted (next takes prev's layers, prev gets a read-only
// MIGRATED-TO placeholder) or sealed (prev's volume is frozen and next
// stacks a fresh writable layer over it). It creates the layers this
// needs and returns them, and how many volumes moved; nothing is
// journaled yet, and on error the caller removes what was created.
func (s *Store) handover(prev, next *record.State, keys []string, snapshot bool) ([]freshLayer, int, error) {
	var specs []record.VolumeSpec
	for _, key := range keys {
		if _, ok := prev.Volumes[key]; !ok {
			continue
		}
		spec, ok := record.VolumeSpecOf(key)
		if !ok {
			return nil, 0, fmt.Errorf("failed to migrate %s into %s: %q is not a volume: %w", prev.ID, next.ID, key, allocdir.ErrInvalidName)
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return nil, 0, nil
	}
	note := fmt.Sprintf("this directory's data was adopted by allocation %s at %s\n", next.ID, time.Now().UTC().Format(time.RFC3339))
	var fresh []freshLayer
	for _, spec := range specs {
		pv := prev.Volumes[spec.Key]
		if snapshot {
			f, err := s.newLayer(spec.Mode, "")
			if err != nil {
				return fresh, 0, err
			}
			fresh = append(fresh, f)
			next.Volumes[spec.Key] = &record.Volume{Upper: f.ID, Lowers: pv.Layers()}
			pv.ReadOnly = true
			continue
		}
		f, err := s.newLayer(spec.Mode, note)
		if err != nil {
			return fresh, 0, err
		}
		fresh = append(fresh, f)
		next.Volumes[spec.Key] = &record.Volume{Upper: pv.Upper, Lowers: append([]string(nil), pv.Lowers...)}
		prev.Volumes[spec.Key] = &record.Volume{Upper: f.ID, ReadOnly: true}
	}
	prev.MigratedTo = next.ID
	next.Previous = prev.ID
	return fresh, len(specs), nil
}

// removePlaceholders removes the layers the record before a migration
// stacked and the migration replaced: the new allocation's own empty
// volumes. The caller holds writeMu; a layer that cannot be removed is
// left to the collector.
func (s *Store) removePlaceholders(id string, before *record.State) {
	s.mu.Lock()
	owned := s.claimLocked(sortedKeys(before.LayerIDs()))
	s.mu.Unlock()
	s.removeClaimed(owned, "alloc_id", id, "reason", "placeholder replaced by a migration")
}

// migrationPair returns copies of the two records of a migration. Whether
// the previous allocation must be terminal is the caller's policy: the
// allocdir contract's Move does not ask.
func (s *Store) migrationPair(prevID, newID string) (prev, next *record.State, err error) {
	if prevID == newID {
		return nil, nil, fmt.Errorf("failed to migrate %s onto itself: %w", prevID, allocdir.ErrInvalidName)
	}
	if prev, err = s.Get(prevID); err != nil {
		return nil, nil, err
	}
	if next, err = s.Get(newID); err != nil {
		return nil, nil, err
	}
	if err := migratable(prev, false); err != nil {
		return nil, nil, fmt.Errorf("failed to migrate %s into %s: %w", prevID, newID, err)
	}
	return prev, next, nil
}

// migratable checks that prev can hand its data over: not already handed
// (its volumes are placeholders, or frozen layers another allocation
// stacks on: handing them over again would make them writable under
// both), and terminal when the caller's policy asks.
func migratable(prev *record.State, mustBeTerminal bool) error {
	if prev.MigratedTo != "" {
		return fmt.Errorf("previous allocation %q already handed its data to %q: %w", prev.ID, prev.MigratedTo, ErrExists)
	}
	if mustBeTerminal && prev.Status != record.StatusTerminal {
		return &stateError{msg: fmt.Sprintf("previous allocation %q is %s: stop it first (allocfs alloc stop %s)", prev.ID, prev.Status, prev.ID), kind: ErrNotTerminal}
	}
	return nil
}

// Stop makes an allocation terminal: kept, browsable, its logs readable,
// and eligible for garbage collection. Stopping a stopped allocation
// changes nothing.
func (s *Store) Stop(id string) (*record.State, error) {
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	if st.Status == record.StatusTerminal {
		return st, nil
	}
	return s.Update(id, func(st *record.State) error {
		st.Status = record.StatusTerminal
		st.Stopped = time.Now().UTC()
		return nil
	})
}

// CreateMigrated creates allocation id and hands it prevID's data
// (alloc/data and the local/ of each task both have) by Seal when
// snapshot is set, by Remap otherwise. The previous allocation must be
// terminal. The new record and the previous one's change are one
// journaled intent: either both happen or neither does. It returns the
// new record and how many volumes were handed over.
func (s *Store) CreateMigrated(id string, tasks []allocdir.Task, prevID string, snapshot bool) (*record.State, int, error) {
	return s.CreateMigratedSized(id, tasks, prevID, snapshot, record.Limit{})
}

// CreateMigratedSized is CreateMigrated of an allocation with disk limit
// lim (the store's default when zero). An adopt onto a limit smaller
// than the data it takes over is carried out: the data is the task's,
// and refusing the remap would lose it for the new allocation; the new
// allocation starts over its limit, every write gets EDQUOT until it
// deletes enough, and the store logs a warning saying so.
func (s *Store) CreateMigratedSized(id string, tasks []allocdir.Task, prevID string, snapshot bool, lim record.Limit) (_ *record.State, _ int, err error) {
	defer s.observeMigration(migrationKind(snapshot), time.Now(), &err)
	if len(tasks) == 0 {
		return nil, 0, fmt.Errorf("failed to create allocation %q: %w", id, ErrNoTasks)
	}
	next, err := s.newState(id, tasks)
	if err != nil {
		return nil, 0, err
	}
	names := make([]string, 0, len(tasks))
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	keys, err := allocdir.MigratedDirs(names)
	if err != nil {
		return nil, 0, err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.absent(id); err != nil {
		return nil, 0, err
	}
	prev, err := s.Get(prevID)
	if err != nil {
		return nil, 0, fmt.Errorf("previous allocation: %w", err)
	}
	if err := migratable(prev, true); err != nil {
		return nil, 0, err
	}
	if err := s.sizeNew(next, lim); err != nil {
		return nil, 0, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	fresh, n, err := s.handover(prev, next, keys, snapshot)
	if err == nil {
		var own []freshLayer
		own, err = s.freshVolumes(next)
		fresh = append(fresh, own...)
	}
	op := "remap"
	if snapshot {
		op = "seal"
	}
	if err == nil {
		err = s.change(&intent{Op: op, Records: map[string]*record.State{prevID: prev, id: next}, Fresh: fresh})
	}
	if err != nil {
		return nil, 0, fmt.Errorf("failed to hand %s's data to %s: %w", prevID, id, errors.Join(err, s.removeFresh(fresh)))
	}
	s.logger.Info("created allocation", "alloc_id", id, "tasks", len(tasks), "previous_alloc_id", prevID, "op", op)
	s.warnOverLimit(id)
	st, err := s.Get(id)
	return st, n, err
}

// CreateImported creates allocation id with the volumes in dirs ("alloc/data"
// or "<task>/local" to a directory inside the staging dir, fully received
// and checked) as their upper layers: the remote migration's final step.
// The received files are synced, each directory becomes a layer by one
// rename, and the record naming them is one journaled intent. Keys for
// tasks the new allocation does not have are left in staging. On failure
// nothing is created and the received layers are removed.
func (s *Store) CreateImported(id string, tasks []allocdir.Task, prevID string, dirs map[string]string) (*record.State, error) {
	return s.CreateImportedSized(id, tasks, prevID, dirs, record.Limit{})
}

// CreateImportedSized is CreateImported of an allocation with disk limit
// lim (the store's default when zero). What was received is measured
// before it becomes layers, and an allocation it does not fit in is
// refused (ErrTooBig) with nothing created.
func (s *Store) CreateImportedSized(id string, tasks []allocdir.Task, prevID string, dirs map[string]string, lim record.Limit) (_ *record.State, err error) {
	defer s.observeMigration(MigrationRemote, time.Now(), &err)
	if len(tasks) == 0 {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, ErrNoTasks)
	}
	st, err := s.newState(id, tasks)
	if err != nil {
		return nil, err
	}
	for _, dir := range dirs {
		if err := s.checkStaged(dir); err != nil {
			return nil, err
		}
	}
	// What a record names must be on disk first: the received files'
	// data and names. One syncfs costs what the `sync` after a
	// `tar -x` costs, and less than an fsync of every file.
	if len(dirs) > 0 {
		if err := s.disk.Syncfs(s.StagingDir()); err != nil {
			return nil, fmt.Errorf("failed to sync the received snapshot: %w", err)
		}
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.absent(id); err != nil {
		return nil, err
	}
	if err := s.sizeNew(st, lim); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	if err := s.fitsImport(st, dirs); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	var imported []string
	// over are the fresh uppers stacked over received trees on a store
	// with quotas.
	var over []freshLayer
	fail := func(err error) (*record.State, error) {
		var errs []error
		for _, l := range imported {
			if rerr := s.disk.RemoveAll(s.LayerPath(l)); rerr != nil {
				errs = append(errs, rerr)
			}
		}
		return nil, errors.Join(append([]error{err}, errs...)...)
	}
	for _, key := range sortedKeys(keySet(dirs)) {
		if _, ok := record.VolumeSpecOf(key); !ok || !st.HasVolumeSpec(key) {
			continue
		}
		l, err := s.importLocked(dirs[key])
		if err != nil {
			return fail(err)
		}
		imported = append(imported, l)
		st.Volumes[key] = &record.Volume{Upper: l}
		if s.quota != nil && s.quota.Subvolumes() {
			// A received tree is a plain directory, which no qgroup
			// counts: it becomes the lower of a fresh subvolume that
			// takes the writes (and the copy-ups, whose clones it
			// references), so nothing written later escapes the limit.
			spec, _ := record.VolumeSpecOf(key)
			f, err := s.newLayer(spec.Mode, "")
			if err != nil {
				return fail(err)
			}
			imported = append(imported, f.ID)
			over = append(over, f)
			st.Volumes[key] = &record.Volume{Upper: f.ID, Lowers: []string{l}}
		}
	}
	if len(imported) > 0 {
		if err := s.disk.Fsync(s.layersDir()); err != nil {
			return fail(fmt.Errorf("failed to sync layers: %w", err))
		}
	}
	st.Previous = prevID
	fresh, err := s.freshVolumes(st)
	if err == nil {
		err = s.change(&intent{Op: "import", Records: map[string]*record.State{id: st}, Fresh: append(fresh, over...)})
	}
	if err != nil {
		return fail(fmt.Errorf("failed to create allocation %q: %w", id, errors.Join(err, s.removeFresh(fresh))))
	}
	s.logger.Info("created allocation", "alloc_id", id, "tasks", len(tasks), "previous_alloc_id", prevID, "op", "import", "imported_layers", len(imported))
	return s.Get(id)
}

// migrationKind names the local migration Remap (adopt) or Seal
// (snapshot) makes.
func migrationKind(snapshot bool) MigrationKind {
	if snapshot {
		return MigrationSnapshot
	}
	return MigrationAdopt
}

// observeMigration tells the observer of a migration that started at
// start and ended with *err; deferred, it sees the error returned.
func (s *Store) observeMigration(kind MigrationKind, start time.Time, err *error) {
	s.obs.Migrated(kind, time.Since(start), *err)
}

// newState returns the record of a new running allocation with no volumes
// yet, after checking its ID and tasks.
func (s *Store) newState(id string, tasks []allocdir.Task) (*record.State, error) {
	if err := record.ValidAllocID(id); err != nil {
		return nil, err
	}
	if err := record.ValidTasks(tasks); err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	gen, err := randomGen()
	if err != nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", id, err)
	}
	return &record.State{
		ID:      id,
		Tasks:   append([]allocdir.Task(nil), tasks...),
		Status:  record.StatusRunning,
		Created: time.Now().UTC().Round(0),
		Volumes: make(map[string]*record.Volume),
		Gen:     gen,
	}, nil
}

// absent fails with ErrExists if the store holds id. The caller holds
// writeMu, so the answer holds until it releases it.
func (s *Store) absent(id string) error {
	s.mu.RLock()
	_, exists := s.allocs[id]
	s.mu.RUnlock()
	if exists {
		return fmt.Errorf("failed to create allocation %q: %w", id, ErrExists)
	}
	return nil
}

// freshVolumes gives every volume st's tasks call for and it lacks a
// fresh layer, and returns them.
func (s *Store) freshVolumes(st *record.State) ([]freshLayer, error) {
	return s.freshVolumesOf(st, st.VolumeSpecs())
}

// freshVolumesOf gives every volume of specs that st lacks a fresh layer,
// and returns them.
func (s *Store) freshVolumesOf(st *record.State, specs []record.VolumeSpec) ([]freshLayer, error) {
	var fresh []freshLayer
	for _, spec := range specs {
		if st.Volumes[spec.Key] != nil {
			continue
		}
		f, err := s.specLayer(spec)
		if err != nil {
			return fresh, fmt.Errorf("failed to create layer for %s: %w", spec.Key, err)
		}
		fresh = append(fresh, f)
		st.Volumes[spec.Key] = &record.Volume{Upper: f.ID}
	}
	return fresh, nil
}

// checkStaged checks that dir lies inside the staging dir.
func (s *Store) checkStaged(dir string) error {
	rel, err := filepath.Rel(s.StagingDir(), dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return fmt.Errorf("cannot import %q: not inside the staging dir %q: %w", dir, s.StagingDir(), allocdir.ErrInvalidName)
	}
	return nil
}

// importLocked turns dir, a directory inside the staging dir whose content
// is durable, into a new layer by renaming it into layers/, and returns
// the layer's ID. The caller holds writeMu and journals a record naming
// the layer before it releases it; until then the layer is an orphan to
// anyone else.
func (s *Store) importLocked(dir string) (string, error) {
	if err := s.checkStaged(dir); err != nil {
		return "", err
	}
	for range 8 {
		id, err := newLayerID()
		if err != nil {
			return "", err
		}
		err = s.disk.Rename(dir, s.LayerPath(id), unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("failed to import %q as a layer: %w", dir, err)
		}
		return id, nil
	}
	return "", errors.New("failed to find an unused layer ID")
}

func keySet(m map[string]string) map[string]struct{} {
	out := make(map[string]struct{}, len(m))
	for k := range m {
		out[k] = struct{}{}
	}
	return out
}

// randomGen is a generation (record.State.Gen, record.Volume.Gen):
// random, never 0.
func randomGen() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("failed to draw a generation: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1, nil
}
