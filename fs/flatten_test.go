package fs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// chainLen is how many snapshot migrations the chain tests make: two more
// than the bound, so that the newest allocation is over it.
const chainLen = store.MaxLowers + 2

// chainID names the allocation of generation i.
func chainID(i int) string { return fmt.Sprintf("g%d", i) }

// chainOps are what each generation does to its alloc/data and local/
// through the mount, so that the layers hold every kind of entry the
// overlay format has: overwritten files (copy-up), deleted lower files
// (whiteouts), a directory removed and made again (opaque), a directory
// replaced by a file and a whiteout by a directory, symbolic links, a
// hard-linked pair, a fifo, and extended attributes.
var chainOps = []func(t *testing.T, data, local string){
	func(t *testing.T, data, local string) {
		for i := range 5 {
			mustWrite(t, filepath.Join(data, fmt.Sprintf("f%d", i)), fmt.Sprintf("base %d\n", i), 0o640)
		}
		mustWrite(t, filepath.Join(data, "big"), strings.Repeat("0123456789abcdef", 64<<10), 0o644)
		mustWrite(t, filepath.Join(data, "d/a"), "da\n", 0o644)
		mustWrite(t, filepath.Join(data, "d/b"), "db\n", 0o644)
		mustWrite(t, filepath.Join(data, "e/sub/y"), "y\n", 0o644)
		must(t, os.Symlink("f0", filepath.Join(data, "l")))
		mustWrite(t, filepath.Join(data, "h1"), "hard\n", 0o644)
		must(t, os.Link(filepath.Join(data, "h1"), filepath.Join(data, "h2")))
		mustWrite(t, filepath.Join(data, "x"), "xattr\n", 0o644)
		must(t, unix.Setxattr(filepath.Join(data, "x"), "user.tag", []byte("g0"), 0))
		must(t, unix.Mkfifo(filepath.Join(data, "p"), 0o620))
		mustWrite(t, filepath.Join(local, "conf"), "c0\n", 0o600)
		mustWrite(t, filepath.Join(local, "keep"), "kept\n", 0o644)
	},
	func(t *testing.T, data, local string) {
		mustWrite(t, filepath.Join(data, "f1"), "gen 1\n", 0o640)
		must(t, os.Remove(filepath.Join(data, "f2")))
		must(t, os.RemoveAll(filepath.Join(data, "d")))
		mustWrite(t, filepath.Join(data, "d/new"), "new\n", 0o644)
		mustWrite(t, filepath.Join(data, "n1"), "n1\n", 0o644)
		must(t, os.Chmod(filepath.Join(data, "f3"), 0o600))
	},
	func(t *testing.T, data, local string) {
		must(t, os.Remove(filepath.Join(data, "l")))
		must(t, os.Symlink("d/new", filepath.Join(data, "l2")))
		must(t, unix.Setxattr(filepath.Join(data, "x"), "user.tag", []byte("g2"), 0))
		mustWrite(t, filepath.Join(data, "e/sub/z"), "z\n", 0o644)
		mustWrite(t, filepath.Join(local, "conf"), "c2\n", 0o600)
	},
	func(t *testing.T, data, local string) {
		must(t, os.RemoveAll(filepath.Join(data, "e")))
		mustWrite(t, filepath.Join(data, "e"), "a file now\n", 0o644)
		mustWrite(t, filepath.Join(data, "h1"), "hard, then split by a copy-up\n", 0o644)
	},
	func(t *testing.T, data, local string) {
		mustWrite(t, filepath.Join(data, "f2/inner"), "in\n", 0o644)
		must(t, os.Remove(filepath.Join(data, "n1")))
		must(t, os.Rename(filepath.Join(data, "f0"), filepath.Join(data, "f0moved")))
		must(t, os.Remove(filepath.Join(local, "keep")))
	},
	func(t *testing.T, data, local string) {
		mustWrite(t, filepath.Join(data, "f5"), "g5\n", 0o644)
		must(t, os.Remove(filepath.Join(data, "d/new")))
		must(t, os.Mkdir(filepath.Join(data, "d/sub2"), 0o750))
	},
	func(t *testing.T, data, local string) {
		mustWrite(t, filepath.Join(data, "mine"), "the running allocation's own\n", 0o644)
	},
}

