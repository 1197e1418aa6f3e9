package fs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/volume"
	"golang.org/x/sys/unix"
)

// TestListingFirstBatchAttributes checks what a names-only listing leaves
// the kernel knowing, on a plain volume and on an overlay: every entry of
// a directory of more than volume.PlusAttrsMax names is undescribed (a stat of
// each afterwards is a LOOKUP); the entries of the first batch of a
// smaller one are described (no LOOKUP), all of them when the directory
// fits one batch, the first batch's only at volume.PlusAttrsMax names (the kernel
// asks for the rest with plain READDIR). Every name is listed once, on a
// plain volume with the d_ino that lstat gives it.
func TestListingFirstBatchAttributes(t *testing.T) {
	tm := newTestMount(t)
	for _, id := range []string{"plain", "stacked"} {
		if _, err := tm.store.Create(id, []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	backing := func(id string) string {
		return tm.store.LayerPath(mustState(t, tm.store, id).Volumes["alloc/data"].Upper)
	}
	// Made on the backing layer, so that the kernel has never seen them.
	fill := func(dir string, n int) {
		t.Helper()
		must(t, os.Mkdir(dir, 0o755))
		for i := 0; i < n; i++ {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), nil, 0o644))
		}
	}
	fill(filepath.Join(backing("plain"), "small"), 100)
	fill(filepath.Join(backing("plain"), "boundary"), volume.PlusAttrsMax)
	fill(filepath.Join(backing("plain"), "large"), volume.PlusAttrsMax+1)
	fill(filepath.Join(backing("stacked"), "lowersmall"), 20)
	fill(filepath.Join(backing("stacked"), "lowerlarge"), volume.PlusAttrsMax)
	stackLayer(t, tm.store, "stacked", "alloc/data")
	plain := filepath.Join(tm.dir, "plain", "alloc", "data")
	stacked := filepath.Join(tm.dir, "stacked", "alloc", "data")
	// One name in the upper layer, merged with the lower ones.
	must(t, os.Mkdir(filepath.Join(stacked, "lowerlarge", "upper"), 0o755))

	// How many of a listing's entries a stat afterwards must look up.
	const (
		none = iota // the listing fits one batch and described them all
		some        // the first batch described, the rest not
		all         // a large listing: none described
	)
	for _, c := range []struct {
		dir     string
		entries int
		lookups int
	}{
		{filepath.Join(plain, "small"), 100, none},
		{filepath.Join(plain, "boundary"), volume.PlusAttrsMax, some},
		{filepath.Join(plain, "large"), volume.PlusAttrsMax + 1, all},
		{filepath.Join(stacked, "lowersmall"), 20, none},
		{filepath.Join(stacked, "lowerlarge"), volume.PlusAttrsMax + 1, all},
	} {
		t.Run(filepath.Base(c.dir), func(t *testing.T) {
			dir := c.dir
			dropCachesForTest(t)
			names, inos := listRaw(t, dir)
			if len(names) != c.entries {
				t.Fatalf("listed %d names, want %d", len(names), c.entries)
			}
			sorted := slices.Clone(names)
			sort.Strings(sorted)
			if n := len(slices.Compact(sorted)); n != len(names) {
				t.Errorf("listed %d names, %d of them distinct", len(names), n)
			}
			before := tm.mount.RequestCounts()["LOOKUP"]
			var st unix.Stat_t
			for i, name := range names {
				must(t, unix.Lstat(filepath.Join(dir, name), &st))
				// An overlay's merged listing has no inode numbers yet
				// (FUSE_UNKNOWN_INO); a plain volume's has the mount's.
				if filepath.Dir(dir) == plain && st.Ino != inos[i] {
					t.Errorf("%s: d_ino %d, st_ino %d", name, inos[i], st.Ino)
				}
			}
			lookups := int(tm.mount.RequestCounts()["LOOKUP"] - before)
			switch {
			case c.lookups == none && lookups != 0:
				t.Errorf("lstat of the %d entries after the listing sent %d LOOKUPs, want 0 (the listing described them)", len(names), lookups)
			case c.lookups == some && (lookups == 0 || lookups >= len(names)):
				t.Errorf("lstat of the %d entries after the listing sent %d LOOKUPs, want some but not all (the first batch described its entries)", len(names), lookups)
			case c.lookups == all && lookups != len(names):
				t.Errorf("lstat of the %d entries after the listing sent %d LOOKUPs, want one each (the listing left them undescribed)", len(names), lookups)
			}
		})
	}
}

// TestListingSeek checks that a listing resumed at an offset the daemon
// has already served goes on from there, with the kernel's cached copy of
// the listing dropped in between so that the daemon must seek: in a
// large directory of a volume, back into what the handle read ahead
// (volDir), and in a task directory, whose listing the daemon builds from
// the layout's children and the layer's entries (listDir).
func TestListingSeek(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(tm.dir, "a", "alloc", "data", "d")
	layer := tm.store.LayerPath(mustState(t, tm.store, "a").Volumes["alloc/data"].Upper)
	must(t, os.Mkdir(filepath.Join(layer, "d"), 0o755))
	task := filepath.Join(tm.dir, "a", "web")
	for i := 0; i < 3*volume.PlusAttrsMax; i++ {
		must(t, os.WriteFile(filepath.Join(layer, "d", fmt.Sprintf("f%04d", i)), nil, 0o644))
		must(t, os.WriteFile(filepath.Join(task, fmt.Sprintf("t%04d", i)), nil, 0o644))
	}
	for name, dir := range map[string]string{"volume": dataDir, "task directory": task} {
		t.Run(name, func(t *testing.T) { checkListingSeek(t, tm, dir) })
	}
}

