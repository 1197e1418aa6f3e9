package node

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	nomadapi "github.com/hashicorp/nomad/api"
)

// fakeNomad answers GET /v1/allocation/<id> as a Nomad agent does, with
// Nomad's own api.Allocation marshalled: no Nomad agent can run here, and
// its wire types are the closest real artifact. allocs maps IDs to the
// ephemeral_disk.size of their task group; an ID missing is a 404, and
// the first fail requests of each ID are 500s.
func fakeNomad(t *testing.T, allocs map[string]int, fail int) (addr string, token *atomic.Value) {
	t.Helper()
	token = &atomic.Value{}
	token.Store("")
	tries := make(map[string]int)
	var mu = make(chan struct{}, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := strings.CutPrefix(r.URL.Path, "/v1/allocation/")
		if r.Method != http.MethodGet || !ok {
			http.NotFound(w, r)
			return
		}
		if want := token.Load().(string); want != "" && r.Header.Get("X-Nomad-Token") != want {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		mu <- struct{}{}
		tries[id]++
		n := tries[id]
		<-mu
		if n <= fail {
			http.Error(w, "rpc error: no leader", http.StatusInternalServerError)
			return
		}
		size, ok := allocs[id]
		if !ok {
			http.Error(w, "alloc not found", http.StatusNotFound)
			return
		}
		group, other := "web", "db"
		a := nomadapi.Allocation{ID: id, TaskGroup: group, Job: &nomadapi.Job{TaskGroups: []*nomadapi.TaskGroup{
			{Name: &other, EphemeralDisk: &nomadapi.EphemeralDisk{SizeMB: new(int)}},
			{Name: &group, EphemeralDisk: &nomadapi.EphemeralDisk{SizeMB: &size}},
		}}}
		w.Header().Set("X-Nomad-Index", "7")
		json.NewEncoder(w).Encode(a)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, token
}

func waitLimit(t *testing.T, s *store.Store, id string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Disk != nil && st.Disk.Bytes == want && st.Disk.From == record.FromNomad {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's limit: %+v, want %d bytes from Nomad", id, st.Disk, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNomadSizes: an allocation Nomad's client makes through the mount
// gets its task group's ephemeral_disk.size from Nomad's API, through
// Nomad's own client, with the ACL token, after Nomad's errors; one
// Nomad does not know keeps the node's default; a restart asks again
// for what was not sized.
func TestNomadSizes(t *testing.T) {
	img := fstest.Image(t, "btrfs", 300, "")
	logger := testLogger(t)
	s, err := store.OpenWith(logger, filepath.Join(img, "data"), store.Options{Quotas: true, DefaultLimit: record.Limit{Bytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	addr, token := fakeNomad(t, map[string]int{"a1": 300, "a3": 150}, 2)
	token.Store("s3cret")
	cfg := nomadapi.DefaultConfig()
	cfg.Address, cfg.SecretID = addr, "s3cret"
	sizes, err := NewNomadSizes(logger, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sizes.Pause = time.Millisecond
	t.Cleanup(sizes.Close)

	for _, id := range []string{"a1", "unknown"} {
		if _, err := s.CreateFromMount(id, 0o755, 0, 0); err != nil {
			t.Fatal(err)
		}
		sizes.Created(id)
	}
	waitLimit(t, s, "a1", 300<<20)
	sizes.Close()
	if st, _ := s.Get("unknown"); st.Disk == nil || st.Disk.Bytes != 8<<20 || st.Disk.From != record.FromDefault {
		t.Fatalf("an allocation Nomad does not know: %+v, want the default", st.Disk)
	}

	// A restart: a3 was made while no daemon asked.
	if _, err := s.CreateFromMount("a3", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	again, err := NewNomadSizes(logger, s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	again.Pause = time.Millisecond
	t.Cleanup(again.Close)
	again.Resume()
	waitLimit(t, s, "a3", 150<<20)
	waitLimit(t, s, "a1", 300<<20)

	// A wrong token is refused by Nomad: the allocation keeps its
	// default.
	bad := nomadapi.DefaultConfig()
	bad.Address, bad.SecretID = addr, "wrong"
	wrong, err := NewNomadSizes(logger, s, bad)
	if err != nil {
		t.Fatal(err)
	}
	wrong.Attempts, wrong.Pause = 2, time.Millisecond
	if _, err := wrong.SizeOf("a1"); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("SizeOf with a wrong token: %v", err)
	}
}
