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

// Migrate hands the data of allocation prevID to newID, both in the
// store, in every volume of keys (alloc/data, <task>/local) that prevID
// has, as kind says:
//
//   - MigrationAdopt (remap): newID takes over prevID's layers, and
//     prevID gets in their place a fresh read-only layer holding only a
//     MIGRATED-TO file that says where the data went. No file is copied
//     or moved.
//   - MigrationSnapshot (seal): newID gets a fresh writable layer over
//     prevID's layers, and prevID's volume is frozen read-only, so the
//     previous allocation keeps a read-only view of its data and the new
//     one copies a file up on its first write. Nothing is copied now.
//
// Both records change in one journaled intent, so a crash leaves the
// data with one of them, never writable under both; newID's own
// placeholders are removed afterwards. Whether prevID must be terminal is
// the caller's policy: the allocdir contract's Move does not ask. It
// returns how many volumes moved; when prevID has none of keys, nothing
// changes.
func (s *Store) Migrate(prevID, newID string, keys []string, kind MigrationKind) (_ int, err error) {
	if !kind.local() {
		return 0, fmt.Errorf("failed to migrate %s into %s: %w: %q is no migration between allocations of one store", prevID, newID, ErrBadOptions, kind)
	}
	defer s.observeMigration(kind, time.Now(), &err)
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	prev, err := s.previous(prevID, newID, false)
	if err != nil {
		return 0, fmt.Errorf("failed to migrate %s into %s: %w", prevID, newID, err)
	}
	next, err := s.Get(newID)
	if err != nil {
		return 0, err
	}
	before := next.Clone()
	fresh, n, err := s.handover(prev, next, keys, kind)
	if err != nil || n == 0 {
		return 0, errors.Join(err, s.removeFresh(fresh))
	}
	if err := s.change(&intent{Op: kind.op(), Records: map[string]*record.State{prevID: prev, newID: next}, Fresh: fresh}); err != nil {
		return 0, fmt.Errorf("failed to %s %s into %s: %w", kind.op(), prevID, newID, errors.Join(err, s.removeFresh(fresh)))
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
func (s *Store) handover(prev, next *record.State, keys []string, kind MigrationKind) ([]freshLayer, int, error) {
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
		if kind == MigrationSnapshot {
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

// previous returns a copy of the record of prevID, which is to hand its
// data to newID, after the checks every local migration makes: another
// allocation, present, that has not handed its data over already, and
// terminal when the caller's policy asks. The caller holds writeMu.
func (s *Store) previous(prevID, newID string, mustBeTerminal bool) (*record.State, error) {
	if prevID == newID {
		return nil, fmt.Errorf("allocation %q cannot take its own data: %w", prevID, allocdir.ErrInvalidName)
	}
	prev, err := s.Get(prevID)
	if err != nil {
		return nil, fmt.Errorf("previous allocation: %w", err)
	}
	if err := migratable(prev, mustBeTerminal); err != nil {
		return nil, err
	}
	return prev, nil
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

// local reports whether kind is a migration between two allocations of
// the store.
func (k MigrationKind) local() bool { return k == MigrationAdopt || k == MigrationSnapshot }

// op names the journal's intent of a creation that migrates as k does.
func (k MigrationKind) op() string {
	switch k {
	case MigrationAdopt:
		return "remap"
	case MigrationSnapshot:
		return "seal"
	case MigrationRemote:
		return "import"
	}
	return "create"
}

// syncStaged checks that every directory of dirs lies inside the staging
// dir and makes their content durable: what a record names must be on
// disk first, the received files' data and names. One syncfs costs what
// the `sync` after a `tar -x` costs, and less than an fsync of every
// file.
func (s *Store) syncStaged(dirs map[string]string) error {
	for _, dir := range dirs {
		if err := s.checkStaged(dir); err != nil {
			return err
		}
	}
	if len(dirs) == 0 {
		return nil
	}
	if err := s.disk.Syncfs(s.StagingDir()); err != nil {
		return fmt.Errorf("failed to sync the received snapshot: %w", err)
	}
	return nil
}

// importInto makes the received directories of dirs whose keys are
// volumes of st the upper layers of those volumes, once it has checked
// that they fit st's limit. It returns the layers made of them and the
// fresh layers it stacked over them; on error the caller removes both.
// Nothing is journaled yet. The caller holds writeMu.
func (s *Store) importInto(st *record.State, dirs map[string]string) (imported []string, over []freshLayer, err error) {
	if err := s.fitsImport(st, dirs); err != nil {
		return nil, nil, err
	}
	for _, key := range sortedKeys(keySet(dirs)) {
		spec, ok := record.VolumeSpecOf(key)
		if !ok || !st.HasVolumeSpec(key) {
			continue
		}
		l, err := s.importLocked(dirs[key])
		if err != nil {
			return imported, over, err
		}
		imported = append(imported, l)
		st.Volumes[key] = &record.Volume{Upper: l}
		if s.quota != nil && s.quota.Subvolumes() {
			// A received tree is a plain directory, which no qgroup
			// counts: it becomes the lower of a fresh subvolume that
			// takes the writes (and the copy-ups, whose clones it
			// references), so nothing written later escapes the limit.
			f, err := s.newLayer(spec.Mode, "")
			if err != nil {
				return imported, over, err
			}
			over = append(over, f)
			st.Volumes[key] = &record.Volume{Upper: f.ID, Lowers: []string{l}}
		}
	}
	if len(imported) > 0 {
		if err := s.disk.Fsync(s.layersDir()); err != nil {
			return imported, over, fmt.Errorf("failed to sync layers: %w", err)
		}
	}
	return imported, over, nil
}

// removeImported removes the layers a failed creation made of received
// directories: no record names them.
func (s *Store) removeImported(layers []string) error {
	var errs []error
	for _, l := range layers {
		if err := s.disk.RemoveAll(s.LayerPath(l)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// taskNames returns the names of tasks.
func taskNames(tasks []allocdir.Task) []string {
	names := make([]string, 0, len(tasks))
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	return names
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

// freshVolumes gives every volume of specs that st lacks a fresh layer,
// and returns them.
func (s *Store) freshVolumes(st *record.State, specs []record.VolumeSpec) ([]freshLayer, error) {
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
