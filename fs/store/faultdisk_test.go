package store

import (
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/storetest"
)

// setFault makes every later step of s, its disk's and its quota's in
// the kernel (openStore), ask fn first; nil restores the plain disk.
func setFault(s *Store, fn func(op, path string) error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if fn == nil {
		s.disk = disk.OS{}
		return
	}
	s.disk = storetest.FaultDisk{Fn: fn}
}

// quotaFault asks the fault setFault installed in s, if any, about a
// step of its quota's.
func quotaFault(s *Store, op, p string) error {
	if s == nil {
		return nil // still opening
	}
	if d, ok := s.disk.(storetest.FaultDisk); ok {
		return d.Fn(op, p)
	}
	return nil
}

// layerRootOp is the step that makes a layer's root: a mkdir, or the
// creation of a subvolume where the layers are subvolumes.
func layerRootOp(s *Store) string {
	if s.quota != nil && s.quota.Subvolumes() {
		return "subvolume create"
	}
	return "mkdir"
}
