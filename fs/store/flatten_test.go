package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"golang.org/x/sys/unix"
)

// chainLen is how many snapshot migrations the chain tests make: two more
// than the bound, so that the newest allocation is over it.
const chainLen = MaxLowers + 2

// chainID names the allocation of generation i.
func chainID(i int) string { return fmt.Sprintf("g%d", i) }

// maxDepth is the deepest frozen stack (lowers, and a frozen upper) among
// the volumes of ids.
func maxDepth(t *testing.T, s *Store, ids []string) int {
	t.Helper()
	depth := 0
	for _, id := range ids {
		for _, v := range mustState(t, s, id).Volumes {
			depth = max(depth, len(v.Lowers))
		}
	}
	return depth
}

// layeredChain makes allocations g0..g<chainLen>, each a snapshot
// migration of the one before, as the tree's tests do through a mount,
// but writing each generation's changes straight into its upper layers
// in the overlay format (writeGeneration). It destroys the oldest ones so
// that the remaining three, like a node whose collector keeps up, leave
// the deep layers of the newest one mergeable, and returns the store and
// the remaining allocations, oldest first.
func layeredChain(t *testing.T) (*Store, []string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("whiteouts and opaque marks need root")
	}
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	for i := 0; i <= chainLen; i++ {
		id := chainID(i)
		if i == 0 {
			must(t, errOnly(s.Create(id, tasks("web"), CreateOptions{})))
		} else {
			must(t, errOnly(s.Stop(chainID(i-1))))
			if _, err := s.Create(id, tasks("web"), CreateOptions{Previous: chainID(i - 1), Migration: MigrationSnapshot}); err != nil {
				t.Fatal(err)
			}
		}
		st := mustState(t, s, id)
		writeGeneration(t, i, s.LayerPath(st.Volumes["alloc/data"].Upper), s.LayerPath(st.Volumes["web/local"].Upper))
	}
	if n := len(mustState(t, s, chainID(chainLen)).Volumes["alloc/data"].Lowers); n != chainLen {
		t.Fatalf("newest allocation has %d lowers, want %d", n, chainLen)
	}
	keep := chainLen - 2
	for i := range keep {
		must(t, s.Destroy(chainID(i)))
	}
	var out []string
	for i := keep; i <= chainLen; i++ {
		out = append(out, chainID(i))
	}
	return s, out
}

// writeGeneration writes generation i's changes into the upper layers of
// its alloc/data and web/local: at first a file per generation, a
// directory, a hard-linked pair, a symbolic link, a fifo and an extended
// attribute; then in each generation its own file and one in the
// directory, a whiteout over the previous generation's file, and in every
// other one an opaque directory that hides what the lowers held there.
func writeGeneration(t *testing.T, i int, data, local string) {
	t.Helper()
	own := fmt.Sprintf("f%d", i)
	mustWrite(t, filepath.Join(data, own), "generation "+own+"\n", 0o640)
	mustWrite(t, filepath.Join(data, "d", "in"+own), own+"\n", 0o644)
	mustWrite(t, filepath.Join(local, "conf"), own+"\n", 0o600)
	if i == 0 {
		mustWrite(t, filepath.Join(data, "h1"), "hard\n", 0o644)
		must(t, os.Link(filepath.Join(data, "h1"), filepath.Join(data, "h2")))
		must(t, os.Symlink("f0", filepath.Join(data, "l")))
		must(t, unix.Mkfifo(filepath.Join(data, "p"), 0o620))
		must(t, unix.Setxattr(filepath.Join(data, "h1"), "user.tag", []byte("g0"), 0))
		mustWrite(t, filepath.Join(data, "e", "base"), "base\n", 0o644)
		return
	}
	must(t, unix.Mknod(filepath.Join(data, fmt.Sprintf("f%d", i-1)), unix.S_IFCHR, 0))
	if i%2 == 0 {
		mustWrite(t, filepath.Join(data, "e", own), own+"\n", 0o644)
		must(t, layer.MarkOpaque(layer.PathLoc(filepath.Join(data, "e"))))
	}
}

// layerTrees describes every entry of every layer (path, mode, inode,
// size, mtime and extended attributes): what a flatten must never change.
// Link counts and ctimes are left out, since a merge links the pair's
// files while it works.
func layerTrees(t *testing.T, s *Store) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(s.layersDir(), func(p string, _ iofs.DirEntry, err error) error {
		if err != nil || p == s.layersDir() {
			return err // layers/ itself changes as layers come and go
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		names, err := layer.ListXattrs(layer.PathLoc(p))
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, s.layersDir())
		fmt.Fprintf(&b, "%s mode=%o ino=%d size=%d mtime=%d xattrs=%v\n", rel, st.Mode, st.Ino, st.Size, st.Mtim.Nano(), names)
		return nil
	})
	must(t, err)
	return b.String()
}

