package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/gc"
	"github.com/allocfs/allocfs/migrate"
)

const testMount = "/test/mnt"

// testLogger writes to the test's log; see allocdirtest.Logger.
var testLogger = allocdirtest.Logger

// newTestServer opens a store in a temporary data dir and returns it with
// its control API. No mount is involved.
func newTestServer(t *testing.T, configure ...func(*Config)) (*store.Store, *api.Server) {
	t.Helper()
	s, _, srv := newTestService(t, configure...)
	return s, srv
}

// newTestService is newTestServer that returns the service too.
func newTestService(t *testing.T, configure ...func(*Config)) (*store.Store, *Service, *api.Server) {
	t.Helper()
	logger := testLogger(t)
	s, err := store.Open(logger, t.TempDir())
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	cfg := Config{Logger: logger, Store: s, GC: gc.DefaultConfig(), MountDir: testMount}
	for _, fn := range configure {
		fn(&cfg)
	}
	svc := New(cfg)
	t.Cleanup(svc.Wait)
	return s, svc, api.NewServer(logger, svc)
}

// request sends one request to h and returns the recorded answer.
func request(t *testing.T, h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// decode decodes the answer's body into v, failing the test if it is not
// JSON of that shape.
func decode(t *testing.T, rec *httptest.ResponseRecorder, v any) {
	t.Helper()
	if got := rec.Header().Get("Content-Type"); got != "application/json" {
		t.Errorf("Content-Type: got %q, want application/json", got)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("answer is not the expected JSON: %v\n%s", err, rec.Body)
	}
}

// wantError checks the status of an error answer and that its body is
// {"error": "<something>"}.
func wantError(t *testing.T, rec *httptest.ResponseRecorder, code int) {
	t.Helper()
	if rec.Code != code {
		t.Fatalf("status: got %d, want %d; body: %s", rec.Code, code, rec.Body)
	}
	var eb struct{ Error string }
	decode(t, rec, &eb)
	if eb.Error == "" {
		t.Errorf("error answer without a message: %s", rec.Body)
	}
}

// createBody is the JSON body of a create request.
func createBody(id string, tasks ...string) string {
	req := api.CreateAllocRequest{ID: id}
	for _, name := range tasks {
		req.Tasks = append(req.Tasks, api.Task{Name: name, SecretsMB: 1})
	}
	b, _ := json.Marshal(req)
	return string(b)
}

// mustCreate creates an allocation through the API.
func mustCreate(t *testing.T, h http.Handler, id string, tasks ...string) *api.Alloc {
	t.Helper()
	rec := request(t, h, http.MethodPost, api.AllocsPath, createBody(id, tasks...))
	if rec.Code != http.StatusCreated {
		t.Fatalf("create %s: got %d, want %d; body: %s", id, rec.Code, http.StatusCreated, rec.Body)
	}
	var st api.Alloc
	decode(t, rec, &st)
	return &st
}

// dirNames lists a directory of the data dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("ReadDir: %v", err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// snapshotStore records the names in state/ and layers/, which the tests
// use to check that a refused request left nothing behind.
func snapshotStore(t *testing.T, backend *store.Store) []string {
	t.Helper()
	var out []string
	for _, d := range []string{"state", "layers"} {
		for _, n := range dirNames(t, filepath.Join(backend.DataDir(), d)) {
			out = append(out, d+"/"+n)
		}
	}
	return out
}

// TestCreateAlloc: a valid create answers 201 with the new record, which
// the store then holds.
func TestCreateAlloc(t *testing.T) {
	backend, srv := newTestServer(t)
	rec := request(t, srv, http.MethodPost, api.AllocsPath, createBody("a1", "web", "db"))
	if rec.Code != http.StatusCreated {
		t.Fatalf("status: got %d, want %d; body: %s", rec.Code, http.StatusCreated, rec.Body)
	}
	if got, want := rec.Header().Get("Location"), api.AllocsPath+"/a1"; got != want {
		t.Errorf("Location: got %q, want %q", got, want)
	}
	var st api.Alloc
	decode(t, rec, &st)
	if st.ID != "a1" || st.Status != api.StatusRunning {
		t.Errorf("record: got id %q status %q, want a1 running", st.ID, st.Status)
	}
	// The store decides the full set of volumes; these are the ones the
	// layout cannot do without.
	for _, key := range []string{"alloc/data", "alloc/logs", "alloc/tmp", "db/local", "db/tmp", "web/local", "web/tmp"} {
		if v, ok := st.Volumes[key]; !ok || v.Upper == "" {
			t.Errorf("volume %s: missing from %v", key, st.Volumes)
		}
	}
	got, err := backend.Get("a1")
	if err != nil {
		t.Fatalf("store.Get after create: %v", err)
	}
	if len(got.Tasks) != 2 || got.Tasks[0].Name != "web" || got.Tasks[1].Name != "db" {
		t.Errorf("stored tasks: got %+v, want web, db", got.Tasks)
	}
}

// TestCreateAllocDuplicate: creating an ID twice answers 409 and leaves
// the first allocation as it was.
func TestCreateAllocDuplicate(t *testing.T) {
	backend, srv := newTestServer(t)
	first := mustCreate(t, srv, "a1", "web")
	before := snapshotStore(t, backend)

	rec := request(t, srv, http.MethodPost, api.AllocsPath, createBody("a1", "other"))
	wantError(t, rec, http.StatusConflict)

	if after := snapshotStore(t, backend); !slices.Equal(after, before) {
		t.Errorf("data dir changed: got %v, want %v", after, before)
	}
	st, err := backend.Get("a1")
	if err != nil {
		t.Fatalf("store.Get: %v", err)
	}
	if len(st.Tasks) != 1 || st.Tasks[0].Name != "web" {
		t.Errorf("tasks: got %+v, want only web", st.Tasks)
	}
	if st.Volumes["alloc/data"].Upper != first.Volumes["alloc/data"].Upper {
		t.Errorf("alloc/data layer: got %s, want %s", st.Volumes["alloc/data"].Upper, first.Volumes["alloc/data"].Upper)
	}
}

// TestCreateAllocBadRequest: invalid requests answer 400 and create
// nothing: no state file, no layer.
func TestCreateAllocBadRequest(t *testing.T) {
	cases := map[string]string{
		"slash in id":       createBody("a/b", "web"),
		"dot-dot id":        createBody("..", "web"),
		"dot id":            createBody(".", "web"),
		"empty id":          createBody("", "web"),
		"no tasks":          createBody("a1"),
		"null tasks":        `{"id":"a1","tasks":null}`,
		"task named alloc":  createBody("a1", "alloc"),
		"slash in task":     createBody("a1", "../x"),
		"duplicate task":    createBody("a1", "web", "web"),
		"malformed json":    `{"id":"a1",`,
		"unknown field":     `{"id":"a1","tasks":[{"Name":"web"}],"extra":1}`,
		"two json values":   createBody("a1", "web") + createBody("a2", "web"),
		"wrong type":        `{"id":1,"tasks":[]}`,
		"empty body":        ``,
		"id longer than fs": createBody(strings.Repeat("x", 251), "web"),
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			backend, srv := newTestServer(t)
			before := snapshotStore(t, backend)
			rec := request(t, srv, http.MethodPost, api.AllocsPath, body)
			wantError(t, rec, http.StatusBadRequest)
			if after := snapshotStore(t, backend); !slices.Equal(after, before) {
				t.Errorf("data dir changed: got %v, want %v", after, before)
			}
			if n := len(backend.List()); n != 0 {
				t.Errorf("store holds %d allocations, want 0", n)
			}
		})
	}
}