// checkListingSeek reads two pages of dir's listing, drops the kernel's
// caches, seeks back into the first page and checks that the rest of the
// listing is what a whole listing has after that entry.
func checkListingSeek(t *testing.T, tm *testMount, dir string) {
	whole, _ := listRaw(t, dir)
	dropCachesForTest(t)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	// Page-sized reads: the kernel asks for a page of entries at a time,
	// fewer than a volume's handle reads ahead. The seek goes back into
	// the first page: go-fuse's bridge answers a seek into its last reply
	// itself, one further back reaches the directory handle.
	buf := make([]byte, 4096)
	var pages [][]dirent
	for range 2 {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, parseDirents(buf[:n]))
	}
	if len(pages[0]) < 4 || len(pages[1]) == 0 {
		t.Fatalf("two pages of entries held %d and %d", len(pages[0]), len(pages[1]))
	}
	mid := pages[0][len(pages[0])/2]
	dropCachesForTest(t)
	before := tm.mount.RequestCounts()
	if _, err := unix.Seek(fd, int64(mid.off), 0); err != nil {
		t.Fatal(err)
	}
	var got []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatalf("getdents after a seek to %d: %v", mid.off, err)
		}
		if n == 0 {
			break
		}
		for _, e := range parseDirents(buf[:n]) {
			if e.name != "." && e.name != ".." {
				got = append(got, e.name)
			}
		}
	}
	after := tm.mount.RequestCounts()
	if after["READDIR"]+after["READDIRPLUS"] == before["READDIR"]+before["READDIRPLUS"] {
		t.Fatal("the resumed listing sent no READDIR: the kernel answered from its cache, so the daemon's seek went untested")
	}
	// whole lists the names in the same order, without "." and "..".
	i := slices.Index(whole, mid.name)
	if i < 0 {
		t.Fatalf("%s is not in the whole listing", mid.name)
	}
	if want := whole[i+1:]; !slices.Equal(got, want) {
		t.Errorf("after a seek past %s the listing went on with %d names, want the %d that follow it (first %v, want %v)",
			mid.name, len(got), len(want), head(got), head(want))
	}
}

func head(s []string) []string { return s[:min(3, len(s))] }

// dirent is one record of getdents64.
type dirent struct {
	name string
	ino  uint64
	off  uint64
}

// parseDirents reads struct linux_dirent64 records: ino u64, off s64,
// reclen u16, type u8, then the NUL-terminated name.
func parseDirents(buf []byte) []dirent {
	var out []dirent
	for off := 0; off < len(buf); {
		reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
		out = append(out, dirent{
			name: unix.ByteSliceToString(buf[off+19 : off+reclen]),
			ino:  binary.NativeEndian.Uint64(buf[off:]),
			off:  binary.NativeEndian.Uint64(buf[off+8:]),
		})
		off += reclen
	}
	return out
}

// listRaw lists dir with getdents into a 32 KiB buffer, glibc's size,
// and returns the names but "." and ".." in the order listed, with their
// d_ino.
func listRaw(t *testing.T, dir string) ([]string, []uint64) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	var names []string
	var inos []uint64
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return names, inos
		}
		for _, e := range parseDirents(buf[:n]) {
			if e.name != "." && e.name != ".." {
				names = append(names, e.name)
				inos = append(inos, e.ino)
			}
		}
	}
}

// dropCachesForTest makes the kernel forget the dentries, inodes and
// pages it holds, the mount's cached listings among them.
func dropCachesForTest(t *testing.T) {
	t.Helper()
	unix.Sync()
	must(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0))
}

// TestListingManyBatches lists, with an lstat of every entry, a directory
// of a plain volume large enough for several READDIRPLUS batches, and
// checks every entry's attributes against its backing file; then it
// closes listings in the middle of a batch, again and again, as a lister
// that stops early does.
func TestListingManyBatches(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := tm.store.Get("a")
	must(t, err)
	backing := filepath.Join(tm.store.LayerPath(st.Volumes["alloc/data"].Upper), "big")
	must(t, os.Mkdir(backing, 0o755))
	const files = 700
	for i := range files {
		must(t, os.WriteFile(filepath.Join(backing, fmt.Sprintf("f%04d", i)), make([]byte, i), 0o640))
	}
	dir := filepath.Join(tm.dir, "a", "alloc", "data", "big")
	f, err := os.Open(dir)
	must(t, err)
	seen := 0
	for {
		ents, err := f.ReadDir(64)
		for _, e := range ents {
			info, lerr := os.Lstat(filepath.Join(dir, e.Name()))
			if lerr != nil {
				t.Fatal(lerr)
			}
			var i int
			if _, serr := fmt.Sscanf(e.Name(), "f%04d", &i); serr != nil || info.Size() != int64(i) || info.Mode().Perm() != 0o640 {
				t.Errorf("%s: size %d mode %v, want %d and -rw-r-----", e.Name(), info.Size(), info.Mode(), i)
			}
			seen++
		}
		if err != nil {
			break
		}
	}
	f.Close()
	if seen != files {
		t.Errorf("listed %d entries, want %d", seen, files)
	}
	for range 20 {
		f, err := os.Open(dir)
		must(t, err)
		ents, err := f.ReadDir(10)
		if err != nil || len(ents) != 10 {
			t.Fatalf("first 10 entries: %d, %v", len(ents), err)
		}
		if _, err := os.Lstat(filepath.Join(dir, ents[0].Name())); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
}
