package gc

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sync"
	"testing"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/storetest"
)

// layerID matches a layer's ID, random per data dir.
var layerID = regexp.MustCompile(`\b[0-9a-f]{16}\b`)

// TestCollectorPassSteps ties the store's crash test of a collection
// (fs/store, case "gc"), which cannot import this package, to what a pass
// of the collector asks of the store: on the same setup, a terminal
// allocation with data beside a running one, CollectAll takes exactly the
// steps on disk that the crash test's sequence takes (Destroy, Sweep,
// Flatten, Resettle), so that a crash at each of those is a crash at each
// step of a real pass.
func TestCollectorPassSteps(t *testing.T) {
	trail := func(pass func(s *store.Store) error) []string {
		dir := filepath.Join(t.TempDir(), "data")
		// Each step on disk, named by its path relative to the data
		// dir with layer IDs written as L.
		var (
			mu    sync.Mutex
			steps []string
		)
		d := storetest.FaultDisk{Fn: func(op, p string) error {
			if rel, err := filepath.Rel(dir, p); err == nil {
				p = rel
			}
			mu.Lock()
			steps = append(steps, op+" "+layerID.ReplaceAllString(p, "L"))
			mu.Unlock()
			return nil
		}}
		s := openStore(t, dir, store.Options{Disk: d})
		defer func() { storetest.Must(t, s.Close()) }()
		for _, id := range []string{"a", "c"} {
			storetest.Must(t, storetest.ErrOnly(s.Create(id, storetest.Tasks("web"), store.CreateOptions{})))
		}
		upper := s.LayerPath(mustVolume(t, s, "a", "alloc/data"))
		storetest.MustWrite(t, filepath.Join(upper, "data.txt"), "precious", 0o644)
		storetest.Must(t, storetest.ErrOnly(s.Stop("a")))
		mu.Lock()
		steps = nil
		mu.Unlock()
		if err := pass(s); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get("a"); err == nil {
			t.Fatal("a outlived the pass")
		}
		if _, err := os.Stat(upper); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a's layer outlived the pass: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		return steps
	}
	collector := trail(func(s *store.Store) error {
		_, err := NewCollector(allocdirtest.Logger(t), s, DefaultConfig()).CollectAll("test")
		return err
	})
	direct := trail(func(s *store.Store) error {
		err := s.Destroy("a")
		_, serr := s.Sweep()
		_, ferr := s.Flatten()
		return errors.Join(err, serr, ferr, s.Resettle())
	})
	if len(collector) == 0 {
		t.Fatal("a collection took no step on disk: the trail records nothing")
	}
	if !reflect.DeepEqual(collector, direct) {
		t.Errorf("a pass of the collector takes other steps than the crash test's sequence:\ncollector: %q\nsequence:  %q", collector, direct)
	}
}

// mustVolume returns the upper layer of volume key of allocation id.
func mustVolume(t *testing.T, s *store.Store, id, key string) string {
	t.Helper()
	st, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return st.Volumes[key].Upper
}
