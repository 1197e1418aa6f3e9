package node

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/api"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
)

// serveUnix serves h on a unix socket in a temporary directory until the
// test ends and returns the socket path.
func serveUnix(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return sock
}

// TestClientRoundTrip: the client drives every endpoint over a unix
// socket, and its errors match the store's sentinels.
func TestClientRoundTrip(t *testing.T) {
	s, srv := newTestServer(t)
	c := api.NewClient(serveUnix(t, srv))
	defer c.Close()
	ctx := context.Background()

	st, err := c.CreateAlloc(ctx, "a1", []api.Task{{Name: "web", SecretsMB: 2, User: "nobody"}})
	if err != nil {
		t.Fatalf("CreateAlloc: %v", err)
	}
	if st.ID != "a1" || len(st.Tasks) != 1 || st.Tasks[0] != (api.Task{Name: "web", SecretsMB: 2, User: "nobody"}) {
		t.Errorf("CreateAlloc: got %+v", st)
	}
	if _, err := c.CreateAlloc(ctx, "a1", []api.Task{{Name: "web"}}); !errors.Is(err, api.ErrConflict) {
		t.Errorf("duplicate CreateAlloc: got %v, want api.ErrConflict", err)
	}
	if _, err := c.CreateAlloc(ctx, "a/b", []api.Task{{Name: "web"}}); !errors.Is(err, api.ErrBadRequest) {
		t.Errorf("CreateAlloc a/b: got %v, want api.ErrBadRequest", err)
	}
	if _, err := c.CreateAlloc(ctx, "a2", nil); !errors.Is(err, api.ErrBadRequest) || !strings.Contains(err.Error(), store.ErrNoTasks.Error()) {
		t.Errorf("CreateAlloc without tasks: got %v, want api.ErrBadRequest carrying the server's message", err)
	}

	list, err := c.ListAllocs(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "a1" {
		t.Errorf("ListAllocs: got %v, %v; want [a1]", list, err)
	}

	status, err := c.AllocStatus(ctx, "a1")
	if err != nil {
		t.Fatalf("api.AllocStatus: %v", err)
	}
	if status.Mount != filepath.Join(testMount, "a1") || status.Layers["alloc/data"].Upper != st.Volumes["alloc/data"].Upper {
		t.Errorf("api.AllocStatus: got mount %q, layers %+v", status.Mount, status.Layers)
	}
	raw, err := c.AllocStatusJSON(ctx, "a1")
	if err != nil || !strings.Contains(string(raw), `"passthrough": false`) {
		t.Errorf("api.AllocStatusJSON: got %s, %v", raw, err)
	}

	node, err := c.NodeStatus(ctx)
	if err != nil || node.Allocs != 1 || node.DataDir != s.DataDir() {
		t.Errorf("api.NodeStatus: got %+v, %v", node, err)
	}

	if err := c.DestroyAlloc(ctx, "a1"); err != nil {
		t.Fatalf("DestroyAlloc: %v", err)
	}
	_, err = c.AllocStatus(ctx, "a1")
	if !errors.Is(err, allocdir.ErrGone) || !errors.Is(err, allocdir.ErrUnknownAlloc) {
		t.Errorf("api.AllocStatus after destroy: got %v, want ErrGone", err)
	}
	err = c.DestroyAlloc(ctx, "never")
	if !errors.Is(err, allocdir.ErrUnknownAlloc) || errors.Is(err, allocdir.ErrGone) {
		t.Errorf("DestroyAlloc of an unknown ID: got %v, want ErrUnknownAlloc only", err)
	}
	var apiErr *api.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Errorf("DestroyAlloc of an unknown ID: got %#v, want *Error with 404", err)
	}
}

// TestClientUnreachable: with nothing listening, every call fails with an
// error that names the socket and says what to check.
func TestClientUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "missing.sock")
	c := api.NewClient(sock)
	_, err := c.ListAllocs(context.Background())
	var ue *api.UnreachableError
	if !errors.As(err, &ue) {
		t.Fatalf("got %v, want *api.UnreachableError", err)
	}
	want := "cannot reach allocfs at " + sock + ": is `allocfs serve` running?"
	if !strings.HasPrefix(err.Error(), want) {
		t.Errorf("message: got %q, want it to start with %q", err.Error(), want)
	}
}
