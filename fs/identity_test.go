package fs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
)

// walkMount lists every entry under dir, in the mount, as path, type and
// content (files) or target (links); errors fail the test.
func walkMount(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		entry := fmt.Sprintf("%s %s", rel, fi.Mode().Type())
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			entry += " " + string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			entry += " -> " + target
		}
		out = append(out, entry)
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s through the mount: %v", dir, err)
	}
	sort.Strings(out)
	return out
}

// TestMountSharedLayersKeepTheirOwnNodes builds a snapshot chain g0 -> g1
// -> g2 in one mount, so that g0's data layer is shown by all three
// allocations (g0 as its frozen upper, g1 and g2 as a lower), each
// walked right after it is made, so that the kernel and the daemon hold
// nodes of every allocation at once. Each allocation must keep showing
// its own view: a node shown by one allocation must never answer for
// another (they share backing inodes, not identities).
func TestMountSharedLayersKeepTheirOwnNodes(t *testing.T) {
	tm := newTestMount(t)
	tasks := []allocdir.Task{{Name: "web"}}
	if _, err := tm.store.Create("g0", tasks, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := func(id string) string { return filepath.Join(tm.dir, id, "alloc", "data") }
	mustWrite := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(filepath.Join(data("g0"), "d/e/deep.txt"), "deep from g0")
	mustWrite(filepath.Join(data("g0"), "d/kept.txt"), "kept from g0")
	mustWrite(filepath.Join(data("g0"), "top.txt"), "top from g0")
	want := map[string][]string{"g0": walkMount(t, data("g0"))}

	for i, id := range []string{"g1", "g2"} {
		prev := fmt.Sprintf("g%d", i)
		if _, err := tm.store.Stop(prev); err != nil {
			t.Fatal(err)
		}
		if _, err := tm.store.Create(id, tasks, store.CreateOptions{Previous: prev, Migration: store.MigrationSnapshot}); err != nil {
			t.Fatalf("CreateMigrated %s from %s: %v", id, prev, err)
		}
		mustWrite(filepath.Join(data(id), "d/"+id+".txt"), "new in "+id)
		mustWrite(filepath.Join(data(id), "top.txt"), "top from "+id)
		if err := os.Remove(filepath.Join(data(id), "d/kept.txt")); err != nil {
			t.Fatal(err)
		}
		mustWrite(filepath.Join(data(id), "d/kept.txt"), "rewritten in "+id)
		want[id] = walkMount(t, data(id))
	}
	// Every allocation again, in the same mount, each after the others.
	for round := 0; round < 2; round++ {
		for _, id := range []string{"g0", "g1", "g2", "g1", "g0"} {
			if got := walkMount(t, data(id)); strings.Join(got, "\n") != strings.Join(want[id], "\n") {
				t.Errorf("round %d, %s now shows:\n%s\nwant:\n%s", round, id, strings.Join(got, "\n"), strings.Join(want[id], "\n"))
			}
		}
	}
	// The frozen views stay frozen when reached after the live one.
	if err := os.WriteFile(filepath.Join(data("g0"), "d/e/deep.txt"), []byte("x"), 0o644); err == nil || !os.IsPermission(err) && !strings.Contains(err.Error(), syscall.EROFS.Error()) {
		t.Errorf("writing g0's frozen deep.txt after g2 showed it: got %v, want EROFS", err)
	}
	if got := readMount(t, tm, "g2/alloc/data/d/e/deep.txt"); got != "deep from g0" {
		t.Errorf("g2's deep.txt: got %q", got)
	}
}