// buildChain makes allocations g0..g<chainLen>, each a snapshot migration
// of the one before, each changing its data through the mount as chainOps
// says, and destroys the oldest ones so that the remaining three, like a
// node whose collector keeps up, leave the deep layers of the newest one
// mergeable. It returns the remaining allocations, oldest first.
func buildChain(t *testing.T, tm *testMount) []string {
	t.Helper()
	web := []allocdir.Task{{Name: "web"}}
	for i := 0; i <= chainLen; i++ {
		id := chainID(i)
		if i == 0 {
			if _, err := tm.store.Create(id, web, store.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		} else {
			if _, err := tm.store.Stop(chainID(i - 1)); err != nil {
				t.Fatal(err)
			}
			if _, err := tm.store.Create(id, web, store.CreateOptions{Previous: chainID(i - 1), Migration: store.MigrationSnapshot}); err != nil {
				t.Fatal(err)
			}
		}
		chainOps[i](t, filepath.Join(tm.dir, id, "alloc/data"), filepath.Join(tm.dir, id, "web/local"))
	}
	if n := len(mustState(t, tm.store, chainID(chainLen)).Volumes["alloc/data"].Lowers); n != chainLen {
		t.Fatalf("newest allocation has %d lowers, want %d", n, chainLen)
	}
	keep := chainLen - 2
	for i := range keep {
		if err := tm.store.Destroy(chainID(i)); err != nil {
			t.Fatal(err)
		}
	}
	var out []string
	for i := keep; i <= chainLen; i++ {
		out = append(out, chainID(i))
	}
	return out
}

// stackOf is the layers of v, top first.
func stackOf(v *record.Volume) []string { return append([]string{v.Upper}, v.Lowers...) }

// layersOf is every layer st stacks.
func layersOf(st *record.State) map[string]bool {
	out := make(map[string]bool)
	for _, v := range st.Volumes {
		for _, l := range stackOf(v) {
			out[l] = true
		}
	}
	return out
}

// retainedLayers lists, sorted, the layers the store's allocations retain.
func retainedLayers(s *store.Store) []string {
	var out []string
	for _, st := range s.List() {
		out = append(out, st.Retained...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// volumeView describes every entry a volume shows, read from its layers
// with the mount's own overlay logic: type and mode, owner, mtime, and
// for non-directories the inode, size, content (or target) and extended
// attributes. Left out are the ctime and link count, which every link(2)
// changes, and a directory's inode number: a merge makes directories
// anew. The inode number shows that hard-linked names stay one file.
func volumeView(t *testing.T, s *store.Store, id, key string) map[string]string {
	t.Helper()
	var roots []string
	for _, l := range stackOf(mustState(t, s, id).Volumes[key]) {
		roots = append(roots, s.LayerPath(l))
	}
	return rootsView(t, roots)
}

// rootsView is volumeView for a stack of layer roots, top first.
func rootsView(t *testing.T, roots []string) map[string]string {
	t.Helper()
	o := &layer.Stack{Roots: roots}
	all := o.All()
	out := make(map[string]string)
	var walk func(rel string, layers []int)
	walk = func(rel string, layers []int) {
		shown, st, err := o.Visible(rel, layers)
		if err != nil {
			t.Fatalf("%v: visible %q: %v", roots, rel, err)
		}
		out["/"+rel] = describe(t, o.Path(shown[0], rel), &st)
		if !layer.IsDir(&st) {
			return
		}
		entries, err := o.List(rel, shown)
		if err != nil {
			t.Fatalf("%v: list %q: %v", roots, rel, err)
		}
		for _, e := range entries {
			walk(filepath.Join(rel, e.Name), shown)
		}
	}
	walk("", all)
	return out
}

func describe(t *testing.T, p string, st *syscall.Stat_t) string {
	t.Helper()
	d := fmt.Sprintf("mode=%o uid=%d gid=%d mtime=%d", st.Mode, st.Uid, st.Gid, st.Mtim.Nano())
	if layer.IsDir(st) {
		return d
	}
	d += fmt.Sprintf(" ino=%d size=%d", st.Ino, st.Size)
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		d += " sha256=" + hex.EncodeToString(sum[:8])
	case syscall.S_IFLNK:
		target, err := os.Readlink(p)
		if err != nil {
			t.Fatal(err)
		}
		d += " target=" + target
	}
	names, err := layer.ListXattrs(layer.PathLoc(p))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(names)
	for _, n := range names {
		if strings.HasPrefix(n, "trusted.overlay.") {
			continue
		}
		val, err := layer.GetXattr(layer.PathLoc(p), n)
		if err != nil {
			t.Fatal(err)
		}
		d += fmt.Sprintf(" %s=%q", n, val)
	}
	return d
}

// storeViews is every volume view of the allocations ids.
func storeViews(t *testing.T, s *store.Store, ids []string) map[string]map[string]string {
	t.Helper()
	out := make(map[string]map[string]string)
	for _, id := range ids {
		for _, key := range []string{"alloc/data", "web/local"} {
			out[id+"/"+key] = volumeView(t, s, id, key)
		}
	}
	return out
}

func diffViews(t *testing.T, got, want map[string]map[string]string) {
	t.Helper()
	for vol, w := range want {
		g := got[vol]
		for p, wd := range w {
			if gd, ok := g[p]; !ok {
				t.Errorf("%s%s: gone after the flatten, want %s", vol, p, wd)
			} else if gd != wd {
				t.Errorf("%s%s: got %s, want %s", vol, p, gd, wd)
			}
		}
		for p, gd := range g {
			if _, ok := w[p]; !ok {
				t.Errorf("%s%s: appeared after the flatten: %s", vol, p, gd)
			}
		}
	}
}

// layerInodes is the set of inode numbers of every non-directory in the
// layers the allocations reference.
func layerInodes(t *testing.T, s *store.Store, ids []string) map[uint64]string {
	t.Helper()
	out := make(map[uint64]string)
	for _, id := range ids {
		for l := range layersOf(mustState(t, s, id)) {
			root := s.LayerPath(l)
			err := filepath.WalkDir(root, func(p string, d iofs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				var st syscall.Stat_t
				if err := syscall.Lstat(p, &st); err != nil {
					return err
				}
				out[st.Ino] = p
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return out
}

// TestFlattenChain checks that flattening a snapshot chain deeper than the
// bound brings every volume within it, that every remaining allocation
// shows exactly what it showed before (content, modes, owners, times,
// extended attributes, inode numbers), that no byte was copied (every
// file of the new layers is an inode the old ones had), that the layers
// merged away are gone, staging is empty, and that a restarted store
// reads the same.
func TestFlattenChain(t *testing.T) {
	skipFlattenWithLimits(t)
	tm := newTestMount(t)
	ids := buildChain(t, tm)
	before := storeViews(t, tm.store, ids)
	inodes := layerInodes(t, tm.store, ids)
	oldLayers := make(map[string]bool)
	for _, id := range ids {
		for l := range layersOf(mustState(t, tm.store, id)) {
			oldLayers[l] = true
		}
	}

	n, err := tm.store.Flatten()
	if err != nil {
		t.Fatalf("Flatten: %v", err)
	}
	// alloc/data and web/local, each over the bound by the same count.
	if want := 2 * (chainLen - store.MaxLowers); n != want {
		t.Errorf("Flatten merged %d pairs, want %d", n, want)
	}
	for _, id := range ids {
		for key, v := range mustState(t, tm.store, id).Volumes {
			if len(v.Lowers) > store.MaxLowers {
				t.Errorf("%s/%s after the flatten: %d lowers, want at most %d", id, key, len(v.Lowers), store.MaxLowers)
			}
		}
	}
	diffViews(t, storeViews(t, tm.store, ids), before)
	for ino, p := range layerInodes(t, tm.store, ids) {
		if _, ok := inodes[ino]; !ok {
			t.Errorf("%s is a new inode (%d): the flatten copied it", p, ino)
		}
	}
	if got := dirNames(t, tm.store.StagingDir()); len(got) != 0 {
		t.Errorf("staging after the flatten: %v, want empty", got)
	}
	if n, err := tm.store.Flatten(); n != 0 || err != nil {
		t.Errorf("second Flatten: %d merges, %v; want nothing to do", n, err)
	}

	// The layers merged away stay while the allocations that stacked
	// them do (the mount may still read them), and go with them.
	retained := retainedLayers(tm.store)
	if want := 2 * 2 * (chainLen - store.MaxLowers); len(retained) != want {
		t.Errorf("retained layers: %v, want %d", retained, want)
	}
	for _, l := range retained {
		if !oldLayers[l] {
			t.Errorf("retained layer %s was not in use before the flatten", l)
		}
		if fi, err := os.Stat(tm.store.LayerPath(l)); err != nil || !fi.IsDir() {
			t.Errorf("retained layer %s while its allocations live: %v", l, err)
		}
	}
	if n, err := tm.store.Sweep(); n != 0 || err != nil {
		t.Errorf("Sweep while the allocations live: removed %d, %v; want nothing", n, err)
	}

	// A restart remembers them.
	must(t, tm.store.Close())
	reopened := openTestStore(t, tm.store.DataDir(), store.Options{})
	diffViews(t, storeViews(t, reopened, ids), before)
	if got := retainedLayers(reopened); strings.Join(got, ",") != strings.Join(retained, ",") {
		t.Errorf("retained layers after a reopen: %v, want %v", got, retained)
	}
	for _, id := range ids {
		must(t, reopened.Destroy(id))
	}
	if got := layerDirs(t, reopened); len(got) != 0 {
		t.Errorf("layers once every allocation is destroyed: %v, want none", got)
	}
}

// TestMountFlattenOpenFile checks a flatten under a live mount: a file
// of a deep layer held open by the newest allocation reads on to its end,
// and listings through the mount are the same before and after.
func TestMountFlattenOpenFile(t *testing.T) {
	skipFlattenWithLimits(t)
	tm := newTestMount(t)
	ids := buildChain(t, tm)
	// The mount that built the chain, which holds nodes of every
	// generation: each has its own (identity.go).
	m := tm.mount
	newest := filepath.Join(tm.dir, ids[len(ids)-1])
	f, err := os.Open(filepath.Join(newest, "alloc/data/big"))
	must(t, err)
	defer f.Close()
	want := strings.Repeat("0123456789abcdef", 64<<10)
	head := make([]byte, len(want)/2)
	_, err = io.ReadFull(f, head)
	must(t, err)
	listings := func() string {
		t.Helper()
		var lines []string
		for _, id := range ids {
			if _, err := tm.store.Get(id); err != nil {
				continue // collected
			}
			err := filepath.WalkDir(filepath.Join(tm.dir, id), func(p string, d iofs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				fi, err := d.Info()
				if err != nil {
					return err
				}
				line := fmt.Sprintf("%s %v", strings.TrimPrefix(p, tm.dir), fi.Mode())
				if fi.Mode().IsRegular() {
					line += fmt.Sprintf(" %d", fi.Size())
				}
				lines = append(lines, line)
				return nil
			})
			must(t, err)
		}
		return strings.Join(lines, "\n")
	}
	before := listings()
	start := time.Now()
	if n, err := tm.store.Flatten(); err != nil || n == 0 {
		t.Fatalf("Flatten: %d merges, %v", n, err)
	}
	t.Logf("flatten took %v", time.Since(start))
	tail, err := io.ReadAll(f)
	must(t, err)
	if got := string(head) + string(tail); got != want {
		t.Errorf("the open file read %d bytes across the flatten, want %d identical ones", len(got), len(want))
	}
	if after := listings(); after != before {
		t.Errorf("listing after the flatten:\n%s\nwant:\n%s", after, before)
	}
	// Once the file is closed and the kernel has let go of the volume, a
	// new lookup builds it on the merged layer.
	must(t, f.Close())
	must(t, m.Unmount())
	m2, err := NewMount(testLogger(t), tm.store, tm.dir, DefaultMountOptions())
	must(t, err)
	t.Cleanup(func() { must(t, m2.Unmount()) })
	if after := listings(); after != before {
		t.Errorf("listing through a new mount after the flatten:\n%s\nwant:\n%s", after, before)
	}
	if b, err := os.ReadFile(filepath.Join(newest, "alloc/data/d/a")); err == nil {
		t.Errorf("d/a, removed with its directory in generation 1, reads %q", b)
	}
	if got := readMount(t, tm, ids[len(ids)-1]+"/alloc/data/f1"); got != "gen 1\n" {
		t.Errorf("f1 after the flatten: got %q", got)
	}
}

// layerSpec builds a layer by hand in the overlay format: "name" is a
// file with that content, "dir/" a directory, "dir/!" marks it opaque,
// "name=wh" a whiteout, "name->target" a symbolic link, "a==b" a hard
// link of b named a.
func layerSpec(t *testing.T, root string, spec ...string) {
	t.Helper()
	must(t, os.MkdirAll(root, 0o755))
	for _, e := range spec {
		switch {
		case strings.HasSuffix(e, "/!"):
			must(t, os.MkdirAll(filepath.Join(root, strings.TrimSuffix(e, "/!")), 0o750))
			must(t, unix.Setxattr(filepath.Join(root, strings.TrimSuffix(e, "/!")), layer.OpaqueXattr, []byte("y"), 0))
		case strings.HasSuffix(e, "/"):
			must(t, os.MkdirAll(filepath.Join(root, e), 0o750))
			must(t, unix.Setxattr(filepath.Join(root, e), "user.dir", []byte(e), 0))
		case strings.HasSuffix(e, "=wh"):
			must(t, unix.Mknod(filepath.Join(root, strings.TrimSuffix(e, "=wh")), unix.S_IFCHR, 0))
		case strings.Contains(e, "=="):
			a, b, _ := strings.Cut(e, "==")
			must(t, os.Link(filepath.Join(root, b), filepath.Join(root, a)))
		case strings.Contains(e, "->"):
			a, b, _ := strings.Cut(e, "->")
			must(t, os.Symlink(b, filepath.Join(root, a)))
		default:
			mustWrite(t, filepath.Join(root, e), root+":"+e, 0o640)
		}
	}
}

// TestFlattenMergeMatchesOverlay checks the merge itself against the
// overlay lookup the mount does, on hand-made layers with every case of
// two entries meeting: a file over a file, a whiteout over a file and
// over a directory, a directory over a directory (plain and opaque),
// over a file, over a whiteout and over nothing, a whiteout over nothing,
// and what a third layer below shows through each. With layers below the
// pair, the merged layer must read the same over them; without, it must
// read the same alone, and then keeps no whiteout or opaque mark.
func TestFlattenMergeMatchesOverlay(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts and trusted.overlay xattrs need root")
	}
	dir := t.TempDir()
	upper, lower, below := filepath.Join(dir, "u"), filepath.Join(dir, "l"), filepath.Join(dir, "b")
	layerSpec(t, upper,
		"a", "b=wh", "d/", "d/x=wh", "d/n", "e/!", "e/k", "f/", "f/r", "g/", "g/q2",
		"h/", "h/h2", "w2=wh", "t", "v=wh", "o/", "o/deep/", "o/deep/p", "sym->a")
	layerSpec(t, lower,
		"a", "b", "d/", "d/x", "d/y", "e/", "e/z", "f", "g/!", "g/q", "w=wh",
		"t/", "t/u", "v/", "v/vv", "o/", "o/deep/", "o/deep/gone=wh", "o/deep/kept",
		"hl1", "hl2==hl1", "sym2->d/y", "gone/", "gone/x=wh")
	must(t, unix.Mkfifo(filepath.Join(lower, "fifo"), 0o600))
	layerSpec(t, below,
		"a", "b", "c", "d/", "d/x", "d/y2", "e/", "e/z2", "f/", "f/r2", "g/", "g/q3",
		"h/", "h/h1", "w", "w2", "o/", "o/deep/", "o/deep/gone", "o/deep/under", "gone/", "gone/x")

	for _, through := range []bool{true, false} {
		t.Run(fmt.Sprintf("through=%v", through), func(t *testing.T) {
			merged := filepath.Join(dir, fmt.Sprintf("m-%v", through))
			must(t, os.Mkdir(merged, 0o700))
			must(t, errOnly(layer.Merge(disk.OS{}, merged, upper, lower, through)))
			pair, flat := []string{upper, lower}, []string{merged}
			if through {
				pair, flat = append(pair, below), append(flat, below)
			}
			diffViews(t, map[string]map[string]string{"merged": rootsView(t, flat)},
				map[string]map[string]string{"merged": rootsView(t, pair)})
			marks := 0
			err := filepath.WalkDir(merged, func(p string, d iofs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				var st syscall.Stat_t
				must(t, syscall.Lstat(p, &st))
				if layer.IsWhiteout(&st) || (d.IsDir() && layer.IsOpaque(layer.PathLoc(p))) {
					marks++
				}
				if !d.IsDir() && st.Nlink < 2 {
					t.Errorf("%s has %d links: it was not linked from the pair", p, st.Nlink)
				}
				return nil
			})
			must(t, err)
			if through && marks == 0 {
				t.Errorf("merged layer over a third has no whiteout or opaque mark")
			}
			if !through && marks != 0 {
				t.Errorf("merged bottom layer keeps %d whiteouts or opaque marks, want none", marks)
			}
		})
	}
}

// skipFlattenWithLimits skips a test of flattening where the stores have
// disk limits (ALLOCFS_TEST_DATA_FS=btrfs): there layers are subvolumes,
// which link(2) cannot merge, and Flatten leaves them (store.Flatten).
func skipFlattenWithLimits(t *testing.T) {
	if storetest.Subvolumes() {
		t.Skip("flatten does not run on a store with disk limits (layers are btrfs subvolumes)")
	}
}