// storeSnapshot is what a failed flatten must leave alone: every record,
// in memory and on disk, and the set of layers.
func storeSnapshot(t *testing.T, s *Store, ignore ...string) string {
	t.Helper()
	var b bytes.Buffer
	mem, err := json.Marshal(s.List())
	must(t, err)
	b.Write(mem)
	for _, f := range stateFiles(t, s) {
		data, err := os.ReadFile(filepath.Join(s.DataDir(), "state", f))
		must(t, err)
		b.WriteString("\n" + f + "\n")
		b.Write(data)
	}
	var layers []string
	for _, l := range layerDirs(t, s) {
		if !slices.Contains(ignore, l) {
			layers = append(layers, l)
		}
	}
	b.WriteString("\nlayers: " + strings.Join(layers, ","))
	return b.String()
}

// flattensNothing reports whether the layers of s are btrfs subvolumes,
// which Flatten leaves (link(2) cannot merge them), and checks there that
// it changes nothing: the caller has no merge to test.
func flattensNothing(t *testing.T, s *Store) bool {
	t.Helper()
	if s.quota == nil || !s.quota.Subvolumes() {
		return false
	}
	before, trees := storeSnapshot(t, s), layerTrees(t, s)
	if n, err := s.Flatten(); n != 0 || err != nil {
		t.Errorf("Flatten of subvolumes: %d merges, %v; want none", n, err)
	}
	if after := storeSnapshot(t, s); after != before {
		t.Errorf("store after a flatten of subvolumes:\n%s\nwant:\n%s", after, before)
	}
	if got := layerTrees(t, s); got != trees {
		t.Errorf("layers after a flatten of subvolumes:\n%s\nwant:\n%s", got, trees)
	}
	t.Log("the layers are btrfs subvolumes: Flatten left them as they were, as it must")
	return true
}

