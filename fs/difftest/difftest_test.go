package difftest

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGenReplays checks that a seed gives the same operations every time
// and another seed other ones: a failure is replayed from its seed alone.
func TestGenReplays(t *testing.T) {
	ops := func(seed uint64) []Op {
		g := NewGen(seed, true, 1000, 1000)
		out := make([]Op, 500)
		for i := range out {
			out[i] = g.Next()
		}
		return out
	}
	a, b, c := ops(7), ops(7), ops(8)
	if !reflect.DeepEqual(a, b) {
		t.Error("seed 7 gave two different sequences")
	}
	if reflect.DeepEqual(a, c) {
		t.Error("seeds 7 and 8 gave the same sequence")
	}
	kinds := map[string]bool{}
	for _, op := range a {
		kinds[op.Kind] = true
	}
	for _, k := range []string{"open", "write", "pwrite", "read", "ftruncate", "fallocate", "chmod", "chown", "utimensat", "link", "symlink", "rename", "renameat2", "mkdir", "rmdir", "unlink", "mkfifo", "mknod", "setxattr", "removexattr", "close", "fstat", "mmap", "copy_file_range", "fifo"} {
		if !kinds[k] {
			t.Errorf("500 ops of seed 7 have no %s", k)
		}
	}
}

// twoTrees populates two fresh directories with the seeded tree.
func twoTrees(t *testing.T) (b string, fa, fb int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("Populate chowns and makes a device node: run as root")
	}
	base := t.TempDir()
	open := func(name string) (string, int) {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := Populate(fd, 4321, 4321); err != nil {
			t.Fatal(err)
		}
		return p, fd
	}
	_, fa = open("a")
	b, fb = open("b")
	return b, fa, fb
}

// TestCompareTreesNormalises checks that two equal trees compare equal
// although their inode numbers, times and directory sizes differ, that
// trusted.overlay.* xattrs are left out, and that each real difference is
// reported under its field and nothing else.
func TestCompareTreesNormalises(t *testing.T) {
	b, fa, fb := twoTrees(t)
	// Grow one directory: its size changes, what it holds does not.
	for i := range 300 {
		p := filepath.Join(b, "c", fmt.Sprintf("long-name-to-grow-the-directory-%04d", i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Setxattr(filepath.Join(b, "a"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	va, _ := Snapshot(fa, nil)
	vb, _ := Snapshot(fb, nil)
	if diffs := CompareTrees(va, vb, nil, nil); len(diffs) != 0 {
		t.Fatalf("equal trees: got %v", diffs)
	}

	// Each change to b alone, and the fields it must show.
	if err := os.Chmod(filepath.Join(b, "a/c/a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(b, "c/a"), "user.new", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(b, "a/b")); err != nil {
		t.Fatal(err)
	}
	na, _ := Snapshot(fa, va)
	nb, _ := Snapshot(fb, vb)
	got := map[string]bool{}
	for _, d := range CompareTrees(na, nb, va, vb) {
		got[d.Path+": "+d.Field] = true
	}
	want := map[string]bool{
		"a/c/a: mode set-id/sticky bits": true,
		"a/c/a: ctime changed":           true,
		"c/a: xattrs":                    true,
		"c/a: ctime changed":             true,
		"a/b: presence":                  true,
		"a: mtime changed":               true,
		"a: ctime changed":               true,
		"a/a: nlink":                     true,
		"a/a: hard-link group":           true,
		"a/a: ctime changed":             true,
		"a/c/b: nlink":                   true,
		"a/c/b: hard-link group":         true,
		"a/c/b: ctime changed":           true,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("differences:\n got %v\nwant %v", keys(got), keys(want))
	}
}

func keys(m map[string]bool) string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return strings.Join(out, "; ")
}

// TestCompareResults checks that an errno difference is reported alone,
// and that an fstat is compared field by field.
func TestCompareResults(t *testing.T) {
	ok := Result{Stat: &Attr{Type: "file", Perm: 0o2755, Size: 3, Nlink: 1}}
	if d := CompareResults(ok, ok); len(d) != 0 {
		t.Errorf("equal results: got %v", d)
	}
	d := CompareResults(Result{Errno: "EBUSY"}, ok)
	if len(d) != 1 || d[0].Field != "errno" || d[0].Vol != "EBUSY" || d[0].Ref != "OK" {
		t.Errorf("errno: got %v", d)
	}
	dropped := Result{Stat: &Attr{Type: "file", Perm: 0o755, Size: 3, Nlink: 1}}
	d = CompareResults(dropped, ok)
	if len(d) != 1 || d[0].Field != "mode set-id/sticky bits" {
		t.Errorf("set-id bits: got %v", d)
	}
}
