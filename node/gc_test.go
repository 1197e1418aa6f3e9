package node

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/gc"
)

// chain makes a0 ... a<n-1>, each a snapshot-mode migration of the one
// before, stopped before the next is made, and writes a file into each
// generation's data. The last one runs; its alloc/data stacks n-1 lower
// layers, more than store.MaxLowers when n > 5.
func chain(t *testing.T, svc *Service, s *store.Store, n int) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("a%d", i)
		req := api.CreateAllocRequest{ID: id, Tasks: []api.Task{{Name: "web"}}}
		if i > 0 {
			req.Previous, req.Migrate, req.Mode = ids[i-1], "migrate", "snapshot"
		}
		a, err := svc.Create(ctx, req, nil)
		if err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
		f := filepath.Join(s.LayerPath(a.Volumes["alloc/data"].Upper), fmt.Sprintf("gen%d", i))
		if err := os.WriteFile(f, []byte(id), 0o644); err != nil {
			t.Fatal(err)
		}
		if i < n-1 {
			if _, err := svc.Stop(ctx, id); err != nil {
				t.Fatalf("stop %s: %v", id, err)
			}
		}
		ids = append(ids, id)
	}
	return ids
}

// live returns the IDs the store still holds.
func live(s *store.Store) []string {
	var ids []string
	for _, st := range s.List() {
		ids = append(ids, st.ID)
	}
	return ids
}

// lowers is how many lower layers the running allocation's alloc/data
// stacks.
func lowers(t *testing.T, s *store.Store, id string) int {
	t.Helper()
	st, err := s.Get(id)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return len(st.Volumes["alloc/data"].Lowers)
}

// TestOneCollector: garbage collection asked for over the control API
// (what `allocfs gc` sends), over Nomad's client API, and by the timer
// goes through the node's one collector: a pinned allocation (a snapshot
// streaming to another node) survives every one of them, the others are
// collected, and once the pin is gone the next collection takes it and
// flattens the running allocation's stack to at most store.MaxLowers.
func TestOneCollector(t *testing.T) {
	routes := map[string]func(t *testing.T, srv http.Handler, svc *Service, s *store.Store, want []string){
		"control API": func(t *testing.T, srv http.Handler, _ *Service, _ *store.Store, _ []string) {
			if rec := request(t, srv, http.MethodPost, api.GCPath, ""); rec.Code != http.StatusOK {
				t.Fatalf("POST %s: %d %s", api.GCPath, rec.Code, rec.Body)
			}
		},
		// Sent by Nomad's own Go client, as `nomad system gc`-style
		// tooling sends it to a node (no Nomad agent runs here: the
		// client library is the closest real artifact).
		"Nomad's client API": func(t *testing.T, srv http.Handler, _ *Service, _ *store.Store, _ []string) {
			if err := nomadClient(t, srv).Nodes().GC("", nil); err != nil {
				t.Fatalf("Nomad's client: Nodes().GC: %v", err)
			}
		},
		"timer": func(t *testing.T, _ http.Handler, svc *Service, s *store.Store, want []string) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				svc.Run(ctx)
			}()
			defer func() {
				cancel()
				<-done
			}()
			deadline := time.Now().Add(20 * time.Second)
			for !slices.Equal(live(s), want) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			// A few more passes, for a pinned allocation to be wrongly
			// taken by.
			time.Sleep(100 * time.Millisecond)
		},
	}
	for name, trigger := range routes {
		t.Run(name, func(t *testing.T) {
			s, svc, srv := newTestService(t, func(c *Config) {
				// The timer's trigger: more allocations than one.
				c.GC = gc.Config{Interval: 10 * time.Millisecond, MaxAllocs: 1}
			})
			ids := chain(t, svc, s, 7)
			if n := lowers(t, s, ids[6]); n <= store.MaxLowers {
				t.Fatalf("%s stacks %d lowers before any collection, want more than %d", ids[6], n, store.MaxLowers)
			}
			unpin, err := s.Pin("a3")
			if err != nil {
				t.Fatal(err)
			}
			trigger(t, srv, svc, s, []string{"a3", "a6"})
			if got := live(s); !slices.Equal(got, []string{"a3", "a6"}) {
				t.Fatalf("after GC with a3 pinned: the store holds %v, want [a3 a6]", got)
			}
			unpin()
			trigger(t, srv, svc, s, []string{"a6"})
			if got := live(s); !slices.Equal(got, []string{"a6"}) {
				t.Fatalf("after GC with no pin: the store holds %v, want [a6]", got)
			}
			if n := lowers(t, s, "a6"); n > store.MaxLowers {
				t.Errorf("after GC a6 stacks %d lowers, want at most %d: the collection did not flatten", n, store.MaxLowers)
			}
			// Nothing a generation wrote is lost by the merges.
			st, _ := s.Get("a6")
			v := st.Volumes["alloc/data"]
			for i := range 7 {
				found := false
				for _, l := range append([]string{v.Upper}, v.Lowers...) {
					if _, err := os.Lstat(filepath.Join(s.LayerPath(l), fmt.Sprintf("gen%d", i))); err == nil {
						found = true
					}
				}
				if !found {
					t.Errorf("gen%d is in no layer of a6's alloc/data after the flatten", i)
				}
			}
		})
	}
}