// TestCreateAllocNonPrintableNames: an ID or a task name holding a
// character that does not print as itself (every control character, DEL,
// C1 controls, invisible Unicode) answers 400 and creates nothing; so
// does a request naming such an ID. (Invalid UTF-8 cannot reach the
// server: JSON carries it as U+FFFD.)
func TestCreateAllocNonPrintableNames(t *testing.T) {
	var bad []string
	for r := rune(1); r < 0x20; r++ {
		bad = append(bad, string(r))
	}
	for r := rune(0x7f); r < 0xa0; r++ {
		bad = append(bad, string(r))
	}
	bad = append(bad, "\u00a0", "\u200b", "\u202e", "\u2028", "\ufeff", "\ue000")

	backend, srv := newTestServer(t)
	mustCreate(t, srv, "a1", "web")
	before := snapshotStore(t, backend)
	for _, c := range bad {
		for what, body := range map[string]string{
			"id":          createBody("a"+c+"2", "web"),
			"task":        createBody("a2", "web"+c),
			"second task": createBody("a2", "web", c+"db"),
		} {
			rec := request(t, srv, http.MethodPost, api.AllocsPath, body)
			if rec.Code != http.StatusBadRequest {
				t.Errorf("create with %U in the %s: got %d, want 400; body: %s", []rune(c)[0], what, rec.Code, rec.Body)
			}
		}
		path := api.AllocsPath + "/" + url.PathEscape("a1"+c)
		if rec := request(t, srv, http.MethodGet, path, ""); rec.Code != http.StatusBadRequest {
			t.Errorf("GET %s: got %d, want 400; body: %s", path, rec.Code, rec.Body)
		}
	}
	if after := snapshotStore(t, backend); !slices.Equal(after, before) {
		t.Errorf("data dir changed: got %v, want %v", after, before)
	}
	if ids := backend.List(); len(ids) != 1 || ids[0].ID != "a1" {
		t.Errorf("store holds %v, want only a1", ids)
	}
}