// TestFlattenFailureChangesNothing checks that a flatten that fails while
// it links the merged layer, or while it switches the records over (the
// journal cannot take the intent), leaves every record and layer as it
// was and staging empty, and that the next pass succeeds.
func TestFlattenFailureChangesNothing(t *testing.T) {
	s, ids := layeredChain(t)
	if flattensNothing(t, s) {
		return
	}
	before := storeSnapshot(t, s)
	trees := layerTrees(t, s)
	injected := errors.New("injected fault")

	for _, tc := range []struct {
		name  string
		fault func() func(op, p string) error
	}{
		{"link", func() func(op, p string) error {
			links := 0
			return func(op, _ string) error {
				if op == "link" {
					if links++; links == 3 {
						return injected
					}
				}
				return nil
			}
		}},
		{"mkdir", func() func(op, p string) error {
			return func(op, _ string) error {
				if op == "mkdir" {
					return injected
				}
				return nil
			}
		}},
		{"switch", func() func(op, p string) error {
			return func(op, _ string) error {
				if op == "append" {
					return injected
				}
				return nil
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The two oldest layers of alloc/data: every remaining
			// allocation stacks them, and they hold every kind of entry.
			lowers := mustState(t, s, ids[len(ids)-1]).Volumes["alloc/data"].Lowers
			s.mu.RLock()
			plan := s.mergeableLocked(lowers[len(lowers)-2], lowers[len(lowers)-1])
			s.mu.RUnlock()
			if plan == nil || len(plan.allocs) != len(ids) {
				t.Fatalf("plan for the oldest pair: %+v, want one over %v", plan, ids)
			}
			plan.key = "alloc/data"
			setFault(s, tc.fault())
			err := s.flatten(plan)
			setFault(s, nil)
			if !errors.Is(err, injected) {
				t.Fatalf("flatten with a fault: %v, want the fault", err)
			}
			if after := storeSnapshot(t, s); after != before {
				t.Errorf("store after a failed flatten:\n%s\nwant:\n%s", after, before)
			}
			if got := dirNames(t, s.StagingDir()); len(got) != 0 {
				t.Errorf("staging after a failed flatten: %v, want empty", got)
			}
			if got := layerTrees(t, s); got != trees {
				t.Errorf("layers after a failed flatten:\n%s\nwant:\n%s", got, trees)
			}
		})
	}
	if n, err := s.Flatten(); err != nil || n == 0 {
		t.Fatalf("Flatten after the faults: %d merges, %v", n, err)
	}
}

// TestFlattenKeepsAwayFromPins checks that no layer a pinned allocation
// uses is merged (a snapshot streaming from it reads its paths), and that
// the chain is flattened once the pin is released.
func TestFlattenKeepsAwayFromPins(t *testing.T) {
	s, ids := layeredChain(t)
	if flattensNothing(t, s) {
		return
	}
	// The oldest remaining allocation stacks every deep layer.
	unpin, err := s.Pin(ids[0])
	must(t, err)
	before := storeSnapshot(t, s)
	if n, err := s.Flatten(); n != 0 || err != nil {
		t.Errorf("Flatten while pinned: %d merges, %v; want none", n, err)
	}
	if after := storeSnapshot(t, s); after != before {
		t.Errorf("store after a flatten while pinned:\n%s\nwant:\n%s", after, before)
	}
	unpin()
	if n, err := s.Flatten(); n == 0 || err != nil {
		t.Errorf("Flatten after the unpin: %d merges, %v", n, err)
	}
	if d := maxDepth(t, s, ids); d > MaxLowers {
		t.Errorf("deepest stack after the unpin: %d lowers, want at most %d", d, MaxLowers)
	}
}

// TestRetainedLayersAfterRestart checks that layers a flatten retained are
// removed by the sweep once the allocations that retained them are gone,
// also when they went while the daemon was down, rather than left behind
// as orphans.
func TestRetainedLayersAfterRestart(t *testing.T) {
	s, ids := layeredChain(t)
	for _, id := range ids[:len(ids)-2] {
		must(t, s.Destroy(id))
	}
	if flattensNothing(t, s) {
		return
	}
	if n, err := s.Flatten(); err != nil || n == 0 {
		t.Fatalf("Flatten: %d merges, %v; want some", n, err)
	}
	retained := retainedLayers(s)
	if len(retained) == 0 {
		t.Fatal("no layer retained after a flatten")
	}
	// The live allocations go while the daemon is down: an operator
	// moves their records away.
	must(t, s.Close())
	for _, id := range ids[len(ids)-2:] {
		must(t, os.Remove(s.statePath(id)))
	}
	reopened := openTestStore(t, s.DataDir())
	if n, err := reopened.Sweep(); err != nil || n == 0 {
		t.Fatalf("Sweep: removed %d, %v; want the orphans removed", n, err)
	}
	for _, l := range retained {
		if _, err := os.Lstat(reopened.LayerPath(l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("retained layer %s after a restart with its allocations gone: %v, want it removed", l, err)
		}
	}
	if got := layerDirs(t, reopened); len(got) != 0 {
		t.Errorf("layers after the sweep: %v, want none", got)
	}
}

// retainedLayers lists, sorted, the layers the store's allocations retain.
func retainedLayers(s *Store) []string {
	set := make(map[string]struct{})
	for _, st := range s.List() {
		for _, l := range st.Retained {
			set[l] = struct{}{}
		}
	}
	return sortedKeys(set)
}

// TestRetiredFileAdopted checks that the list of retired layers an earlier
// version kept (retired-layers.json) is moved into the records of the
// allocations it names, and that its layers whose allocations are gone
// become orphans the sweep removes.
func TestRetiredFileAdopted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	mustCreate(t, s, "a", "web")
	old1, old2, gone := mustLayer(t, s), mustLayer(t, s), mustLayer(t, s)
	must(t, s.Close())
	list := fmt.Sprintf(`[{"layers":[%q,%q],"allocs":["a"]},{"layers":[%q],"allocs":["z"]},{"layers":["../../etc"],"allocs":["a"]}]`, old1, old2, gone)
	must(t, os.WriteFile(filepath.Join(dir, retiredFile), []byte(list), 0o600))

	s2 := openTestStore(t, dir)
	if got, want := mustState(t, s2, "a").Retained, []string{old1, old2}; !slices.Equal(got, want) {
		t.Errorf("retained by a: %v, want %v", got, want)
	}
	if _, err := os.Lstat(filepath.Join(dir, retiredFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old list after the open: %v, want it removed", err)
	}
	if n, err := s2.Sweep(); n != 1 || err != nil {
		t.Errorf("Sweep: removed %d, %v; want the one layer of a gone allocation", n, err)
	}
	for _, l := range []string{old1, old2} {
		if err := s2.checkLayer(l); err != nil {
			t.Errorf("retained layer %s: %v", l, err)
		}
	}
	must(t, s2.Destroy("a"))
	if got := layerDirs(t, s2); len(got) != 0 {
		t.Errorf("layers after a is destroyed: %v, want none", got)
	}
}

// mustLayer makes an empty layer no record names.
func mustLayer(t *testing.T, s *Store) string {
	t.Helper()
	f, err := s.newLayer(0o755, "")
	must(t, err)
	return f.ID
}

// TestFlattenNeedsCollection checks that nothing is merged while every
// stopped allocation of the chain is kept: each frozen view ends at its
// own sealed layer, so no two layers are stacked alike everywhere.
func TestFlattenNeedsCollection(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	web := []allocdir.Task{{Name: "web"}}
	must(t, errOnly(s.Create("c0", web, CreateOptions{})))
	for i := 1; i <= chainLen; i++ {
		must(t, errOnly(s.Stop(fmt.Sprintf("c%d", i-1))))
		if _, err := s.Create(fmt.Sprintf("c%d", i), web, CreateOptions{Previous: fmt.Sprintf("c%d", i-1), Migration: MigrationSnapshot}); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Flatten(); n != 0 || err != nil {
		t.Errorf("Flatten with the whole chain alive: %d merges, %v; want none", n, err)
	}
}
