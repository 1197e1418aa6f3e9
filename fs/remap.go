package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// MigratedToName is the file a previous allocation shows, read-only, in
// each volume whose data was adopted by its replacement.
const MigratedToName = "MIGRATED-TO"

// Remap is the adopt migration: for every volume key (alloc/data,
// <task>/local) that prevID has, newID takes over prevID's layers, and
// prevID gets in their place a fresh read-only layer holding only a
// MIGRATED-TO file that says where the data went. No file is copied or
// moved; only the two records change. It returns how many volumes moved.
//
// Crash safety: the new allocation's record is written first, so after a
// crash between the two writes both records name the migrated layers and
// nothing is lost (Destroy only removes layers no other allocation
// references). newID's own empty placeholders are removed last, and only
// if still empty.
func (s *Store) Remap(prevID, newID string, keys []string) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	prev, next, err := s.migrationPair(prevID, newID)
	if err != nil {
		return 0, err
	}
	var specs []volumeSpec
	var placeholders []string
	for _, key := range keys {
		pv, ok := prev.Volumes[key]
		if !ok {
			continue
		}
		spec, ok := volumeSpecOf(key)
		if !ok {
			return 0, fmt.Errorf("failed to remap %s into %s: %q is not a volume: %w", prevID, newID, key, allocdir.ErrInvalidName)
		}
		if nv := next.Volumes[key]; nv != nil {
			placeholders = append(placeholders, nv.layers()...)
		}
		next.Volumes[key] = &Volume{Upper: pv.Upper, Lowers: append([]string(nil), pv.Lowers...)}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return 0, nil
	}
	next.Previous = prevID
	if err := next.validate(); err != nil {
		return 0, fmt.Errorf("failed to remap %s into %s: %w", prevID, newID, err)
	}
	if err := s.commit(next); err != nil {
		return 0, fmt.Errorf("failed to remap %s into %s: %w", prevID, newID, err)
	}
	created, err := s.markerLayers(specs, newID)
	if err == nil {
		for i, spec := range specs {
			prev.Volumes[spec.key] = &Volume{Upper: created[i], ReadOnly: true}
		}
		prev.MigratedTo = newID
		err = s.commit(prev)
	}
	if err != nil {
		// Both records name the layers now; the previous allocation keeps
		// showing them until it is collected.
		return len(specs), fmt.Errorf("remapped into %s, but failed to give %s its placeholders: %w", newID, prevID, errors.Join(err, s.removeFresh(created)))
	}
	s.removeIfEmpty(newID, placeholders)
	return len(specs), nil
}

// Seal is the snapshot migration: for every volume key that prevID has,
// newID gets a fresh writable layer over prevID's layers, and prevID's
// volume is frozen read-only, so the previous allocation keeps a
// read-only view of its data and the new one copies a file up on its
// first write. Nothing is copied now. It returns how many volumes were
// sealed.
//
// Crash safety: the previous allocation is frozen first; a crash before
// the new record is written leaves the data where it was, read-only.
func (s *Store) Seal(prevID, newID string, keys []string) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	prev, next, err := s.migrationPair(prevID, newID)
	if err != nil {
		return 0, err
	}
	var specs []volumeSpec
	for _, key := range keys {
		if _, ok := prev.Volumes[key]; !ok {
			continue
		}
		spec, ok := volumeSpecOf(key)
		if !ok {
			return 0, fmt.Errorf("failed to seal %s under %s: %q is not a volume: %w", prevID, newID, key, allocdir.ErrInvalidName)
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return 0, nil
	}
	var placeholders []string
	for _, spec := range specs {
		prev.Volumes[spec.key].ReadOnly = true
	}
	prev.MigratedTo = newID
	if err := s.commit(prev); err != nil {
		return 0, fmt.Errorf("failed to freeze %s: %w", prevID, err)
	}
	created := make([]string, 0, len(specs))
	for _, spec := range specs {
		l, err := s.newLayer(spec.mode)
		if err != nil {
			return 0, fmt.Errorf("failed to seal %s under %s: %w", prevID, newID, errors.Join(err, s.removeFresh(created)))
		}
		created = append(created, l)
		pv := prev.Volumes[spec.key]
		if nv := next.Volumes[spec.key]; nv != nil {
			placeholders = append(placeholders, nv.layers()...)
		}
		next.Volumes[spec.key] = &Volume{Upper: l, Lowers: pv.layers()}
	}
	next.Previous = prevID
	if err := syncDir(filepath.Join(s.dataDir, layersDirName)); err != nil {
		return 0, fmt.Errorf("failed to sync layers: %w", errors.Join(err, s.removeFresh(created)))
	}
	if err := s.commit(next); err != nil {
		return 0, fmt.Errorf("failed to seal %s under %s: %w", prevID, newID, errors.Join(err, s.removeFresh(created)))
	}
	s.removeIfEmpty(newID, placeholders)
	return len(specs), nil
}