// TestCreateAllocUnknownUser: a task user this node does not have, by
// name or by uid, fails the create with 400 and the message `allocfs exec
// --user` gives (both come from allocdir.LookupUser), and nothing is
// created; a user the node has is accepted.
func TestCreateAllocUnknownUser(t *testing.T) {
	backend, srv := newTestServer(t)
	mustCreate(t, srv, "a1", "web")
	before := snapshotStore(t, backend)
	for _, name := range []string{"nosuchuser", "4000000000"} {
		_, lookupErr := allocdir.LookupUser(name)
		if lookupErr == nil {
			t.Fatalf("user %q exists on this machine; the test needs one that does not", name)
		}
		req := api.CreateAllocRequest{ID: "a2", Tasks: []api.Task{{Name: "db"}, {Name: "web", User: name}}}
		body, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range []string{api.AllocsPath, api.AllocsPath + "?progress=1"} {
			rec := request(t, srv, http.MethodPost, path, string(body))
			wantError(t, rec, http.StatusBadRequest)
			var eb struct{ Error string }
			decode(t, rec, &eb)
			if !strings.HasSuffix(eb.Error, lookupErr.Error()) {
				t.Errorf("POST %s with user %q: got message %q, want it to end with exec's %q", path, name, eb.Error, lookupErr)
			}
		}
	}
	if after := snapshotStore(t, backend); !slices.Equal(after, before) {
		t.Errorf("data dir changed: got %v, want %v", after, before)
	}
	if _, err := backend.Get("a2"); !errors.Is(err, allocdir.ErrUnknownAlloc) {
		t.Errorf("store.Get(a2): got %v, want ErrUnknownAlloc", err)
	}

	req := api.CreateAllocRequest{ID: "a3", Tasks: []api.Task{{Name: "web", User: "root"}}}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if rec := request(t, srv, http.MethodPost, api.AllocsPath, string(body)); rec.Code != http.StatusCreated {
		t.Errorf("create with user root: got %d, want 201; body: %s", rec.Code, rec.Body)
	}
}

// TestListAllocs: the list holds every allocation, sorted by ID, and is
// an empty JSON array (not null) when there is none.
func TestListAllocs(t *testing.T) {
	_, srv := newTestServer(t)
	rec := request(t, srv, http.MethodGet, api.AllocsPath, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("status: got %d, want 200", rec.Code)
	}
	if got := strings.TrimSpace(rec.Body.String()); got != "[]" {
		t.Errorf("empty list: got %s, want []", got)
	}

	mustCreate(t, srv, "b2", "web")
	mustCreate(t, srv, "a1", "web")
	rec = request(t, srv, http.MethodGet, api.AllocsPath, "")
	var list []*api.Alloc
	decode(t, rec, &list)
	var ids []string
	for _, st := range list {
		ids = append(ids, st.ID)
	}
	if want := []string{"a1", "b2"}; !slices.Equal(ids, want) {
		t.Errorf("ids: got %v, want %v", ids, want)
	}
}

