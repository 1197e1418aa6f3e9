package fs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// migrationFixture creates a stopped allocation "prev" with data, local
// content and a log, and a new allocation "next", both with task web.
func migrationFixture(t *testing.T, tm *testMount) (prev, next string) {
	t.Helper()
	for _, id := range []string{"prev", "next"} {
		if _, err := tm.store.Create(id, []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for rel, content := range map[string]string{
		"prev/alloc/data/test.txt":       "line 1\n",
		"prev/web/local/conf":            "conf\n",
		"prev/alloc/logs/web.stderr.0":   "prev log\n",
		"next/alloc/logs/web.stdout.0":   "next log\n",
		"prev/alloc/data/sub/nested.txt": "nested\n",
	} {
		p := filepath.Join(tm.dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tm.store.Stop("prev"); err != nil {
		t.Fatal(err)
	}
	return "prev", "next"
}

// holdOpen opens rel in the mount, as a process that sits in a directory
// would hold it, until the test ends.
func holdOpen(t *testing.T, tm *testMount, rel string) *os.File {
	t.Helper()
	f, err := os.Open(filepath.Join(tm.dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readMount(t *testing.T, tm *testMount, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tm.dir, rel))
	if err != nil {
		t.Fatalf("read %s: %v", rel, err)
	}
	return string(b)
}

var migratedKeys = []string{"alloc/data", "web/local"}

// TestMountAdopt checks the adopt migration through the mount: the new
// allocation sees and writes the data, the previous one keeps its logs
// and shows a read-only directory saying where its data went.
func TestMountAdopt(t *testing.T) {
	tm := newTestMount(t)
	prev, next := migrationFixture(t, tm)
	n, err := tm.store.Migrate(prev, next, migratedKeys, store.MigrationAdopt)
	if err != nil || n != 2 {
		t.Fatalf("Remap: %d volumes, %v; want 2", n, err)
	}
	if got := readMount(t, tm, "next/alloc/data/test.txt"); got != "line 1\n" {
		t.Errorf("next's data: got %q", got)
	}
	if got := readMount(t, tm, "next/web/local/conf"); got != "conf\n" {
		t.Errorf("next's local: got %q", got)
	}
	f, err := os.OpenFile(filepath.Join(tm.dir, "next/alloc/data/test.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("line 2\n")
	f.Close()
	if got := readMount(t, tm, "prev/alloc/logs/web.stderr.0"); got != "prev log\n" {
		t.Errorf("prev's log after the migration: got %q (nomad#18034)", got)
	}
	entries, err := os.ReadDir(filepath.Join(tm.dir, "prev/alloc/data"))
	if err != nil || len(entries) != 1 || entries[0].Name() != store.MigratedToName {
		t.Errorf("prev's alloc/data: got %v, %v; want only %s", entries, err, store.MigratedToName)
	}
	if got := readMount(t, tm, "prev/alloc/data/"+store.MigratedToName); !strings.Contains(got, "next") {
		t.Errorf("%s: got %q, want it to name next", store.MigratedToName, got)
	}
	err = os.WriteFile(filepath.Join(tm.dir, "prev/alloc/data/new"), nil, 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("write into prev's migrated data: got %v, want EROFS", err)
	}
	st := mustState(t, tm.store, next)
	if st.Previous != prev {
		t.Errorf("next's previous: got %q, want %q", st.Previous, prev)
	}
}

// TestMountSeal checks the snapshot migration: the new allocation sees
// the previous data and copies a file up on its first write; the previous
// allocation keeps a frozen view in which writes fail with EROFS, also
// through a directory a process held open across the seal (the kernel
// keeps that node, and a lookup after the seal finds it again).
func TestMountSeal(t *testing.T) {
	tm := newTestMount(t)
	prev, next := migrationFixture(t, tm)
	held := holdOpen(t, tm, "prev/web/local")
	if n, err := tm.store.Migrate(prev, next, migratedKeys, store.MigrationSnapshot); err != nil || n != 2 {
		t.Fatalf("Seal: %d volumes, %v; want 2", n, err)
	}
	f, err := os.OpenFile(filepath.Join(tm.dir, "next/alloc/data/test.txt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("line 2\n")
	f.Close()
	if got := readMount(t, tm, "next/alloc/data/test.txt"); got != "line 1\nline 2\n" {
		t.Errorf("next's data after an append: got %q", got)
	}
	if got := readMount(t, tm, "prev/alloc/data/test.txt"); got != "line 1\n" {
		t.Errorf("prev's frozen view: got %q, want the data as it was", got)
	}
	if got := readMount(t, tm, "next/alloc/data/sub/nested.txt"); got != "nested\n" {
		t.Errorf("next's nested data: got %q", got)
	}
	if err := os.Remove(filepath.Join(tm.dir, "next/alloc/data/sub/nested.txt")); err != nil {
		t.Fatal(err)
	}
	if got := readMount(t, tm, "prev/alloc/data/sub/nested.txt"); got != "nested\n" {
		t.Errorf("prev's view after next removed the file: got %q", got)
	}
	for _, write := range []func() error{
		func() error {
			return os.WriteFile(filepath.Join(tm.dir, "prev/alloc/data/test.txt"), []byte("x"), 0o644)
		},
		func() error { return os.Remove(filepath.Join(tm.dir, "prev/web/local/conf")) },
		func() error { return unix.Unlinkat(int(held.Fd()), "conf", 0) },
		func() error {
			fd, err := unix.Openat(int(held.Fd()), "new", unix.O_CREAT|unix.O_WRONLY, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		},
		func() error { return os.Mkdir(filepath.Join(tm.dir, "prev/alloc/data/d"), 0o755) },
		func() error { return os.Chmod(filepath.Join(tm.dir, "prev/alloc/data/test.txt"), 0o600) },
	} {
		if err := write(); !errors.Is(err, syscall.EROFS) {
			t.Errorf("a change in prev's frozen view: got %v, want EROFS", err)
		}
	}
	// Destroying the previous allocation keeps the layers the new one
	// stacks on.
	if err := tm.store.Destroy(prev); err != nil {
		t.Fatal(err)
	}
	if got := readMount(t, tm, "next/web/local/conf"); got != "conf\n" {
		t.Errorf("next's local after prev was destroyed: got %q", got)
	}
}

// TestMountSealOutlivesAStaleRecord: two invalidations of one allocation
// can run at once, the older with a record read before the seal; applied
// after the seal's own, it must not make the frozen volume writable again.
func TestMountSealOutlivesAStaleRecord(t *testing.T) {
	tm := newTestMount(t)
	prev, next := migrationFixture(t, tm)
	held := holdOpen(t, tm, "prev/web/local")
	stale := mustState(t, tm.store, prev)
	if _, err := tm.store.Migrate(prev, next, migratedKeys, store.MigrationSnapshot); err != nil {
		t.Fatal(err)
	}
	tm.mount.invalidateVolumes(prev, stale)
	if err := unix.Unlinkat(int(held.Fd()), "conf", 0); !errors.Is(err, syscall.EROFS) {
		t.Errorf("unlink in prev's frozen local after a stale record: got %v, want EROFS", err)
	}
	if got := readMount(t, tm, "next/web/local/conf"); got != "conf\n" {
		t.Errorf("next's local: got %q", got)
	}
}

// TestMigrateTwiceRefused: an allocation's data goes to one replacement
// only; a second handover (which would make the placeholders or frozen
// layers writable elsewhere) is refused and changes nothing.
func TestMigrateTwiceRefused(t *testing.T) {
	s := openTestStore(t, t.TempDir(), store.Options{})
	for _, snapshot := range []bool{false, true} {
		kind := store.MigrationAdopt
		if snapshot {
			kind = store.MigrationSnapshot
		}
		prev := fmt.Sprintf("prev-%v", snapshot)
		if _, err := s.Create(prev, tasks("web"), store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Stop(prev); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Create(prev+"-b", tasks("web"), store.CreateOptions{Previous: prev, Migration: kind}); err != nil {
			t.Fatal(err)
		}
		before, _ := s.Get(prev)
		_, err := s.Create(prev+"-c", tasks("web"), store.CreateOptions{Previous: prev, Migration: kind})
		if !errors.Is(err, store.ErrExists) {
			t.Errorf("snapshot=%v: second migration from %s: %v, want ErrExists", snapshot, prev, err)
		}
		if _, err := s.Get(prev + "-c"); err == nil {
			t.Errorf("snapshot=%v: the refused replacement exists", snapshot)
		}
		after, _ := s.Get(prev)
		if a, b := mustJSON(t, after.Volumes), mustJSON(t, before.Volumes); a != b {
			t.Errorf("snapshot=%v: %s's volumes changed by a refused migration", snapshot, prev)
		}
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
