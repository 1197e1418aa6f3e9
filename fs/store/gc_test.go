package store

import (
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestCollector checks the automatic collector: over max allocations it
// collects terminal ones, oldest stopped first, never a running or a
// pinned one; under disk pressure it collects until the pressure is gone;
// with no pressure it collects nothing.
func TestCollector(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	for _, id := range []string{"run", "old", "mid", "new", "pinned"} {
		mustCreate(t, s, id, "web")
	}
	for _, id := range []string{"pinned", "old", "mid", "new"} {
		if _, err := s.Stop(id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	unpin, err := s.Pin("pinned")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy("pinned"); !errors.Is(err, ErrPinned) {
		t.Errorf("Destroy of a pinned allocation: got %v, want ErrPinned", err)
	}
	c := NewCollector(testLogger(t), s, GCConfig{MaxAllocs: 3})
	c.statfs = func() (unix.Statfs_t, error) {
		return unix.Statfs_t{Blocks: 100, Bfree: 90, Files: 100, Ffree: 90}, nil
	}
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"old", "mid"}) {
		t.Errorf("collected over max allocations: got %v, want [old mid]", got)
	}
	// Disk pressure that a collection relieves.
	c.cfg = GCConfig{DiskUsagePercent: 80}
	full := true
	c.statfs = func() (unix.Statfs_t, error) {
		if full {
			full = false
			return unix.Statfs_t{Blocks: 100, Bfree: 5, Files: 100, Ffree: 90}, nil
		}
		return unix.Statfs_t{Blocks: 100, Bfree: 50, Files: 100, Ffree: 90}, nil
	}
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"new"}) {
		t.Errorf("collected under disk pressure: got %v, want [new]", got)
	}
	// Pressure left, but only running and pinned allocations.
	c.statfs = func() (unix.Statfs_t, error) { return unix.Statfs_t{Blocks: 100, Bfree: 1, Files: 100, Ffree: 1}, nil }
	if got := c.Collect(); len(got) != 0 {
		t.Errorf("collected with only running and pinned allocations: got %v", got)
	}
	unpin()
	unpin() // twice is fine
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"pinned"}) {
		t.Errorf("collected after the unpin: got %v, want [pinned]", got)
	}
	if _, err := s.Get("run"); err != nil {
		t.Errorf("the running allocation: %v", err)
	}
}
