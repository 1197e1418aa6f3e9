package fs

import (
	"sync"
	"syscall"
)

// Two allocations can show the same backing file: a snapshot-mode
// migration stacks the previous allocation's layer under the new one while
// the previous one keeps it as its frozen upper, and an adopt-mode
// migration hands a layer over while the kernel may still hold the old
// owner's entries. go-fuse keeps one node per identity (inode number,
// generation), and a node knows the volume it belongs to (its layers, its
// path, whether it is read-only), so the same backing inode must never
// have the same identity in two places. Each place a volume is shown (an
// allocation's own paths, or one of its <task>/alloc views) gets a slot
// that is mixed into the high bits of every inode number it shows
// (viewShift): unique among the allocations of this mount, stable for as
// long as the allocation lives in it.

// maxSlot is the largest slot: the bits from viewShift up to, not
// including, syntheticBit.
const maxSlot = uint64(1)<<(63-viewShift) - 1

// viewKey names one place an allocation's volumes are shown: view 0 is the
// allocation's own alloc/ and task directories, view n its n-th task's
// alloc/.
type viewKey struct {
	alloc string
	view  uint64
}

// slots hands out the slots of a mount.
type slots struct {
	mu    sync.Mutex
	byKey map[viewKey]uint64
	next  uint64
	// freed holds the slots of destroyed allocations, oldest first. They
	// are reused only once every other slot has been handed out, so that
	// the kernel has long forgotten the old owner's entries.
	freed []uint64
}

// slot returns the slot of view of allocation alloc, or ENOSPC when
// maxSlot views are live at once.
func (s *slots) slot(alloc string, view uint64) (uint64, syscall.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := viewKey{alloc, view}
	if n, ok := s.byKey[k]; ok {
		return n, 0
	}
	var n uint64
	switch {
	case s.next < maxSlot:
		s.next++
		n = s.next
	case len(s.freed) > 0:
		n, s.freed = s.freed[0], s.freed[1:]
	default:
		return 0, syscall.ENOSPC
	}
	if s.byKey == nil {
		s.byKey = make(map[viewKey]uint64)
	}
	s.byKey[k] = n
	return n, 0
}

// release frees the slots of a destroyed allocation.
func (s *slots) release(alloc string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, n := range s.byKey {
		if k.alloc == alloc {
			delete(s.byKey, k)
			s.freed = append(s.freed, n)
		}
	}
}
