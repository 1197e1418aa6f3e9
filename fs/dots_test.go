package fs

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// rawEntries lists dir with getdents64, "." and ".." included, and
// returns each name's d_ino.
func rawEntries(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	out := map[string]uint64{}
	buf := make([]byte, 1<<16)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatalf("getdents %s: %v", dir, err)
		}
		if n == 0 {
			return out
		}
		for b := buf[:n]; len(b) > 0; {
			ino := binary.LittleEndian.Uint64(b[0:8])
			reclen := binary.LittleEndian.Uint16(b[16:18])
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			out[string(name)] = ino
			b = b[reclen:]
		}
	}
}

// TestListingsHaveDots checks that every kind of directory of the mount
// lists "." and "..", with the inode numbers stat gives the directory and
// its parent, as a local filesystem does.
func TestListingsHaveDots(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	must(t, os.MkdirAll(filepath.Join(tm.dir, "a", "alloc", "data", "d"), 0o755))
	if _, err := tm.store.Stop("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := tm.store.Create("b", []allocdir.Task{{Name: "web"}}, store.CreateOptions{Previous: "a", Migration: store.MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{
		".", "b", "b/alloc", "b/web", "b/web/alloc", "b/alloc/logs",
		"b/alloc/data", "b/alloc/data/d", // an overlay volume and a lower directory in it
		"b/web/secrets", "b/web/private", // memory volumes
	} {
		dir := filepath.Join(tm.dir, rel)
		got := rawEntries(t, dir)
		var self, parent unix.Stat_t
		must(t, unix.Stat(dir, &self))
		must(t, unix.Stat(filepath.Join(dir, ".."), &parent))
		if ino, ok := got["."]; !ok || ino != self.Ino {
			t.Errorf("%s: \".\" is %d (listed %v), want %d", rel, ino, ok, self.Ino)
		}
		if rel == "." {
			// The mount's root: its ".." is outside the filesystem.
			if _, ok := got[".."]; !ok {
				t.Errorf("%s: no \"..\"", rel)
			}
			continue
		}
		if ino, ok := got[".."]; !ok || ino != parent.Ino {
			t.Errorf("%s: \"..\" is %d (listed %v), want %d", rel, ino, ok, parent.Ino)
		}
	}
}
