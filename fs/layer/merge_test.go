package layer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// osDisk takes a merge's steps as the system calls, and fails the step
// numbered failAt (from 1) when it is set.
type osDisk struct {
	steps, failAt int
}

var errInjected = errors.New("injected fault")

func (d *osDisk) step() error {
	d.steps++
	if d.failAt > 0 && d.steps == d.failAt {
		return errInjected
	}
	return nil
}

func (d *osDisk) MkdirAt(l Loc, mode uint32) error {
	if err := d.step(); err != nil {
		return err
	}
	return l.Mkdir(mode)
}

func (d *osDisk) LinkAt(from, to Loc) error {
	if err := d.step(); err != nil {
		return err
	}
	return Link(from, to)
}

// writeTree makes files (name ending in "/" for a directory) under root.
func writeTree(t testing.TB, root string, names ...string) {
	t.Helper()
	for _, n := range names {
		p := filepath.Join(root, n)
		if n[len(n)-1] == '/' {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// treeNames lists every path under root, sorted.
func treeNames(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		out = append(out, rel)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// TestMergeTakesEveryStepThroughDisk checks that every entry a merge makes
// is one call of its MergeDisk, counted in its stats, and that a step that
// fails stops the merge with that step's error and makes nothing more:
// what a crash test relies on to stop a merge at each step.
func TestMergeTakesEveryStepThroughDisk(t *testing.T) {
	dir := t.TempDir()
	upper, lower := filepath.Join(dir, "u"), filepath.Join(dir, "l")
	writeTree(t, upper, "a", "d/x", "e/")
	writeTree(t, lower, "a", "b", "d/y", "f/z")
	full := filepath.Join(dir, "full")
	if err := os.Mkdir(full, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &osDisk{}
	stats, err := Merge(d, full, upper, lower, false)
	if err != nil {
		t.Fatal(err)
	}
	// a (upper's), b, d/x, d/y, f/z are links; d, e, f directories.
	if want := (MergeStats{Links: 5, Dirs: 3}); stats != want {
		t.Errorf("stats: %+v, want %+v", stats, want)
	}
	if d.steps != stats.Links+stats.Dirs {
		t.Errorf("%d steps through the disk, want %d", d.steps, stats.Links+stats.Dirs)
	}
	var ua, ma syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(upper, "a"), &ua); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Lstat(filepath.Join(full, "a"), &ma); err != nil {
		t.Fatal(err)
	}
	if ua.Ino != ma.Ino {
		t.Errorf("merged a is inode %d, want the upper's %d", ma.Ino, ua.Ino)
	}
	all := treeNames(t, full)

	for failAt := 1; failAt <= d.steps; failAt++ {
		t.Run(fmt.Sprint(failAt), func(t *testing.T) {
			dst := filepath.Join(dir, fmt.Sprintf("fail%d", failAt))
			if err := os.Mkdir(dst, 0o700); err != nil {
				t.Fatal(err)
			}
			fd := &osDisk{failAt: failAt}
			_, err := Merge(fd, dst, upper, lower, false)
			if !errors.Is(err, errInjected) {
				t.Fatalf("merge failing at step %d: %v, want the fault", failAt, err)
			}
			if fd.steps != failAt {
				t.Errorf("%d steps taken, want the merge to stop at %d", fd.steps, failAt)
			}
			// "." is dst itself; every other entry is one step that
			// succeeded.
			if got := len(treeNames(t, dst)) - 1; got != failAt-1 {
				t.Errorf("%d entries made, want %d (of %v)", got, failAt-1, all)
			}
		})
	}
}

// TestMergeDropsMarksAtTheBottom checks that a merge with nothing below
// the pair keeps no whiteout, and with layers below keeps it, so that it
// still hides what they hold.
func TestMergeDropsMarksAtTheBottom(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts need root (mknod)")
	}
	dir := t.TempDir()
	upper, lower := filepath.Join(dir, "u"), filepath.Join(dir, "l")
	writeTree(t, upper, "keep")
	writeTree(t, lower, "b")
	if err := unix.Mknod(filepath.Join(upper, "gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	for _, through := range []bool{false, true} {
		dst := filepath.Join(dir, fmt.Sprint(through))
		if err := os.Mkdir(dst, 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := Merge(&osDisk{}, dst, upper, lower, through); err != nil {
			t.Fatal(err)
		}
		var st syscall.Stat_t
		err := syscall.Lstat(filepath.Join(dst, "gone"), &st)
		switch {
		case through && (err != nil || !IsWhiteout(&st)):
			t.Errorf("through=true: gone is %v (mode %o), want the whiteout kept", err, st.Mode)
		case !through && !errors.Is(err, syscall.ENOENT):
			t.Errorf("through=false: gone is %v (mode %o), want no whiteout", err, st.Mode)
		}
	}
}

// BenchmarkMerge measures one merge of two layers of 5,000 files each
// (10,000 links), keeping whiteouts as over a third layer.
func BenchmarkMerge(b *testing.B) {
	dir := b.TempDir()
	upper, lower := filepath.Join(dir, "u"), filepath.Join(dir, "l")
	for _, root := range []string{upper, lower} {
		var names []string
		for d := range 50 {
			for f := range 100 {
				names = append(names, fmt.Sprintf("d%02d/%s-%03d", d, filepath.Base(root), f))
			}
		}
		writeTree(b, root, names...)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		merged := filepath.Join(dir, fmt.Sprintf("m%d", i))
		if err := os.Mkdir(merged, 0o700); err != nil {
			b.Fatal(err)
		}
		stats, err := Merge(&osDisk{}, merged, upper, lower, true)
		if err != nil {
			b.Fatal(err)
		}
		fd, err := unix.Open(merged, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			b.Fatal(err)
		}
		err = unix.Syncfs(fd)
		unix.Close(fd)
		if err != nil {
			b.Fatal(err)
		}
		if stats.Links != 10000 {
			b.Fatalf("%d links, want 10000", stats.Links)
		}
		b.StopTimer()
		if err := os.RemoveAll(merged); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
