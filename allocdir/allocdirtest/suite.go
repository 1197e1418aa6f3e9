//go:build linux

package allocdirtest

import (
	"io"
	"sync"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/hashicorp/go-hclog"
)

// NewStore returns a fresh, empty store for one case of the suite. The
// function it returns creates an allocation (not built) in that store;
// every allocation of one store can Move to and from another of the same
// store. AllocDirPath of an allocation must be a live host path in which
// the suite can create fixtures with ordinary os calls once Build has run.
type NewStore func(t *testing.T) func(allocID string) allocdir.Interface

// Run runs every case of the conformance suite as a subtest of t, each
// with a fresh store. Cases are not run in parallel: several of them count
// goroutines to find leaks.
func Run(t *testing.T, newStore NewStore) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, &harness{newAlloc: newStore(t)})
		})
	}
}

// cases is the conformance table, in the order it runs.
var cases = []struct {
	name string
	fn   func(t *testing.T, h *harness)
}{
	{"Layout", testLayout},
	{"List", testList},
	{"Stat", testStat},
	{"ReadAt", testReadAt},
	{"Escapes", testEscapes},
	{"BlockUntilExists", testBlockUntilExists},
	{"ChangeEvents", testChangeEvents},
	{"Move", testMove},
	{"Destroy", testDestroy},
	{"Snapshot", testSnapshot},
	{"MaliciousArchives", testMaliciousArchives},
}

// Allocation IDs used by the cases. Each case gets a fresh store, so the
// same IDs are reused from case to case.
const (
	allocA = "5d0f8a52-7c31-4e0b-9a6d-3f2c1b0e9a01"
	allocB = "5d0f8a52-7c31-4e0b-9a6d-3f2c1b0e9a02"
	allocC = "5d0f8a52-7c31-4e0b-9a6d-3f2c1b0e9a03"
	allocD = "5d0f8a52-7c31-4e0b-9a6d-3f2c1b0e9a04"
	allocE = "5d0f8a52-7c31-4e0b-9a6d-3f2c1b0e9a05"
)

// harness hands allocations of one store to a case.
type harness struct {
	newAlloc func(allocID string) allocdir.Interface
}

// alloc returns a new, unbuilt allocation. Destroy is registered as a
// cleanup of t, and the allocation's tree is logged if t failed.
func (h *harness) alloc(t *testing.T, id string) allocdir.Interface {
	t.Helper()
	a := h.newAlloc(id)
	if a == nil {
		t.Fatalf("store returned a nil allocation for %q", id)
	}
	t.Cleanup(func() {
		if err := a.Destroy(); err != nil {
			t.Errorf("Destroy of %s: %v", id, err)
		}
	})
	t.Cleanup(func() {
		if t.Failed() {
			dumpTree(t, a.AllocDirPath())
		}
	})
	return a
}

// built returns a built allocation with the named tasks registered and
// their directories built.
func (h *harness) built(t *testing.T, id string, tasks ...string) allocdir.Interface {
	t.Helper()
	a := h.alloc(t, id)
	if err := a.Build(); err != nil {
		t.Fatalf("Build of %s: %v", id, err)
	}
	for _, name := range tasks {
		if err := a.NewTaskDir(allocdir.Task{Name: name}).Build(); err != nil {
			t.Fatalf("TaskDir.Build of %q in %s: %v", name, id, err)
		}
	}
	return a
}

// Logger returns an hclog.Logger that writes to t.Log, for implementations
// to hand to their constructors in a NewStore. Lines logged after t has
// finished (by a goroutine the implementation failed to stop) are dropped
// instead of panicking.
func Logger(t testing.TB) hclog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return hclog.New(&hclog.LoggerOptions{
		Name:            "allocdirtest",
		Level:           hclog.Trace,
		Output:          w,
		DisableTime:     true,
		IncludeLocation: false,
	})
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

var _ io.Writer = (*testWriter)(nil)

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Helper()
		w.t.Log(string(trimNewline(p)))
	}
	return len(p), nil
}

func trimNewline(p []byte) []byte {
	if n := len(p); n > 0 && p[n-1] == '\n' {
		return p[:n-1]
	}
	return p
}
