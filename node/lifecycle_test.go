package node

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/allocfs/allocfs/api"
)

func migrateBody(id, prev, policy, mode string) string {
	b, _ := json.Marshal(api.CreateAllocRequest{ID: id, Tasks: []api.Task{{Name: "web"}}, Previous: prev, Migrate: policy, Mode: mode})
	return string(b)
}

// TestCreateMigrated checks the handover on create: refused (409) while
// the previous allocation runs, with nothing created; done once it is
// stopped, in both modes; refused again for an allocation already handed
// over; bad policies and modes are 400s.
func TestCreateMigrated(t *testing.T) {
	for _, mode := range []string{"adopt", "snapshot"} {
		t.Run(mode, func(t *testing.T) {
			backend, s := newTestServer(t)
			mustCreate(t, s, "a", "web")
			before := snapshotStore(t, backend)
			wantError(t, request(t, s, http.MethodPost, api.AllocsPath, migrateBody("b", "a", "migrate", mode)), http.StatusConflict)
			if after := snapshotStore(t, backend); !reflect.DeepEqual(after, before) {
				t.Errorf("a refused migration changed the backend:\nbefore %v\nafter  %v", before, after)
			}
			if rec := request(t, s, http.MethodPost, api.AllocsPath+"/a/stop", ""); rec.Code != http.StatusOK {
				t.Fatalf("stop a: %d %s", rec.Code, rec.Body)
			}
			rec := request(t, s, http.MethodPost, api.AllocsPath, migrateBody("b", "a", "sticky", mode))
			if rec.Code != http.StatusCreated {
				t.Fatalf("create b from a: %d %s", rec.Code, rec.Body)
			}
			var st api.Alloc
			decode(t, rec, &st)
			if st.Previous != "a" {
				t.Errorf("b's previous: got %q, want a", st.Previous)
			}
			a, err := backend.Get("a")
			if err != nil || a.MigratedTo != "b" || !a.Volumes["alloc/data"].ReadOnly {
				t.Errorf("a after the handover: %+v, %v; want migrated to b, data read-only", a, err)
			}
			wantError(t, request(t, s, http.MethodPost, api.AllocsPath, migrateBody("c", "a", "migrate", mode)), http.StatusConflict)
		})
	}
	_, s := newTestServer(t)
	mustCreate(t, s, "a", "web")
	for name, body := range map[string]string{
		"bad policy":          migrateBody("b", "a", "always", ""),
		"bad mode":            migrateBody("b", "a", "migrate", "copy"),
		"policy, no previous": migrateBody("b", "", "migrate", ""),
	} {
		t.Run(name, func(t *testing.T) {
			wantError(t, request(t, s, http.MethodPost, api.AllocsPath, body), http.StatusBadRequest)
		})
	}
	wantError(t, request(t, s, http.MethodPost, api.AllocsPath, migrateBody("b", "nope", "migrate", "")), http.StatusNotFound)
}

// TestGC checks collection: a running allocation is refused, a stopped
// one collected (and then gone: 410), and the node-wide GC collects every
// stopped allocation and nothing else.
func TestGC(t *testing.T) {
	backend, s := newTestServer(t)
	for _, id := range []string{"a", "b", "c"} {
		mustCreate(t, s, id, "web")
	}
	wantError(t, request(t, s, http.MethodPost, api.AllocsPath+"/a/gc", ""), http.StatusConflict)
	wantError(t, request(t, s, http.MethodPost, api.AllocsPath+"/nope/gc", ""), http.StatusNotFound)
	for _, id := range []string{"a", "b"} {
		if rec := request(t, s, http.MethodPost, api.AllocsPath+"/"+id+"/stop", ""); rec.Code != http.StatusOK {
			t.Fatalf("stop %s: %d", id, rec.Code)
		}
	}
	rec := request(t, s, http.MethodPost, api.AllocsPath+"/a/gc", "")
	var out api.GCResponse
	decode(t, rec, &out)
	if rec.Code != http.StatusOK || !reflect.DeepEqual(out.Collected, []string{"a"}) {
		t.Errorf("gc a: %d %v, want 200 [a]", rec.Code, out.Collected)
	}
	wantError(t, request(t, s, http.MethodGet, api.AllocsPath+"/a", ""), http.StatusGone)
	rec = request(t, s, http.MethodPost, api.GCPath, "")
	decode(t, rec, &out)
	if rec.Code != http.StatusOK || !reflect.DeepEqual(out.Collected, []string{"b"}) {
		t.Errorf("node gc: %d %v, want 200 [b]", rec.Code, out.Collected)
	}
	if _, err := backend.Get("c"); err != nil {
		t.Errorf("the running allocation after node gc: %v", err)
	}
}