// TestAllocStatus: the status carries the record, the mount path, the
// passthrough flag and, per volume, what its upper layer holds on the
// backing store.
func TestAllocStatus(t *testing.T) {
	backend, srv := newTestServer(t)
	st := mustCreate(t, srv, "a1", "web")

	data := backend.LayerPath(st.Volumes["alloc/data"].Upper)
	if err := os.WriteFile(filepath.Join(data, "f"), []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(data, "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "d", "e", "g"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	// A symlink counts as a file, and its target is not followed.
	if err := os.Symlink("/etc/passwd", filepath.Join(data, "link")); err != nil {
		t.Fatal(err)
	}

	rec := request(t, srv, http.MethodGet, api.AllocsPath+"/a1", "")
	if rec.Code != http.StatusOK {
		t.Fatalf("status: got %d, want 200; body: %s", rec.Code, rec.Body)
	}
	var got api.AllocStatus
	decode(t, rec, &got)
	if got.ID != "a1" || got.Status != api.StatusRunning || len(got.Tasks) != 1 {
		t.Errorf("record: got %+v", got.Alloc)
	}
	if want := filepath.Join(testMount, "a1"); got.Mount != want {
		t.Errorf("mount: got %q, want %q", got.Mount, want)
	}
	if got.Passthrough {
		t.Errorf("passthrough: got true, want false")
	}
	if len(got.Layers) != len(st.Volumes) {
		t.Errorf("layers: got %d entries, want %d (one per volume)", len(got.Layers), len(st.Volumes))
	}
	d := got.Layers["alloc/data"]
	if d.Upper != st.Volumes["alloc/data"].Upper {
		t.Errorf("alloc/data upper: got %q, want %q", d.Upper, st.Volumes["alloc/data"].Upper)
	}
	if d.Bytes != 1005 || d.Files != 3 {
		t.Errorf("alloc/data usage: got %d bytes in %d files, want 1005 bytes in 3 files", d.Bytes, d.Files)
	}
	if l := got.Layers["alloc/logs"]; l.Bytes != 0 || l.Files != 0 {
		t.Errorf("alloc/logs usage: got %d bytes in %d files, want empty", l.Bytes, l.Files)
	}
}

// TestDestroyAlloc: destroy answers 204 and removes the allocation's
// layers; afterwards the allocation is gone (410), not unknown.
func TestDestroyAlloc(t *testing.T) {
	backend, srv := newTestServer(t)
	st := mustCreate(t, srv, "a1", "web")
	mustCreate(t, srv, "a2", "web")

	rec := request(t, srv, http.MethodDelete, api.AllocsPath+"/a1", "")
	if rec.Code != http.StatusNoContent {
		t.Fatalf("status: got %d, want 204; body: %s", rec.Code, rec.Body)
	}
	if rec.Body.Len() != 0 {
		t.Errorf("204 with a body: %s", rec.Body)
	}
	for key, v := range st.Volumes {
		if _, err := os.Lstat(backend.LayerPath(v.Upper)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer of %s still there after destroy: %v", key, err)
		}
	}
	wantError(t, request(t, srv, http.MethodGet, api.AllocsPath+"/a1", ""), http.StatusGone)
	wantError(t, request(t, srv, http.MethodDelete, api.AllocsPath+"/a1", ""), http.StatusGone)

	var list []*api.Alloc
	decode(t, request(t, srv, http.MethodGet, api.AllocsPath, ""), &list)
	if len(list) != 1 || list[0].ID != "a2" {
		t.Errorf("list after destroy: got %d allocations, want only a2", len(list))
	}
}

// TestUnknownAlloc: an ID the daemon never knew answers 404; one that
// cannot be an ID answers 400.
func TestUnknownAlloc(t *testing.T) {
	_, srv := newTestServer(t)
	wantError(t, request(t, srv, http.MethodGet, api.AllocsPath+"/nope", ""), http.StatusNotFound)
	wantError(t, request(t, srv, http.MethodDelete, api.AllocsPath+"/nope", ""), http.StatusNotFound)
	wantError(t, request(t, srv, http.MethodGet, api.AllocsPath+"/a%2Fb", ""), http.StatusBadRequest)
	wantError(t, request(t, srv, http.MethodDelete, api.AllocsPath+"/%2E%2E", ""), http.StatusBadRequest)
}

// TestNodeStatus: the node status reports the data dir, the mount, the
// allocation count and the backing filesystem.
func TestNodeStatus(t *testing.T) {
	backend, srv := newTestServer(t)
	mustCreate(t, srv, "a1", "web")
	rec := request(t, srv, http.MethodGet, api.StatusPath, "")
	if rec.Code != http.StatusOK {
		t.Fatalf("status: got %d, want 200; body: %s", rec.Code, rec.Body)
	}
	var got api.NodeStatus
	decode(t, rec, &got)
	if got.DataDir != backend.DataDir() || got.Mount != testMount || got.Allocs != 1 || got.Passthrough {
		t.Errorf("got %+v, want data dir %q, mount %q, 1 alloc, no passthrough", got, backend.DataDir(), testMount)
	}
	if got.Backing.BytesTotal == 0 || got.Backing.BlockSize == 0 || got.Backing.NameMax == 0 {
		t.Errorf("backing statfs numbers missing: %+v", got.Backing)
	}
	if got.Backing.BytesAvailable > got.Backing.BytesTotal {
		t.Errorf("backing: %d bytes available of %d", got.Backing.BytesAvailable, got.Backing.BytesTotal)
	}
}

// TestStatusCode: the store's and the fetcher's sentinels, classified by
// the service, map to their status; anything else is the daemon's fault.
func TestStatusCode(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("x: %w", allocdir.ErrInvalidName), http.StatusBadRequest},
		{fmt.Errorf("x: %w", store.ErrNoTasks), http.StatusBadRequest},
		{fmt.Errorf("x: %w", api.ErrBadRequest), http.StatusBadRequest},
		{fmt.Errorf("x: %w", store.ErrExists), http.StatusConflict},
		{fmt.Errorf("x: %w", store.ErrPinned), http.StatusConflict},
		{fmt.Errorf("x: %w", store.ErrNotTerminal), http.StatusConflict},
		{fmt.Errorf("x: %w", migrate.ErrPermissionDenied), http.StatusForbidden},
		{fmt.Errorf("x: %w", migrate.ErrIntegrity), http.StatusBadGateway},
		{fmt.Errorf("x: %w", &migrate.StatusError{StatusCode: 503, Message: "overloaded"}), http.StatusBadGateway},
		{fmt.Errorf("x: %w", &migrate.StatusError{StatusCode: 404}), http.StatusNotFound},
		{fmt.Errorf("x: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}), http.StatusBadGateway},
		{fmt.Errorf("x: %w", migrate.ErrDeadline), http.StatusBadGateway},
		{fmt.Errorf("x: %w", allocdir.ErrUnknownAlloc), http.StatusNotFound},
		{fmt.Errorf("x: %w", allocdir.ErrGone), http.StatusGone},
		{errors.Join(allocdir.ErrUnknownAlloc, allocdir.ErrGone), http.StatusGone},
		{os.ErrPermission, http.StatusInternalServerError},
		{errors.New("disk on fire"), http.StatusInternalServerError},
	}
	for _, c := range cases {
		if got := api.StatusCode(classify(c.err)); got != c.want {
			t.Errorf("api.StatusCode(%v): got %d, want %d", c.err, got, c.want)
		}
	}
}

// TestMethodNotAllowed: a known path with the wrong method is refused
// and changes nothing.
func TestMethodNotAllowed(t *testing.T) {
	backend, srv := newTestServer(t)
	rec := request(t, srv, http.MethodPut, api.AllocsPath, createBody("a1", "web"))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("status: got %d, want 405", rec.Code)
	}
	if n := len(backend.List()); n != 0 {
		t.Errorf("store holds %d allocations, want 0", n)
	}
}

// TestWireNaming: every field of the control API's answers is named in
// snake_case, and a running allocation shows no stop time (no zero time
// anywhere); once stopped, it does.
func TestWireNaming(t *testing.T) {
	_, srv := newTestServer(t)
	mustCreate(t, srv, "a1", "web")
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	var keys func(v any, where string)
	keys = func(v any, where string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				// Volumes and layers are keyed by their path in the
				// allocation ("." its own directory), not named.
				byPath := strings.HasSuffix(where, ".volumes") || strings.HasSuffix(where, ".layers")
				if !snake.MatchString(k) && !byPath {
					t.Errorf("%s: field %q is not snake_case", where, k)
				}
				keys(x, where+"."+k)
			}
		case []any:
			for _, x := range v {
				keys(x, where+"[]")
			}
		}
	}
	for _, path := range []string{api.AllocsPath, api.AllocsPath + "/a1", api.StatusPath} {
		rec := request(t, srv, http.MethodGet, path, "")
		var v any
		decode(t, rec, &v)
		keys(v, path)
		if strings.Contains(rec.Body.String(), "0001-01-01") || strings.Contains(rec.Body.String(), `"stopped"`) {
			t.Errorf("GET %s of a running allocation shows a stop time: %s", path, rec.Body)
		}
	}
	rec := request(t, srv, http.MethodPost, api.AllocsPath+"/a1/stop", "")
	var a api.Alloc
	decode(t, rec, &a)
	if a.Stopped == nil || a.Stopped.IsZero() {
		t.Errorf("a stopped allocation has no stop time: %s", rec.Body)
	}
}
