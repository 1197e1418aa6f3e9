package node

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/store"
	nomadapi "github.com/hashicorp/nomad/api"
)

// nomadClient is Nomad's own Go client, pointed at the node's API served
// by srv.
func nomadClient(t *testing.T, srv http.Handler) *nomadapi.Client {
	t.Helper()
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	c, err := nomadapi.NewClient(&nomadapi.Config{Address: ts.URL})
	if err != nil {
		t.Fatalf("Nomad's api.NewClient: %v", err)
	}
	return c
}

// TestNomadClientCollectsAnAllocation: Nomad's Go client asks a node to
// collect one allocation (Nodes().GcAlloc, GET
// /v1/client/allocation/<id>/gc) and succeeds unchanged, as against a
// Nomad agent: the answer is Nomad's, an empty 200. A running allocation
// and an unknown one are refused with the error Nomad's client reports,
// and nothing is collected. No Nomad agent runs here; the client library
// is the closest real artifact.
func TestNomadClientCollectsAnAllocation(t *testing.T) {
	s, svc, srv := newTestService(t)
	ctx := context.Background()
	for _, id := range []string{"running", "stopped"} {
		if _, err := svc.Create(ctx, api.CreateAllocRequest{ID: id, Tasks: []api.Task{{Name: "web"}}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.Stop(ctx, "stopped"); err != nil {
		t.Fatal(err)
	}
	nodes := nomadClient(t, srv).Nodes()
	if err := nodes.GcAlloc("stopped", nil); err != nil {
		t.Fatalf("Nodes().GcAlloc of a stopped allocation: %v", err)
	}
	if got := live(s); !slices.Equal(got, []string{"running"}) {
		t.Fatalf("after the collection the store holds %v, want [running]", got)
	}
	for id, want := range map[string]int{"running": http.StatusConflict, "nope": http.StatusNotFound} {
		err := nodes.GcAlloc(id, nil)
		var resp nomadapi.UnexpectedResponseError
		if !errors.As(err, &resp) || resp.StatusCode() != want || resp.Body() == "" {
			t.Errorf("Nodes().GcAlloc(%q): %v, want Nomad's client's error for a %d with a message", id, err, want)
		}
	}
	if got := live(s); !slices.Equal(got, []string{"running"}) {
		t.Errorf("after the refused collections the store holds %v, want [running]", got)
	}
	if err := nodes.GC("", nil); err != nil {
		t.Errorf("Nodes().GC with nothing to collect: %v", err)
	}
}

// TestMountAllocationsAreNomads: an allocation Nomad's client made
// through the mount is not the node's to stop, destroy or collect: each
// is refused as a conflict, with the reason, and the allocation stays;
// the node's collection passes it by, and the wire says where it came
// from.
func TestMountAllocationsAreNomads(t *testing.T) {
	s, svc, _ := newTestService(t)
	ctx := context.Background()
	if _, err := s.CreateFromMount("nomads", 0o755, 0, 0); err != nil {
		t.Fatal(err)
	}
	for verb, call := range map[string]func() error{
		"stop":    func() error { _, err := svc.Stop(ctx, "nomads"); return err },
		"destroy": func() error { return svc.Destroy(ctx, "nomads") },
		"collect": func() error { return svc.Collect(ctx, "nomads", "test") },
	} {
		if err := call(); !errors.Is(err, api.ErrConflict) || !errors.Is(err, store.ErrOwnedByMount) {
			t.Errorf("%s of Nomad's allocation: %v, want a conflict saying it was made through the mount", verb, err)
		}
	}
	if _, err := s.Stop("nomads"); err != nil {
		t.Fatal(err)
	}
	if got, err := svc.CollectAll(ctx, "test"); err != nil || len(got) != 0 {
		t.Errorf("a node GC collected %v (%v), want nothing", got, err)
	}
	if got := live(s); !slices.Equal(got, []string{"nomads"}) {
		t.Errorf("the store holds %v, want [nomads]", got)
	}
	a, err := svc.Status(ctx, "nomads")
	if err != nil || a.Origin != api.OriginMount {
		t.Errorf("status: %+v, %v; want origin %q", a, err, api.OriginMount)
	}
}
