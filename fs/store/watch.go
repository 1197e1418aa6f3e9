package store

import (
	"errors"
	"fmt"
	"sync"

	"github.com/allocfs/allocfs/internal/inotify"
)

// storeEvents is the store's one inotify notifier, started by the first
// follower. Writes through the mount reach the backing files either
// through the daemon or, with passthrough, straight from the kernel; in
// both cases the kernel reports them on the backing directories, which is
// where followers of the read side wait. Changes of the store's own
// records (a remap, a destroy) produce no such event, so the store wakes
// an allocation's followers itself.
type storeEvents struct {
	once     sync.Once
	notifier *inotify.Notifier
	err      error
	unhook   func()
}

// Notifier returns the store's notifier, or nil (followers then poll) when
// inotify is unavailable; the reason is logged once.
func (s *Store) Notifier() *inotify.Notifier {
	s.events.once.Do(func() {
		n, err := inotify.New()
		if err != nil {
			s.events.err = err
			s.logger.Warn("file followers will poll: inotify is unavailable", "error", err)
			return
		}
		s.events.notifier = n
		s.events.unhook = s.OnChange(n.Wake)
	})
	return s.events.notifier
}

// Close checkpoints the journal (so the next start replays nothing) and
// releases what the store holds: the followers' notifier and the data
// dir's lock. The store's records and layers stay as they are. Changes
// after Close fail.
func (s *Store) Close() error {
	var errs []error
	s.events.once.Do(func() {})
	if s.events.notifier != nil {
		s.events.unhook()
		errs = append(errs, s.events.notifier.Close())
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if !s.lock.Held() {
		return errors.Join(errs...)
	}
	if err := s.checkpoint(); err != nil {
		errs = append(errs, fmt.Errorf("failed to checkpoint the journal; the next start replays it: %w", err))
	}
	errs = append(errs, s.lock.Release())
	s.broken = errClosed
	return errors.Join(errs...)
}