// migrationPair returns copies of the two records of a migration. Whether
// the previous allocation must be terminal is the caller's policy: the
// allocdir contract's Move does not ask.
func (s *Store) migrationPair(prevID, newID string) (prev, next *State, err error) {
	if prevID == newID {
		return nil, nil, fmt.Errorf("failed to migrate %s onto itself: %w", prevID, allocdir.ErrInvalidName)
	}
	if prev, err = s.Get(prevID); err != nil {
		return nil, nil, err
	}
	if next, err = s.Get(newID); err != nil {
		return nil, nil, err
	}
	if prev.MigratedTo != "" {
		// Its volumes are placeholders or frozen layers another
		// allocation stacks on: handing them over again would make them
		// writable under both.
		return nil, nil, fmt.Errorf("failed to migrate %s into %s: its data already went to %s: %w", prevID, newID, prev.MigratedTo, ErrExists)
	}
	return prev, next, nil
}

// markerLayers creates one read-only placeholder layer per spec, holding
// a MIGRATED-TO file that names the allocation the data went to.
func (s *Store) markerLayers(specs []volumeSpec, newID string) ([]string, error) {
	var created []string
	note := fmt.Sprintf("this directory's data was adopted by allocation %s at %s\n", newID, time.Now().UTC().Format(time.RFC3339))
	for _, spec := range specs {
		l, err := s.newLayer(spec.mode)
		if err != nil {
			return created, err
		}
		created = append(created, l)
		if err := os.WriteFile(filepath.Join(s.LayerPath(l), MigratedToName), []byte(note), 0o444); err != nil {
			return created, err
		}
	}
	return created, syncDir(filepath.Join(s.dataDir, layersDirName))
}

// removeIfEmpty removes placeholder layers that nothing references and
// nobody wrote into; one with content is kept for GC rather than deleted.
func (s *Store) removeIfEmpty(owner string, layers []string) {
	for _, l := range layers {
		s.mu.RLock()
		used := s.referencedLocked(l)
		s.mu.RUnlock()
		if used {
			continue
		}
		if err := os.Remove(s.LayerPath(l)); err != nil && !os.IsNotExist(err) {
			s.logger.Warn("placeholder layer kept", "layer", l, "alloc_id", owner, "error", err)
		}
	}
}

// Stop makes an allocation terminal: kept, browsable, its logs readable,
// and eligible for garbage collection. Stopping a stopped allocation
// changes nothing.
func (s *Store) Stop(id string) (*State, error) {
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	if st.Status == StatusTerminal {
		return st, nil
	}
	return s.Update(id, func(st *State) error {
		st.Status = StatusTerminal
		st.Stopped = time.Now().UTC()
		return nil
	})
}

