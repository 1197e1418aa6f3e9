package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
)

// snapshotVolume makes allocation "old", lets fill write its alloc/data
// through the mount, and snapshot-migrates it to "new", whose alloc/data
// then shows that content from a lower layer. It returns new's data dir.
func snapshotVolume(t *testing.T, tm *testMount, fill func(data string)) string {
	t.Helper()
	web := []allocdir.Task{{Name: "web"}}
	if _, err := tm.store.Create("old", web, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fill(filepath.Join(tm.dir, "old/alloc/data"))
	if _, err := tm.store.Stop("old"); err != nil {
		t.Fatal(err)
	}
	if _, err := tm.store.Create("new", web, store.CreateOptions{Previous: "old", Migration: store.MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(tm.dir, "new/alloc/data")
	if n := len(mustState(t, tm.store, "new").Volumes["alloc/data"].Lowers); n != 1 {
		t.Fatalf("new alloc/data stacks %d lower layers, want 1", n)
	}
	return data
}

func lstatT(t *testing.T, p string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// TestMountHardLinksAcrossCopyUp checks, through the mount, that the
// names of a lower file stay one file when a chmod through one of them
// copies it up: every name opens and reads, shows the same st_ino as
// before the copy-up and the right link count; link() of a lower file
// joins the group and unlink() leaves it.
func TestMountHardLinksAcrossCopyUp(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(d string) {
		must(t, os.WriteFile(filepath.Join(d, "f1"), []byte("shared\n"), 0o644))
		must(t, os.Mkdir(filepath.Join(d, "sub"), 0o755))
		must(t, os.Link(filepath.Join(d, "f1"), filepath.Join(d, "h1")))
		must(t, os.Link(filepath.Join(d, "f1"), filepath.Join(d, "sub/h2")))
		must(t, os.WriteFile(filepath.Join(d, "solo"), []byte("one name\n"), 0o644))
	})
	before := lstatT(t, filepath.Join(data, "h1"))
	if before.Nlink != 3 {
		t.Fatalf("lower h1 has %d links, want 3", before.Nlink)
	}
	must(t, os.Chmod(filepath.Join(data, "f1"), 0o600))
	for _, n := range []string{"f1", "h1", "sub/h2"} {
		st := lstatT(t, filepath.Join(data, n))
		if st.Ino != before.Ino || st.Nlink != 3 || st.Mode&0o777 != 0o600 {
			t.Errorf("%s after a chmod of f1: ino %d nlink %d mode %o; want ino %d, 3 links, 0600", n, st.Ino, st.Nlink, st.Mode&0o777, before.Ino)
		}
		if b, err := os.ReadFile(filepath.Join(data, n)); err != nil || string(b) != "shared\n" {
			t.Errorf("read %s after the copy-up: %q, %v", n, b, err)
		}
	}
	must(t, os.WriteFile(filepath.Join(data, "h1"), []byte("written through h1\n"), 0o600))
	if b, err := os.ReadFile(filepath.Join(data, "sub/h2")); err != nil || string(b) != "written through h1\n" {
		t.Errorf("sub/h2 after a write through h1: %q, %v", b, err)
	}
	must(t, os.Remove(filepath.Join(data, "sub/h2")))
	if st := lstatT(t, filepath.Join(data, "f1")); st.Nlink != 2 {
		t.Errorf("f1 after unlinking sub/h2: %d links, want 2", st.Nlink)
	}

	// link() of a lower file with one name copies it up and joins it.
	solo := lstatT(t, filepath.Join(data, "solo"))
	must(t, os.Link(filepath.Join(data, "solo"), filepath.Join(data, "solo2")))
	for _, n := range []string{"solo", "solo2"} {
		if st := lstatT(t, filepath.Join(data, n)); st.Ino != solo.Ino || st.Nlink != 2 {
			t.Errorf("%s after link(): ino %d nlink %d, want ino %d and 2 links", n, st.Ino, st.Nlink, solo.Ino)
		}
	}
	// The frozen view of the old allocation never changed.
	if st := lstatT(t, filepath.Join(tm.dir, "old/alloc/data/h1")); st.Nlink != 3 || st.Mode&0o777 != 0o644 {
		t.Errorf("old's h1: nlink %d mode %o, want the lower file untouched (3, 0644)", st.Nlink, st.Mode&0o777)
	}
}

// TestMountStaleFdFollowsCopyUp checks that an fd opened on a lower file
// before its copy-up reads what a path opened after it reads: the data
// and size a later write gave the copy.
func TestMountStaleFdFollowsCopyUp(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(d string) {
		must(t, os.WriteFile(filepath.Join(d, "f"), []byte("lower content\n"), 0o644))
	})
	p := filepath.Join(data, "f")
	old, err := os.Open(p)
	must(t, err)
	defer old.Close()
	ino := lstatT(t, p).Ino
	want := []byte("the copy, longer than the lower file was\n")
	must(t, os.WriteFile(p, want, 0o644))
	got := make([]byte, 100)
	n, err := old.ReadAt(got, 0)
	if !bytes.Equal(got[:n], want) {
		t.Errorf("the fd opened before the copy-up reads %q (%v), want %q", got[:n], err, want)
	}
	fi, err := old.Stat()
	must(t, err)
	if fi.Size() != int64(len(want)) || fi.Sys().(*syscall.Stat_t).Ino != ino {
		t.Errorf("fstat of the old fd: size %d ino %d, want %d and %d", fi.Size(), fi.Sys().(*syscall.Stat_t).Ino, len(want), ino)
	}
	// Unlinked while open, it still reads and shows no links.
	must(t, os.Remove(p))
	fi, err = old.Stat()
	if err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 0 {
		t.Errorf("fstat of the old fd after unlink: %v, %v; want nlink 0", fi, err)
	}
	if n, err := old.ReadAt(got, 0); !bytes.Equal(got[:n], want) {
		t.Errorf("the old fd after unlink reads %q (%v)", got[:n], err)
	}
}

// TestMountExchangedDirectoryHidesLower checks that a directory made in
// the upper layer and exchanged with a lower one shows only its own
// entries at its new path: it must not merge with what the lower layer
// holds there, nor refuse rmdir because of it.
func TestMountExchangedDirectoryHidesLower(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(d string) {
		must(t, os.MkdirAll(filepath.Join(d, "b/sub"), 0o755))
		must(t, os.WriteFile(filepath.Join(d, "b/f"), []byte("lower\n"), 0o644))
	})
	must(t, os.Mkdir(filepath.Join(data, "d"), 0o755))
	must(t, unix.Renameat2(unix.AT_FDCWD, filepath.Join(data, "d"), unix.AT_FDCWD, filepath.Join(data, "b"), unix.RENAME_EXCHANGE))
	if entries, err := os.ReadDir(filepath.Join(data, "b")); err != nil || len(entries) != 0 {
		t.Errorf("b after the exchange lists %v, %v; want the empty directory", entries, err)
	}
	// An empty directory's link count is the backing filesystem's: 2 on
	// ext4 and xfs, 1 on btrfs.
	native := filepath.Join(t.TempDir(), "empty")
	must(t, os.Mkdir(native, 0o755))
	if st, want := lstatT(t, filepath.Join(data, "b")), lstatT(t, native); st.Nlink != want.Nlink {
		t.Errorf("b after the exchange has %d links, want %d as an empty directory has here", st.Nlink, want.Nlink)
	}
	if b, err := os.ReadFile(filepath.Join(data, "d/f")); err != nil || string(b) != "lower\n" {
		t.Errorf("d/f after the exchange: %q, %v", b, err)
	}
	must(t, os.Remove(filepath.Join(data, "b")))
}

// TestMountOpenUnlinkedLowerFile checks that a lower file opened for
// reading, then unlinked, can still be changed through its fd (fchmod,
// fchown) without touching the lower layer, and shows no links.
func TestMountOpenUnlinkedLowerFile(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(d string) {
		must(t, os.WriteFile(filepath.Join(d, "f"), []byte("lower\n"), 0o644))
	})
	f, err := os.Open(filepath.Join(data, "f"))
	must(t, err)
	defer f.Close()
	must(t, os.Remove(filepath.Join(data, "f")))
	must(t, f.Chmod(0o600))
	must(t, f.Chown(4321, 4321))
	fi, err := f.Stat()
	must(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	if st.Nlink != 0 || st.Mode&0o777 != 0o600 || st.Uid != 4321 {
		t.Errorf("fstat after the changes: nlink %d mode %o uid %d; want 0, 0600, 4321", st.Nlink, st.Mode&0o777, st.Uid)
	}
	b := make([]byte, 6)
	if _, err := f.ReadAt(b, 0); err != nil || string(b) != "lower\n" {
		t.Errorf("read after the changes: %q, %v", b, err)
	}
	if st := lstatT(t, filepath.Join(tm.dir, "old/alloc/data/f")); st.Mode&0o777 != 0o644 || st.Uid != 0 {
		t.Errorf("the lower file changed: mode %o uid %d", st.Mode&0o777, st.Uid)
	}
}

// TestMountOpenRemovedLowerDir: a directory of a snapshot's lower layer
// that is removed or renamed over while open still answers fstat through
// its handle, with no links, as an open directory of a local filesystem
// does (found by the differential test, seed 1796184670758787608 of the
// snapshot shape). Each way its name can go: rmdir of the lower directory,
// rmdir of an upper directory made over a removed lower one, a rename
// over it, rmdir after its lower entries were removed.
func TestMountOpenRemovedLowerDir(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(d string) {
		for _, name := range []string{"d", "e", "f", "h"} {
			must(t, os.Mkdir(filepath.Join(d, name), 0o750))
		}
		must(t, os.WriteFile(filepath.Join(d, "h", "x"), nil, 0o644))
	})
	p := func(name string) string { return filepath.Join(data, name) }
	must(t, os.Remove(p("e")))
	must(t, os.Mkdir(p("e"), 0o750))
	must(t, os.Remove(p("h/x")))
	for _, c := range []struct {
		name   string
		remove func() error
	}{
		{"d", func() error { return os.Remove(p("d")) }},
		{"e", func() error { return os.Remove(p("e")) }},
		{"f", func() error {
			if err := os.Mkdir(p("y"), 0o750); err != nil {
				return err
			}
			return unix.Rename(p("y"), p("f")) // os.Rename refuses a directory over a directory
		}},
		{"h", func() error { return os.Remove(p("h")) }},
	} {
		f, err := os.Open(p(c.name))
		must(t, err)
		must(t, c.remove())
		fi, err := f.Stat()
		if err != nil {
			t.Errorf("fstat of %s, open while its name went: %v", c.name, err)
		} else if st := fi.Sys().(*syscall.Stat_t); st.Nlink != 0 || !fi.IsDir() {
			t.Errorf("fstat of %s: nlink %d, directory %v; want 0, true", c.name, st.Nlink, fi.IsDir())
		}
		must(t, f.Close())
	}
}
