package gc

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"
	"golang.org/x/sys/unix"
)

// newStore opens a store in a fresh data dir with allocations of one task
// "web" for ids, stopped in the order stop names them, a moment apart, so
// that each has a stop time of its own.
func newStore(t *testing.T, ids, stop []string) *store.Store {
	t.Helper()
	s := openStore(t, filepath.Join(t.TempDir(), "data"), store.Options{})
	t.Cleanup(func() { storetest.Must(t, s.Close()) })
	for _, id := range ids {
		storetest.Must(t, storetest.ErrOnly(s.Create(id, storetest.Tasks("web"), store.CreateOptions{})))
	}
	for _, id := range stop {
		storetest.Must(t, storetest.ErrOnly(s.Stop(id)))
		time.Sleep(2 * time.Millisecond)
	}
	return s
}

// statfs is a backing store whose blocks and inodes are used by the given
// percentages.
func statfs(blocks, files uint64) func() (unix.Statfs_t, error) {
	return func() (unix.Statfs_t, error) {
		return unix.Statfs_t{Blocks: 100, Bfree: 100 - blocks, Files: 100, Ffree: 100 - files}, nil
	}
}

// TestCollector checks the automatic collector: over max allocations it
// collects terminal ones, oldest stopped first, never a running or a
// pinned one; under disk pressure it collects until the pressure is gone;
// with no pressure it collects nothing.
func TestCollector(t *testing.T) {
	s := newStore(t, []string{"run", "old", "mid", "new", "pinned"}, []string{"pinned", "old", "mid", "new"})
	unpin, err := s.Pin("pinned")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy("pinned"); !errors.Is(err, store.ErrPinned) {
		t.Errorf("Destroy of a pinned allocation: got %v, want ErrPinned", err)
	}
	c := NewCollector(allocdirtest.Logger(t), s, Config{MaxAllocs: 3})
	c.statfs = statfs(10, 10)
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"old", "mid"}) {
		t.Errorf("collected over max allocations: got %v, want [old mid]", got)
	}
	// Disk pressure that a collection relieves.
	c.cfg = Config{DiskUsagePercent: 80}
	full := true
	c.statfs = func() (unix.Statfs_t, error) {
		if full {
			full = false
			return statfs(95, 10)()
		}
		return statfs(50, 10)()
	}
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"new"}) {
		t.Errorf("collected under disk pressure: got %v, want [new]", got)
	}
	// Pressure left, but only running and pinned allocations.
	c.statfs = statfs(99, 99)
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

// TestCollectAllocRefusesRunning checks that an explicit collection of a
// running allocation is refused as ErrNotTerminal, saying what to do, and
// leaves it be.
func TestCollectAllocRefusesRunning(t *testing.T) {
	s := newStore(t, []string{"run"}, nil)
	c := NewCollector(allocdirtest.Logger(t), s, Config{})
	err := c.CollectAlloc("run", "requested")
	if !errors.Is(err, store.ErrNotTerminal) {
		t.Fatalf("collecting a running allocation: %v, want ErrNotTerminal", err)
	}
	if want := `allocation "run" is running: stop it before collecting it`; err.Error() != want {
		t.Errorf("collecting a running allocation: %q, want %q", err, want)
	}
	if _, err := s.Get("run"); err != nil {
		t.Errorf("the running allocation: %v", err)
	}
}

// observed is a store.Observer that keeps what the collector told it.
type observed struct {
	mu        sync.Mutex
	collected []string // reason/ok or reason/error
	passes    []store.CollectorPass
}

func (o *observed) Migrated(store.MigrationKind, time.Duration, error) {}

func (o *observed) Collected(reason store.GCReason, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	result := "ok"
	if err != nil {
		result = "error"
	}
	o.collected = append(o.collected, string(reason)+"/"+result)
}

func (o *observed) CollectorPass(p store.CollectorPass) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.passes = append(o.passes, p)
}

