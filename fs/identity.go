package fs

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/allocfs/allocfs/fs/volume"
	"github.com/allocfs/allocfs/restart"
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
// (volume.ViewShift): unique among the allocations of this mount, stable for as
// long as the allocation lives in it.

// maxSlot is the largest slot: the bits from volume.ViewShift up to, not
// including, syntheticBit.
const maxSlot = uint64(1)<<(63-volume.ViewShift) - 1

// taskRootView is the first view of the directories of the tasks that
// stack a host layer (chroot.go): taskRootView+i is the view of the i-th
// task's directory, since the chroot environment's host files show in
// every such task of an allocation, and one node of theirs must not be in
// two of them.
const taskRootView = 1 << 20

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
	// file, when set, is where the table is kept for a daemon that takes
	// the connection over (takeover.go): a slot is written there before
	// any inode number with it reaches the kernel. saveFailed is told
	// when that write fails: the mount serves on, but a daemon taking it
	// over will not find that view's nodes.
	file       string
	saveFailed func(error)
}

// slotsPath is where the slot table is kept for a daemon taking over.
func slotsPath(dataDir string) string { return restart.StateFile(dataDir, "slots.json") }

// slotsFile is the slot table on disk, <data-dir>/fuse/slots.json:
//
//	{"slots": {"<allocID>/<view>": 3, ...}, "next": 7, "freed": [2]}
type slotsFile struct {
	Slots map[string]uint64 `json:"slots"`
	Next  uint64            `json:"next"`
	Freed []uint64          `json:"freed,omitempty"`
}

// saveLocked writes the table to s.file; s.mu is held. The table matters
// to a daemon that takes this connection over, on this boot: a crash of
// the machine ends the connection too, so the page cache is durable
// enough, and the write is atomic by rename but not synced.
func (s *slots) saveLocked() error {
	if s.file == "" {
		return nil
	}
	f := slotsFile{Slots: make(map[string]uint64, len(s.byKey)), Next: s.next, Freed: s.freed}
	for k, n := range s.byKey {
		f.Slots[k.alloc+"/"+strconv.FormatUint(k.view, 10)] = n
	}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return restart.WriteReplace(s.file, b)
}

// load reads the table a previous daemon of this connection kept.
func (s *slots) load(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("failed to read the slot table: %w", err)
	}
	var f slotsFile
	if err := json.Unmarshal(b, &f); err != nil {
		return fmt.Errorf("the slot table %s: %w", file, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byKey = make(map[viewKey]uint64, len(f.Slots))
	for k, n := range f.Slots {
		i := strings.LastIndexByte(k, '/')
		view, err := strconv.ParseUint(k[i+1:], 10, 64)
		if i <= 0 || err != nil || n == 0 || n > maxSlot {
			return fmt.Errorf("the slot table %s: bad entry %q: %d", file, k, n)
		}
		s.byKey[viewKey{k[:i], view}] = n
	}
	s.next, s.freed, s.file = f.Next, f.Freed, file
	return nil
}

// view returns the allocation and view that hold slot n.
func (s *slots) view(n uint64) (viewKey, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.byKey {
		if v == n {
			return k, true
		}
	}
	return viewKey{}, false
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
	if err := s.saveLocked(); err != nil && s.saveFailed != nil {
		s.saveFailed(err)
	}
	return n, 0
}

// peek returns the slot of view of alloc, or 0 for none, handing out
// none.
func (s *slots) peek(alloc string, view uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[viewKey{alloc, view}]
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
	if err := s.saveLocked(); err != nil && s.saveFailed != nil {
		s.saveFailed(err)
	}
}
