package store

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// observed is an Observer that keeps what it was told.
type observed struct {
	mu         sync.Mutex
	migrations []string // kind/ok or kind/error
	collected  []string // reason/ok or reason/error
	passes     []CollectorPass
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func (o *observed) Migrated(kind MigrationKind, d time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.migrations = append(o.migrations, string(kind)+"/"+result(err))
}

func (o *observed) Collected(reason GCReason, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.collected = append(o.collected, string(reason)+"/"+result(err))
}

func (o *observed) CollectorPass(p CollectorPass) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.passes = append(o.passes, p)
}

// TestObserverMigrations: every migration into a new allocation reaches
// the observer with its kind, the refused ones as errors.
func TestObserverMigrations(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	obs := &observed{}
	s.SetObserver(obs)
	web := []allocdir.Task{{Name: "web"}}
	mustCreate(t, s, "a", "web")
	if _, _, err := s.CreateMigrated("b", web, "a", false); !errors.Is(err, ErrNotTerminal) {
		t.Fatalf("migration from a running allocation: %v, want ErrNotTerminal", err)
	}
	if _, err := s.Stop("a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateMigrated("b", web, "a", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Stop("b"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateMigrated("c", web, "b", false); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.StagingDir(), "fetch-1", "alloc/data")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateImported("d", web, "remote", map[string]string{"alloc/data": dir}); err != nil {
		t.Fatal(err)
	}
	want := []string{"adopt/error", "snapshot/ok", "adopt/ok", "remote/ok"}
	if !reflect.DeepEqual(obs.migrations, want) {
		t.Errorf("migrations observed: %v, want %v", obs.migrations, want)
	}
}

// TestObserverCollector: the collector's decisions reach the observer
// with their reason's class, a pinned allocation as a skip, and every
// pass once, requested or not.
func TestObserverCollector(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	obs := &observed{}
	s.SetObserver(obs)
	for _, id := range []string{"old", "new", "pinned", "asked"} {
		mustCreate(t, s, id, "web")
		if _, err := s.Stop(id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	unpin, err := s.Pin("pinned")
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	c := NewCollector(testLogger(t), s, GCConfig{MaxAllocs: 3})
	c.statfs = func() (unix.Statfs_t, error) {
		return unix.Statfs_t{Blocks: 100, Bfree: 90, Files: 100, Ffree: 90}, nil
	}
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"old"}) {
		t.Fatalf("collected over max allocations: %v, want [old]", got)
	}
	if err := c.CollectAlloc("asked", "requested"); err != nil {
		t.Fatal(err)
	}
	if err := c.CollectAlloc("pinned", "requested"); !errors.Is(err, ErrPinned) {
		t.Fatalf("collecting a pinned allocation: %v, want ErrPinned", err)
	}
	c.cfg = GCConfig{}
	if got := c.Collect(); len(got) != 0 {
		t.Fatalf("collected without pressure: %v", got)
	}
	if want := []string{"max_allocs/ok", "requested/ok"}; !reflect.DeepEqual(obs.collected, want) {
		t.Errorf("collections observed: %v, want %v", obs.collected, want)
	}
	if len(obs.passes) != 4 {
		t.Fatalf("%d passes observed, want 4: %+v", len(obs.passes), obs.passes)
	}
	for i, want := range []CollectorPass{
		{Pressure: GCMaxAllocs, Pinned: 1},
		{Requested: true},
		{Requested: true, Pinned: 1},
		{},
	} {
		got := obs.passes[i]
		if got.Requested != want.Requested || got.Pressure != want.Pressure || got.Pinned != want.Pinned {
			t.Errorf("pass %d: %+v, want requested %v, pressure %q, pinned %d", i, got, want.Requested, want.Pressure, want.Pinned)
		}
		if got.Duration <= 0 {
			t.Errorf("pass %d took no time at all", i)
		}
	}
	if obs.passes[0].Swept != 0 {
		t.Errorf("the first pass swept %d orphan layers of a store that has none", obs.passes[0].Swept)
	}
}