// TestObserverCollector: the collector's decisions reach the observer
// with their reason's class, a pinned allocation as a skip, and every
// pass once, requested or not.
func TestObserverCollector(t *testing.T) {
	ids := []string{"old", "new", "pinned", "asked"}
	s := newStore(t, ids, ids)
	obs := &observed{}
	s.SetObserver(obs)
	unpin, err := s.Pin("pinned")
	if err != nil {
		t.Fatal(err)
	}
	defer unpin()
	c := NewCollector(allocdirtest.Logger(t), s, Config{MaxAllocs: 3})
	c.statfs = statfs(10, 10)
	if got := c.Collect(); !reflect.DeepEqual(got, []string{"old"}) {
		t.Fatalf("collected over max allocations: %v, want [old]", got)
	}
	if err := c.CollectAlloc("asked", "requested"); err != nil {
		t.Fatal(err)
	}
	if err := c.CollectAlloc("pinned", "requested"); !errors.Is(err, store.ErrPinned) {
		t.Fatalf("collecting a pinned allocation: %v, want ErrPinned", err)
	}
	c.cfg = Config{}
	if got := c.Collect(); len(got) != 0 {
		t.Fatalf("collected without pressure: %v", got)
	}
	if want := []string{"max_allocs/ok", "requested/ok"}; !reflect.DeepEqual(obs.collected, want) {
		t.Errorf("collections observed: %v, want %v", obs.collected, want)
	}
	if len(obs.passes) != 4 {
		t.Fatalf("%d passes observed, want 4: %+v", len(obs.passes), obs.passes)
	}
	for i, want := range []store.CollectorPass{
		{Pressure: store.GCMaxAllocs, Pinned: 1},
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

// TestCollectorFlattens checks the trigger: a collection pass that
// destroys the stopped allocations holding a chain's old layers then
// flattens the chain within the bound.
func TestCollectorFlattens(t *testing.T) {
	// Two more snapshot migrations than the bound, so that the newest
	// allocation is over it.
	const chainLen = store.MaxLowers + 2
	id := func(i int) string { return fmt.Sprintf("g%d", i) }
	s := newStore(t, []string{id(0)}, nil)
	for i := 1; i <= chainLen; i++ {
		storetest.Must(t, storetest.ErrOnly(s.Stop(id(i-1))))
		time.Sleep(2 * time.Millisecond) // distinct stop times: oldest first
		if _, err := s.Create(id(i), storetest.Tasks("web"), store.CreateOptions{Previous: id(i - 1), Migration: store.MigrationSnapshot}); err != nil {
			t.Fatal(err)
		}
	}
	c := NewCollector(allocdirtest.Logger(t), s, Config{MaxAllocs: 2})
	c.statfs = statfs(10, 10)
	if got := c.Collect(); len(got) != chainLen-1 {
		t.Fatalf("collected %v, want the %d oldest", got, chainLen-1)
	}
	depth := 0
	for _, id := range []string{id(chainLen - 1), id(chainLen)} {
		for _, v := range storetest.Value[*record.State](t)(s.Get(id)).Volumes {
			depth = max(depth, len(v.Lowers))
		}
	}
	if s.Quota().Mechanism == quota.BtrfsQgroups {
		// Subvolumes cannot be merged by link(2): Flatten leaves them.
		if depth != chainLen {
			t.Errorf("deepest stack of subvolumes after a collection: %d lowers, want the %d it had", depth, chainLen)
		}
		return
	}
	if depth > store.MaxLowers {
		t.Errorf("deepest stack after a collection: %d lowers, want at most %d", depth, store.MaxLowers)
	}
}

// openStore opens the store in dir with opts as every store test does
// (storetest.Open: on btrfs subvolumes under make test-btrfs), failing
// the test on error. The test closes it.
func openStore(t *testing.T, dir string, opts store.Options) *store.Store {
	t.Helper()
	return storetest.Value[*store.Store](t)(storetest.Open(t, func(limits bool) (*store.Store, error) {
		opts.Quotas = opts.Quotas || limits
		return store.OpenWith(allocdirtest.Logger(t), dir, opts)
	}))
}
