package fs

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// mountedXattrs lists p's extended attributes through the mount, sorted.
func mountedXattrs(t *testing.T, p string) []string {
	t.Helper()
	names, err := layer.ListXattrs(layer.PathLoc(p))
	if err != nil {
		t.Fatalf("listxattr %s: %v", p, err)
	}
	sort.Strings(names)
	return names
}

// TestXattrsSurviveCopyUp checks that a file's and a directory's extended
// attributes in a lower layer are still there after a change copies them
// up, and that the layer format's own marks never show.
func TestXattrsSurviveCopyUp(t *testing.T) {
	tm := newTestMount(t)
	web := []allocdir.Task{{Name: "web"}}
	if _, err := tm.store.Create("a", web, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := func(id string) string { return filepath.Join(tm.dir, id, "alloc", "data") }
	must(t, os.WriteFile(filepath.Join(data("a"), "f"), []byte("x"), 0o644))
	must(t, os.Mkdir(filepath.Join(data("a"), "d"), 0o755))
	for _, p := range []string{"f", "d"} {
		must(t, unix.Setxattr(filepath.Join(data("a"), p), "user.note", []byte("kept-"+p), 0))
		must(t, unix.Setxattr(filepath.Join(data("a"), p), "trusted.mine", []byte("t"), 0))
	}
	if _, err := tm.store.Stop("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := tm.store.Create("b", web, store.CreateOptions{Previous: "a", Migration: store.MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	want := []string{"trusted.mine", "user.note"}
	for _, p := range []string{"f", "d"} {
		path := filepath.Join(data("b"), p)
		// A change copies the entry up.
		must(t, os.Chmod(path, 0o700))
		if got := mountedXattrs(t, path); strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s after copy-up: xattrs %v, want %v", p, got, want)
		}
		buf := make([]byte, 64)
		n, err := unix.Getxattr(path, "user.note", buf)
		if err != nil || string(buf[:n]) != "kept-"+p {
			t.Errorf("%s after copy-up: user.note = %q, %v", p, buf[:max(n, 0)], err)
		}
	}
	// A directory made opaque by the format shows no mark.
	must(t, os.RemoveAll(filepath.Join(data("b"), "d")))
	must(t, os.Mkdir(filepath.Join(data("b"), "d"), 0o755))
	if got := mountedXattrs(t, filepath.Join(data("b"), "d")); len(got) != 0 {
		t.Errorf("a directory made over a deleted lower one lists %v, want nothing", got)
	}
	if _, err := unix.Getxattr(filepath.Join(data("b"), "d"), layer.OpaqueXattr, nil); !errors.Is(err, unix.ENODATA) {
		t.Errorf("getxattr %s through the mount: %v, want ENODATA", layer.OpaqueXattr, err)
	}
}

// TestTaskOverlayXattrsRoundTrip checks that a task's own
// trusted.overlay.* attributes read back as set, are stored escaped, and
// so cannot forge the format's marks: a directory the task marks "opaque"
// still shows what lies below it once its volume is stacked.
func TestTaskOverlayXattrsRoundTrip(t *testing.T) {
	tm := newTestMount(t)
	web := []allocdir.Task{{Name: "web"}}
	if _, err := tm.store.Create("a", web, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := func(id string) string { return filepath.Join(tm.dir, id, "alloc", "data") }
	must(t, os.MkdirAll(filepath.Join(data("a"), "d"), 0o755))
	must(t, os.WriteFile(filepath.Join(data("a"), "d", "below"), nil, 0o644))
	if _, err := tm.store.Stop("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := tm.store.Create("b", web, store.CreateOptions{Previous: "a", Migration: store.MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(data("b"), "d")
	must(t, unix.Setxattr(d, layer.OpaqueXattr, []byte("y"), 0))
	must(t, unix.Setxattr(d, "trusted.overlay.redirect", []byte("/x"), 0))
	if got, want := mountedXattrs(t, d), []string{"trusted.overlay.opaque", "trusted.overlay.redirect"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("the task's trusted.overlay.* attributes list as %v, want %v", got, want)
	}
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(d, layer.OpaqueXattr, buf); err != nil || string(buf[:n]) != "y" {
		t.Errorf("getxattr of the task's %s: %q, %v", layer.OpaqueXattr, buf[:max(n, 0)], err)
	}
	st, err := tm.store.Get("b")
	must(t, err)
	backing := filepath.Join(tm.store.LayerPath(st.Volumes["alloc/data"].Upper), "d")
	if layer.IsOpaque(layer.PathLoc(backing)) {
		t.Errorf("the task's attribute made the backing directory opaque")
	}
	if _, err := os.Lstat(filepath.Join(d, "below")); err != nil {
		t.Errorf("the lower entry under a directory the task marked: %v, want it shown", err)
	}
	must(t, unix.Removexattr(d, layer.OpaqueXattr))
	if got := mountedXattrs(t, d); strings.Join(got, ",") != "trusted.overlay.redirect" {
		t.Errorf("after removing the task's mark: %v", got)
	}
}
