package node

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/gc"
	"github.com/allocfs/allocfs/fs/store/record"
)

func sizedBody(id string, diskMB int64, prev, policy, mode string) string {
	b, _ := json.Marshal(api.CreateAllocRequest{ID: id, Tasks: []api.Task{{Name: "web"}}, DiskMB: diskMB, Previous: prev, Migrate: policy, Mode: mode})
	return string(b)
}

// TestDiskLimitRefusedWhereUnenforceable: a node whose data dir cannot
// enforce a limit refuses an allocation that asks for one (400), and
// changes nothing; a bad size is refused everywhere.
func TestDiskLimitRefusedWhereUnenforceable(t *testing.T) {
	backend, s := newTestServer(t)
	before := snapshotStore(t, backend)
	for _, mb := range []int64{16, -1, 1 << 50} {
		wantError(t, request(t, s, http.MethodPost, api.AllocsPath, sizedBody("a", mb, "", "", "")), http.StatusBadRequest)
	}
	if after := snapshotStore(t, backend); !reflect.DeepEqual(after, before) {
		t.Errorf("a refused create changed the backend:\nbefore %v\nafter  %v", before, after)
	}
	var ns api.NodeStatus
	rec := request(t, s, http.MethodGet, api.StatusPath, "")
	decode(t, rec, &ns)
	if ns.Quota.Enforced || ns.Quota.Why == "" {
		t.Fatalf("node status of a node without quotas: %+v", ns.Quota)
	}
}

// TestDiskLimitThroughTheAPI: on a btrfs data dir with quotas, the size
// a create asks for is the allocation's limit, its status shows limit
// and usage, a migration takes its own size, and the node says what
// enforces limits.
func TestDiskLimitThroughTheAPI(t *testing.T) {
	img := fstest.Image(t, "btrfs", 300, "")
	logger := testLogger(t)
	backend, err := store.OpenWith(logger, filepath.Join(img, "data"), store.Options{Quotas: true, DefaultLimit: record.Limit{Bytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	svc := New(Config{Logger: logger, Store: backend, GC: gc.DefaultConfig(), MountDir: testMount})
	t.Cleanup(svc.Wait)
	s := api.NewServer(logger, svc)

	if rec := request(t, s, http.MethodPost, api.AllocsPath, sizedBody("a", 16, "", "", "")); rec.Code != http.StatusCreated {
		t.Fatalf("create a: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, s, http.MethodPost, api.AllocsPath, sizedBody("d", 0, "", "", "")); rec.Code != http.StatusCreated {
		t.Fatalf("create d: %d %s", rec.Code, rec.Body)
	}
	status := func(id string) api.AllocStatus {
		var st api.AllocStatus
		rec := request(t, s, http.MethodGet, api.AllocsPath+"/"+id, "")
		if rec.Code != http.StatusOK {
			t.Fatalf("status of %s: %d %s", id, rec.Code, rec.Body)
		}
		decode(t, rec, &st)
		return st
	}
	if d := status("a").Disk; d == nil || d.LimitBytes != 16<<20 || d.Mechanism != "btrfs qgroups" {
		t.Fatalf("a's disk: %+v", d)
	}
	if d := status("d").Disk; d == nil || d.LimitBytes != 8<<20 {
		t.Fatalf("the default limit: %+v", d)
	}
	if rec := request(t, s, http.MethodPost, api.AllocsPath+"/a/stop", ""); rec.Code != http.StatusOK {
		t.Fatalf("stop a: %d %s", rec.Code, rec.Body)
	}
	if rec := request(t, s, http.MethodPost, api.AllocsPath, sizedBody("b", 32, "a", "migrate", "adopt")); rec.Code != http.StatusCreated {
		t.Fatalf("create b from a: %d %s", rec.Code, rec.Body)
	}
	if d := status("b").Disk; d == nil || d.LimitBytes != 32<<20 {
		t.Fatalf("b's disk: %+v", d)
	}
	// btrfs counts no inodes: a limit on them is refused, not ignored.
	body, _ := json.Marshal(api.CreateAllocRequest{ID: "c", Tasks: []api.Task{{Name: "web"}}, DiskInodes: 1000})
	wantError(t, request(t, s, http.MethodPost, api.AllocsPath, string(body)), http.StatusBadRequest)
	if _, err := backend.Get("c"); err == nil {
		t.Fatal("a refused create left its allocation")
	}
	var ns api.NodeStatus
	decode(t, request(t, s, http.MethodGet, api.StatusPath, ""), &ns)
	if !ns.Quota.Enforced || ns.Quota.Mechanism != "btrfs qgroups" || ns.Quota.Filesystem != "btrfs" || ns.Quota.DefaultMB != 8 {
		t.Fatalf("node status: %+v", ns.Quota)
	}
}
