package metrics

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func openStore(t *testing.T) *store.Store {
	t.Helper()
	s, err := store.Open(testLogger(t), filepath.Join(t.TempDir(), "data"))
	must(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// layerOf is the backing directory of a volume's upper layer.
func layerOf(t *testing.T, s *store.Store, id, volume string) string {
	t.Helper()
	st, err := s.Get(id)
	must(t, err)
	return s.LayerPath(st.Volumes[volume].Upper)
}

// until scrapes until cond holds on what it parsed, for up to ten
// seconds, and returns the last scrape.
func until(t *testing.T, m *Metrics, what string, cond func(families) bool) families {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		fams := scrape(t, m.Handler(), Path)
		if cond(fams) {
			return fams
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNodeSeries: the node's series come from the store and the mount's
// functions at scrape time, and the allocations' usage from the
// background walk, which sees a write at its next refresh, a snapshot
// migration's layers as the new allocation's lower ones, and a
// destroyed allocation not at all.
func TestNodeSeries(t *testing.T) {
	s := openStore(t)
	_, err := s.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	must(t, err)
	data := layerOf(t, s, "a1", "alloc/data")
	must(t, os.WriteFile(filepath.Join(data, "f"), []byte("hello"), 0o644))
	must(t, os.Mkdir(filepath.Join(data, "d"), 0o755))
	must(t, os.Link(filepath.Join(data, "f"), filepath.Join(data, "d", "same")))

	m := New(testLogger(t))
	stop := m.WatchNode(Node{
		Store:         s,
		Passthrough:   func() (bool, bool) { return true, false },
		FileOpens:     func() (uint64, uint64) { return 7, 2 },
		Followers:     func() int64 { return 3 },
		UsageInterval: 20 * time.Millisecond,
	})
	defer stop()
	a1data := map[string]string{"alloc_id": "a1", "volume": "alloc/data", "layer": "upper"}
	fams := scrape(t, m.Handler(), Path)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"allocfs_alloc_bytes", a1data, 5},
		{"allocfs_alloc_files", a1data, 2}, // f (and d/same, the same inode), d
		{"allocfs_alloc_bytes", map[string]string{"alloc_id": "a1", "volume": "alloc/data", "layer": "lower"}, 0},
		{"allocfs_alloc_status", map[string]string{"alloc_id": "a1", "status": "running"}, 1},
		{"allocfs_alloc_status", map[string]string{"alloc_id": "a1", "status": "terminal"}, 0},
		{"allocfs_allocs", map[string]string{"status": "running"}, 1},
		{"allocfs_allocs", map[string]string{"status": "terminal"}, 0},
		{"allocfs_fuse_passthrough", nil, 1},
		{"allocfs_fuse_passthrough_lost", nil, 0},
		{"allocfs_fuse_file_opens_total", map[string]string{"mode": "passthrough"}, 7},
		{"allocfs_fuse_file_opens_total", map[string]string{"mode": "daemon"}, 2},
		{"allocfs_followers", nil, 3},
		{"allocfs_alloc_usage_failures_total", nil, 0},
	} {
		if got := fams.value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %g, want %g", c.name, c.labels, got, c.want)
		}
	}
	for _, name := range []string{"allocfs_backing_size_bytes", "allocfs_backing_free_bytes", "allocfs_backing_files", "allocfs_alloc_usage_refreshed_timestamp_seconds"} {
		if got := fams.value(name, nil); got <= 0 {
			t.Errorf("%s = %g, want more than 0", name, got)
		}
	}
	if h := fams["allocfs_alloc_bytes"].GetHelp(); !strings.Contains(h, "every 20ms") {
		t.Errorf("the usage's help does not say how stale it may be: %q", h)
	}

	f, err := os.OpenFile(filepath.Join(data, "f"), os.O_APPEND|os.O_WRONLY, 0)
	must(t, err)
	_, err = f.WriteString(" world")
	f.Close()
	must(t, err)
	until(t, m, "a write seen by the next refresh", func(f families) bool { return f.value("allocfs_alloc_bytes", a1data) == 11 })

	_, err = s.Stop("a1")
	must(t, err)
	_, err = s.Create("a2", []allocdir.Task{{Name: "web"}}, store.CreateOptions{Previous: "a1", Migration: store.MigrationSnapshot})
	must(t, err)
	fams = until(t, m, "a snapshot migration's layers", func(f families) bool {
		return f.value("allocfs_alloc_bytes", map[string]string{"alloc_id": "a2", "volume": "alloc/data", "layer": "lower"}) == 11
	})
	if got := fams.value("allocfs_alloc_bytes", a1data); got != 11 {
		t.Errorf("a1's sealed layer after the migration: %g bytes, want 11", got)
	}
	if got := fams.value("allocfs_alloc_status", map[string]string{"alloc_id": "a1", "status": "terminal"}); got != 1 {
		t.Errorf("a1 after its stop: terminal %g, want 1", got)
	}

	must(t, s.Destroy("a2"))
	fams = scrape(t, m.Handler(), Path)
	if m := fams.find("allocfs_alloc_bytes", map[string]string{"alloc_id": "a2"}); m != nil {
		t.Errorf("a destroyed allocation still has usage series")
	}
	if m := fams.find("allocfs_alloc_status", map[string]string{"alloc_id": "a2"}); m != nil {
		t.Errorf("a destroyed allocation still has a status")
	}
}

// TestWalkLayer: a layer's usage counts every entry but its root, the
// bytes of each regular file once however many names it has, never what
// a link points to, and reaches below PATH_MAX.
func TestWalkLayer(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	must(t, os.WriteFile(filepath.Join(outside, "big"), make([]byte, 1<<20), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "a"), []byte("12345"), 0o644))
	must(t, os.Link(filepath.Join(root, "a"), filepath.Join(root, "b")))
	must(t, os.Symlink(outside, filepath.Join(root, "link")))
	must(t, os.Mkdir(filepath.Join(root, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "sub", "c"), []byte("123"), 0o644))
	// A chain of directories longer than PATH_MAX, made from descriptors.
	const depth = 300
	name := strings.Repeat("d", 20)
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for range depth {
		must(t, unix.Mkdirat(fd, name, 0o755))
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		must(t, err)
		fd = next
	}
	f, err := unix.Openat(fd, "deep", unix.O_CREAT|unix.O_WRONLY, 0o644)
	must(t, err)
	_, err = unix.Write(f, []byte("1234567"))
	unix.Close(f)
	unix.Close(fd)
	must(t, err)
	t.Cleanup(func() { allocdir.RemoveAll(root) })

	u, err := walkLayer(context.Background(), root)
	must(t, err)
	// a and b are one file; link, sub, c; the chain and deep.
	if want := (usage{bytes: 5 + 3 + 7, files: 1 + 1 + 1 + 1 + depth + 1}); u != want {
		t.Errorf("usage %+v, want %+v", u, want)
	}
	if _, err := walkLayer(context.Background(), filepath.Join(root, "missing")); !os.IsNotExist(err) {
		t.Errorf("walk of a missing layer: %v, want not-exist", err)
	}
}

