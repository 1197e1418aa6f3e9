package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// newLayer creates an empty layer whose root has mode (forced, so the
// umask does not matter) and the store's owner, holding a MIGRATED-TO
// file with note if note is not empty. Nothing is synced: the intent that
// names the layer describes it, and a replay makes it again if a power
// cut lost it.
func (s *Store) newLayer(mode os.FileMode, note string) (freshLayer, error) {
	uid, gid := -1, -1
	if s.owner != nil {
		uid, gid = s.owner.UID, s.owner.GID
	}
	return s.newLayerOwned(mode, note, uid, gid)
}

// specLayer creates the empty layer spec asks for: its mode, and its
// owner, the agent's or the store's.
func (s *Store) specLayer(spec record.VolumeSpec) (freshLayer, error) {
	switch {
	case spec.Owner != nil:
		return s.newLayerOwned(spec.Mode, "", spec.Owner.UID, spec.Owner.GID)
	case spec.Agent:
		return s.newLayerOwned(spec.Mode, "", -1, -1)
	}
	return s.newLayer(spec.Mode, "")
}

// newLayerOwned is newLayer with a root owned by uid and gid (-1 leaves
// the daemon's).
func (s *Store) newLayerOwned(mode os.FileMode, note string, uid, gid int) (freshLayer, error) {
	for range 8 {
		id, err := newLayerID()
		if err != nil {
			return freshLayer{}, err
		}
		s.mu.RLock()
		_, dying := s.dying[id]
		s.mu.RUnlock()
		if dying {
			continue
		}
		f := freshLayer{ID: id, Mode: mode, UID: uid, GID: gid, Note: note}
		err = s.makeLayer(s.LayerPath(id), f)
		if errors.Is(err, iofs.ErrExist) {
			continue
		}
		if err != nil {
			return freshLayer{}, err
		}
		return f, nil
	}
	return freshLayer{}, errors.New("failed to find an unused layer ID")
}

// makeLayer creates the layer f describes at p: the root, its owner, then
// its mode (chown after chmod could clear mode bits), then the note.
func (s *Store) makeLayer(p string, f freshLayer) error {
	mkdir := func() error { return s.disk.Mkdir(p, 0o700) }
	if s.quota != nil && s.quota.Subvolumes() {
		mkdir = func() error { return s.quota.MakeLayer(p) }
	}
	if err := mkdir(); err != nil {
		return err
	}
	err := func() error {
		if f.UID >= 0 {
			if err := s.disk.Lchown(p, f.UID, f.GID); err != nil {
				return err
			}
		}
		if err := s.disk.Chmod(p, uint32(f.Mode.Perm())|unixModeBits(f.Mode)); err != nil {
			return err
		}
		if f.Note != "" {
			return s.disk.WriteFile(filepath.Join(p, MigratedToName), []byte(f.Note), 0o444)
		}
		return nil
	}()
	if err != nil {
		return errors.Join(err, s.disk.RemoveAll(p))
	}
	return nil
}

// unixModeBits returns the set-id and sticky bits of m in chmod(2)'s form.
func unixModeBits(m os.FileMode) uint32 {
	var out uint32
	if m&os.ModeSetuid != 0 {
		out |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		out |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		out |= unix.S_ISVTX
	}
	return out
}

// removeFresh removes layers created by a change that failed. They are
// new and referenced by nothing, so removing them cannot lose data; one
// that cannot be removed is an orphan the collector removes later.
func (s *Store) removeFresh(layers []freshLayer) error {
	var errs []error
	for _, l := range layers {
		if err := s.disk.RemoveAll(s.LayerPath(l.ID)); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove new layer %s: %w", l.ID, err))
		}
	}
	return errors.Join(errs...)
}

// newLayerID returns 16 random hex characters.
func newLayerID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("failed to generate a layer ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// claimLocked marks as dying the layers that nothing references, so that
// nothing can stack on them while they are removed, and returns them. The
// caller holds mu.
func (s *Store) claimLocked(layers []string) []string {
	var owned []string
	for _, l := range layers {
		if s.dying[l] || s.referencedLocked(l) {
			continue
		}
		if _, ok := s.making[l]; ok {
			continue
		}
		s.dying[l] = true
		owned = append(owned, l)
	}
	return owned
}

// removeClaimed removes layers claimLocked returned, and logs each with
// the key/value pairs in kv. A layer that cannot be removed is released
// as failed: an orphan still out of reach, which the next sweep tries
// again.
func (s *Store) removeClaimed(owned []string, kv ...any) (int, error) {
	var errs []error
	n := 0
	for _, l := range owned {
		err := s.disk.RemoveAll(s.LayerPath(l))
		s.mu.Lock()
		if err != nil {
			s.dying[l] = false
		} else {
			delete(s.dying, l)
		}
		s.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to remove layer %s: %w", l, err))
			s.logger.Warn("failed to remove layer; the collector will try again", append([]any{"layer", l, "error", err}, kv...)...)
			continue
		}
		s.logger.Debug("removed layer", append([]any{"layer", l}, kv...)...)
		n++
	}
	return n, errors.Join(errs...)
}

// referencedLocked reports whether any allocation stacks or retains layer
// l. The caller holds mu.
func (s *Store) referencedLocked(l string) bool {
	for _, st := range s.allocs {
		if slices.Contains(st.Retained, l) {
			return true
		}
		for _, v := range st.Volumes {
			if v == nil {
				continue
			}
			if v.Upper == l || slices.Contains(v.Lowers, l) {
				return true
			}
		}
	}
	return false
}

// referencedAll returns every layer some allocation stacks or retains.
// The caller holds writeMu (or is opening the store).
func (s *Store) referencedAll() map[string]struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]struct{})
	for _, st := range s.allocs {
		for l := range st.AllLayerIDs() {
			out[l] = struct{}{}
		}
	}
	return out
}

// orphansLocked lists the layers in layers/ that no allocation references,
// no change is making and nothing is removing. Changes hold writeMu from
// the moment they create a layer until the intent naming it is applied,
// so the caller holds writeMu (or is opening the store) for the answer to
// hold.
func (s *Store) orphansLocked() ([]string, error) {
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, fmt.Errorf("failed to list layers dir: %w", err)
	}
	used := s.referencedAll()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for _, e := range entries {
		l := e.Name()
		if _, ok := used[l]; ok {
			continue
		}
		if s.dying[l] {
			continue
		}
		if _, ok := s.making[l]; ok {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// Sweep removes the orphan layers: those no allocation references, left
// by a crash, a failed removal or a flatten whose allocations are gone.
// Each removal is logged; a failure does not stop the sweep, and the
// layer stays an orphan for the next one. It returns how many it removed.
func (s *Store) Sweep() (int, error) {
	s.writeMu.Lock()
	orphans, err := s.orphansLocked()
	if err != nil {
		s.writeMu.Unlock()
		return 0, err
	}
	s.mu.Lock()
	owned := s.claimLocked(orphans)
	s.mu.Unlock()
	s.writeMu.Unlock()
	var n int
	for _, l := range owned {
		start := time.Now()
		if _, err := s.removeClaimed([]string{l}); err != nil {
			continue
		}
		n++
		s.logger.Info("removed orphan layer", "layer", l, "duration", time.Since(start))
	}
	if n < len(owned) {
		return n, fmt.Errorf("%d of %d orphan layers could not be removed; the next sweep tries again", len(owned)-n, len(owned))
	}
	return n, nil
}
