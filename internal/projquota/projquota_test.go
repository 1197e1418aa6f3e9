package projquota_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/internal/projquota"
	"golang.org/x/sys/unix"
)

// TestProjects runs the package on a filesystem with project quotas (or
// skips, fstest.ProjectQuotaDir says why): a tree's project set root
// last, PROJINHERIT passing it on, limits and usage, and Next finding
// the projects with limits.
func TestProjects(t *testing.T) {
	dir := fstest.ProjectQuotaDir(t)
	if on, err := projquota.Enforced(dir); err != nil || !on {
		t.Fatalf("Enforced(%s) = %v, %v", dir, on, err)
	}
	root := filepath.Join(dir, "tree")
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"f", "a/g", "a/b/h"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte(strings.Repeat("x", 4096)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("f", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	if err := projquota.SetTree(root, 7100); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "a", "a/b", "c"} {
		if id, err := projquota.ProjectOf(filepath.Join(root, p)); err != nil || id != 7100 {
			t.Fatalf("project of %q: %d, %v", p, id, err)
		}
	}
	// What is made under a PROJINHERIT directory takes its project.
	if err := os.WriteFile(filepath.Join(root, "c", "new"), []byte("n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(filepath.Join(root, "c", "new"), unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	id, inherit, err := projquota.Project(fd)
	unix.Close(fd)
	if err != nil || id != 7100 || inherit {
		t.Fatalf("a new file's project: %d, inherit %v, %v", id, inherit, err)
	}
	if err := projquota.Limit(dir, 7100, 1<<20, 100); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	u, err := projquota.Get(dir, 7100)
	if err != nil || u.LimitBytes != 1<<20 || u.LimitInodes != 100 || u.Bytes < 3*4096 || u.Inodes < 8 {
		t.Fatalf("Get: %+v, %v", u, err)
	}
	if err := projquota.Limit(dir, 7200, 0, 5); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		projquota.Limit(dir, 7100, 0, 0)
		projquota.Limit(dir, 7200, 0, 0)
	})
	next, nu, ok, err := projquota.Next(dir, 7101)
	if err != nil || !ok || next != 7200 || nu.LimitInodes != 5 {
		t.Fatalf("Next(7101) = %d, %+v, %v, %v; want 7200 with its limit", next, nu, ok, err)
	}
	if next, _, ok, err := projquota.Next(dir, 7201); err != nil || ok && next <= 7200 {
		t.Fatalf("Next past 7200: %d, %v, %v", next, ok, err)
	}
	if u, err := projquota.Get(dir, 7300); err != nil || u != (projquota.Usage{}) {
		t.Fatalf("Get of an unused project: %+v, %v", u, err)
	}
}

// TestNotEnforced: a filesystem without project quotas says so, with no
// error.
func TestNotEnforced(t *testing.T) {
	on, err := projquota.Enforced(t.TempDir())
	if err != nil {
		t.Fatalf("Enforced: %v", err)
	}
	if on {
		t.Skip("the temporary directory enforces project quotas")
	}
}