// CreateMigrated creates allocation id and hands it prevID's data
// (alloc/data and the local/ of each task both have) by Seal when
// snapshot is set, by Remap otherwise. The previous allocation must be
// terminal. Either everything happens or nothing does: when the handover
// fails, the new allocation is destroyed again and the error says why.
// It returns the new record and how many volumes were handed over.
func (s *Store) CreateMigrated(id string, tasks []allocdir.Task, prevID string, snapshot bool) (*State, int, error) {
	prev, err := s.Get(prevID)
	if err != nil {
		return nil, 0, fmt.Errorf("previous allocation: %w", err)
	}
	if prev.Status != StatusTerminal {
		return nil, 0, fmt.Errorf("previous allocation %s is %s: stop it first (allocfs alloc stop %s): %w", prevID, prev.Status, prevID, ErrNotTerminal)
	}
	if prev.MigratedTo != "" {
		return nil, 0, fmt.Errorf("previous allocation %s already handed its data to %s: %w", prevID, prev.MigratedTo, ErrExists)
	}
	if _, err := s.Create(id, tasks); err != nil {
		return nil, 0, err
	}
	names := make([]string, 0, len(tasks))
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	keys, err := allocdir.MigratedDirs(names)
	if err != nil {
		return nil, 0, errors.Join(err, s.Destroy(id))
	}
	var n int
	if snapshot {
		n, err = s.Seal(prevID, id, keys)
	} else {
		n, err = s.Remap(prevID, id, keys)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("failed to hand %s's data to %s: %w", prevID, id, errors.Join(err, s.Destroy(id)))
	}
	st, err := s.Get(id)
	if err != nil {
		return nil, 0, err
	}
	return st, n, nil
}

// CreateImported creates allocation id with the volumes in dirs ("alloc/data"
// or "<task>/local" to a directory inside the staging dir, fully received
// and checked) as their upper layers, each moved into layers/ by one
// rename: the remote migration's final step. Keys for tasks the new
// allocation does not have are left in staging. Nothing is left half
// done: on failure the allocation is destroyed and the imported layers
// removed.
func (s *Store) CreateImported(id string, tasks []allocdir.Task, prevID string, dirs map[string]string) (*State, error) {
	if _, err := s.Create(id, tasks); err != nil {
		return nil, err
	}
	var imported []string
	fail := func(err error) (*State, error) {
		return nil, errors.Join(err, s.Destroy(id), s.removeFresh(imported))
	}
	layers := make(map[string]string, len(dirs))
	st, err := s.Get(id)
	if err != nil {
		return fail(err)
	}
	for key, dir := range dirs {
		if _, ok := st.Volumes[key]; !ok {
			continue
		}
		l, err := s.ImportLayer(dir)
		if err != nil {
			return fail(err)
		}
		imported = append(imported, l)
		layers[key] = l
	}
	var placeholders []string
	st, err = s.Update(id, func(st *State) error {
		for key, l := range layers {
			placeholders = append(placeholders, st.Volumes[key].layers()...)
			st.Volumes[key] = &Volume{Upper: l}
		}
		st.Previous = prevID
		return nil
	})
	if err != nil {
		return fail(err)
	}
	s.removeIfEmpty(id, placeholders)
	return st, nil
}

// ImportLayer turns dir, a directory inside the staging dir, into a new
// layer by renaming it into layers/, and returns the layer's ID.
func (s *Store) ImportLayer(dir string) (string, error) {
	rel, err := filepath.Rel(s.StagingDir(), dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return "", fmt.Errorf("cannot import %q: not inside the staging dir %q: %w", dir, s.StagingDir(), allocdir.ErrInvalidName)
	}
	for range 8 {
		id, err := newLayerID()
		if err != nil {
			return "", err
		}
		err = unix.Renameat2(unix.AT_FDCWD, dir, unix.AT_FDCWD, s.LayerPath(id), unix.RENAME_NOREPLACE)
		if errors.Is(err, unix.EEXIST) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("failed to import %q as a layer: %w", dir, err)
		}
		if err := syncDir(filepath.Join(s.dataDir, layersDirName)); err != nil {
			return "", errors.Join(err, s.removeFresh([]string{id}))
		}
		return id, nil
	}
	return "", errors.New("failed to find an unused layer ID")
}
