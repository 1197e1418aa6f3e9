package store

import (
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/storetest"
)

// setFault makes every later step of s ask fn first; nil restores the
// plain disk.
func setFault(s *Store, fn func(op, path string) error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if fn == nil {
		s.disk = disk.OS{}
		return
	}
	s.disk = storetest.FaultDisk{Fn: fn}
}
