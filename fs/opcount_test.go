package fs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// TestRequestCounts checks that the mount counts the requests the kernel
// sends, by opcode: a mkdir, a create with a write and a close, a listing
// and a stat each show up under their own name, and a closed passthrough
// file costs no FLUSH.
func TestRequestCounts(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(tm.dir, "a", "alloc", "data", "d")
	before := tm.mount.RequestCounts()
	must(t, os.Mkdir(d, 0o755))
	must(t, os.WriteFile(filepath.Join(d, "f"), []byte("x"), 0o644))
	if _, err := os.ReadDir(d); err != nil {
		t.Fatal(err)
	}
	after := tm.mount.RequestCounts()
	for _, op := range []string{"MKDIR", "CREATE", "LOOKUP", "OPENDIR", "READDIRPLUS"} {
		if after[op] <= before[op] {
			t.Errorf("%s: %d requests before, %d after, want more", op, before[op], after[op])
		}
	}
	if tm.mount.Passthrough() && after["FLUSH"] != before["FLUSH"] {
		t.Errorf("closing a passthrough file sent %d FLUSH requests, want none", after["FLUSH"]-before["FLUSH"])
	}
	for op := range after {
		if op == "" {
			t.Error("a request was counted without a name")
		}
	}
}