// TestScrapeDoesNotWaitForAWalk: once the first walk is done, a scrape
// answers at once with the last result while the next walk is stuck,
// and walks never overlap.
func TestScrapeDoesNotWaitForAWalk(t *testing.T) {
	s := openStore(t)
	_, err := s.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	must(t, err)
	m := New(testLogger(t))
	u := newUsageCache(m.logger, s, time.Millisecond)
	var (
		walks     atomic.Int32
		release   = make(chan struct{})
		stuck     = make(chan struct{})
		stuckOnce sync.Once
	)
	u.walk = func(_ context.Context, root string) (usage, error) {
		// The first refresh (one walk per layer of a1) goes through;
		// every walk of the next one waits to be released.
		if walks.Add(1) > int32(len(mustGet(t, s, "a1").Volumes)) {
			stuckOnce.Do(func() { close(stuck) })
			<-release
		}
		return usage{bytes: 42, files: 1}, nil
	}
	m.reg.MustRegister(newNodeCollector(Node{Store: s}, u))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		u.run(ctx)
		close(done)
	}()
	defer func() {
		cancel()
		close(release)
		<-done
	}()
	<-stuck
	start := time.Now()
	fams := scrape(t, m.Handler(), Path)
	if took := time.Since(start); took > time.Second {
		t.Errorf("a scrape during a stuck walk took %v", took)
	}
	if got := fams.value("allocfs_alloc_bytes", map[string]string{"alloc_id": "a1", "volume": "alloc/data", "layer": "upper"}); got != 42 {
		t.Errorf("usage during a stuck walk: %g, want the last walk's 42", got)
	}
}

// TestUsageWalkEndsWithItsContext: a walk stops at the next directory
// once its context ends, and a refresh that was cut keeps nothing, so
// that a shutdown never waits for a walk of every layer.
func TestUsageWalkEndsWithItsContext(t *testing.T) {
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "a", "b"), 0o755))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := walkLayer(ctx, root); !errors.Is(err, context.Canceled) {
		t.Errorf("walk with an ended context: %v, want context.Canceled", err)
	}
	s, err := store.Open(testLogger(t), t.TempDir())
	must(t, err)
	t.Cleanup(func() { s.Close() })
	_, err = s.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	must(t, err)
	u := newUsageCache(testLogger(t), s, time.Hour)
	u.walk = func(ctx context.Context, root string) (usage, error) {
		cancel()
		return usage{bytes: 7}, ctx.Err()
	}
	u.refresh(ctx)
	select {
	case <-u.ready:
		t.Error("a refresh cut by its context was kept as the result")
	default:
	}
}

func mustGet(t *testing.T, s *store.Store, id string) *record.State {
	st, err := s.Get(id)
	if err != nil {
		t.Error(err)
		return &record.State{}
	}
	return st
}

// TestUsageFailuresCounted: a layer the walk cannot read counts as a
// failure, and as empty.
func TestUsageFailuresCounted(t *testing.T) {
	s := openStore(t)
	_, err := s.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	must(t, err)
	u := newUsageCache(testLogger(t), s, time.Hour)
	u.walk = func(context.Context, string) (usage, error) { return usage{bytes: 1}, syscall.EIO }
	u.refresh(context.Background())
	snap, failures := u.snapshot(0)
	if failures == 0 || failures != int64(len(snap.allocs["a1"])) {
		t.Errorf("%d failures for %d volumes that cannot be read", failures, len(snap.allocs["a1"]))
	}
}
