package fs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// TestListingFirstBatchAttributes checks what a listing costs and shows,
// on a plain volume and on an overlay: a names-only listing of a
// directory larger than plusAttrsMax leaves its entries undescribed, so
// that stat-ing one afterwards is a LOOKUP, while a small directory's
// listing describes every entry and a stat after it sends nothing. Either
// way every name is listed once (on a plain volume with the d_ino that
// lstat gives it), and a listing restarted with a seek to its start lists
// the same names.
func TestListingFirstBatchAttributes(t *testing.T) {
	tm := newTestMount(t)
	for _, id := range []string{"plain", "stacked"} {
		if _, err := tm.store.Create(id, []allocdir.Task{{Name: "web"}}); err != nil {
			t.Fatal(err)
		}
	}
	plain := filepath.Join(tm.dir, "plain", "alloc", "data")
	stacked := filepath.Join(tm.dir, "stacked", "alloc", "data")
	fill := func(dir string, n int) {
		t.Helper()
		must(t, os.Mkdir(dir, 0o755))
		for i := 0; i < n; i++ {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", i)), nil, 0o644))
		}
	}
	large := plusAttrsMax + 100
	fill(filepath.Join(plain, "small"), 20)
	fill(filepath.Join(plain, "large"), large)
	fill(filepath.Join(stacked, "lowersmall"), 20)
	fill(filepath.Join(stacked, "lowerlarge"), large)
	stackLayer(t, tm.store, "stacked", "alloc/data")
	fill(filepath.Join(stacked, "lowerlarge", "upper"), 0)

	for _, c := range []struct {
		dir      string
		entries  int
		describe bool
	}{
		{filepath.Join(plain, "small"), 20, true},
		{filepath.Join(plain, "large"), large, false},
		{filepath.Join(stacked, "lowersmall"), 20, true},
		{filepath.Join(stacked, "lowerlarge"), large + 1, false},
	} {
		t.Run(filepath.Base(c.dir), func(t *testing.T) {
			dir := c.dir
			// The kernel forgets every entry it may have cached.
			must(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0))
			names, inos := listRaw(t, dir, false)
			if len(names) != c.entries {
				t.Fatalf("listed %d names, want %d", len(names), c.entries)
			}
			before := tm.mount.RequestCounts()["LOOKUP"]
			var st unix.Stat_t
			must(t, unix.Lstat(filepath.Join(dir, names[0]), &st))
			lookups := tm.mount.RequestCounts()["LOOKUP"] - before
			if c.describe && lookups != 0 {
				t.Errorf("lstat of %s after the listing sent %d LOOKUPs, want 0 (the listing described it)", names[0], lookups)
			}
			if !c.describe && lookups != 1 {
				t.Errorf("lstat of %s after the listing sent %d LOOKUPs, want 1 (the listing left it undescribed)", names[0], lookups)
			}
			again, _ := listRaw(t, dir, true)
			if fmt.Sprint(again) != fmt.Sprint(names) {
				t.Errorf("a listing restarted at its start lists %d names, the first listed %d", len(again), len(names))
			}
			for i, name := range names {
				must(t, unix.Lstat(filepath.Join(dir, name), &st))
				// An overlay's merged listing has no inode numbers yet
				// (FUSE_UNKNOWN_INO); a plain volume's has the mount's.
				if filepath.Dir(dir) == plain && st.Ino != inos[i] {
					t.Errorf("%s: d_ino %d, st_ino %d", name, inos[i], st.Ino)
				}
			}
		})
	}
}

// listRaw lists dir with getdents in one 32 KiB buffer at a time and
// returns the names but "." and "..", sorted, with their d_ino. With
// rewind it reads one batch, seeks back to the start and lists from there.
func listRaw(t *testing.T, dir string, rewind bool) ([]string, []uint64) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	if rewind {
		if _, err := unix.Getdents(fd, buf); err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Seek(fd, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	type entry struct {
		name string
		ino  uint64
	}
	var all []entry
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8,
		// then the NUL-terminated name.
		for off := 0; off < n; {
			ino := binary.NativeEndian.Uint64(buf[off:])
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			name := unix.ByteSliceToString(buf[off+19 : off+reclen])
			if name != "." && name != ".." {
				all = append(all, entry{name, ino})
			}
			off += reclen
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	names := make([]string, len(all))
	inos := make([]uint64, len(all))
	for i, e := range all {
		names[i], inos[i] = e.name, e.ino
	}
	return names, inos
}
