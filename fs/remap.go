package fs

import (
	"errors"
	"fmt"
	"os"

	"github.com/allocfs/allocfs/allocdir"
)

// Remap is the adopt migration: for every volume key (alloc/data,
// <task>/local) that prevID has, newID takes over prevID's layers and
// prevID gets a fresh empty layer in their place. No file is copied or
// moved; only the two records change. It returns how many volumes moved.
//
// Crash safety: the new allocation's record is written first, so after a
// crash between the two writes both records name the migrated layers and
// nothing is lost (Destroy only removes layers no other allocation
// references). newID's own empty placeholders are removed last, and only
// if still empty.
func (s *Store) Remap(prevID, newID string, keys []string) (int, error) {
	if prevID == newID {
		return 0, fmt.Errorf("failed to remap %s onto itself: %w", prevID, allocdir.ErrInvalidName)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	prev, err := s.Get(prevID)
	if err != nil {
		return 0, err
	}
	next, err := s.Get(newID)
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
		if old, ok := next.Volumes[key]; ok {
			placeholders = append(placeholders, old.Upper)
			placeholders = append(placeholders, old.Lowers...)
		}
		next.Volumes[key] = &Volume{Upper: pv.Upper, Lowers: append([]string(nil), pv.Lowers...)}
		spec, ok := volumeSpecOf(key)
		if !ok {
			return 0, fmt.Errorf("failed to remap %s into %s: %q is not a volume: %w", prevID, newID, key, allocdir.ErrInvalidName)
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return 0, nil
	}
	if err := next.validate(); err != nil {
		return 0, fmt.Errorf("failed to remap %s into %s: %w", prevID, newID, err)
	}
	if err := s.commit(next); err != nil {
		return 0, fmt.Errorf("failed to remap %s into %s: %w", prevID, newID, err)
	}
	if err := s.commitWithLayers(prev, specs); err != nil {
		// Both records name the layers now; the previous allocation keeps
		// showing them until this is retried or it is collected.
		return len(specs), fmt.Errorf("remapped into %s, but failed to give %s fresh layers: %w", newID, prevID, err)
	}
	for _, l := range placeholders {
		s.mu.RLock()
		used := s.referencedLocked(l)
		s.mu.RUnlock()
		if used {
			continue
		}
		// Remove succeeds only on an empty directory: a placeholder that
		// somebody wrote into is kept for GC rather than deleted.
		if err := os.Remove(s.LayerPath(l)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.logger.Warn("previous placeholder layer kept", "layer", l, "alloc_id", newID, "error", err)
		}
	}
	return len(specs), nil
}
