package fs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/integration/nomadreplay"
)

// TestChrootGCStress is Nomad's GC of a chroot (os.RemoveAll of the
// allocation directory) after Nomad's embed of it, again and again, each
// time with the kernel's dentries and inodes dropped just before, while
// another walker stats the same tree. Dropped inodes are forgotten in the
// order the kernel's inode cache evicts them, not the tree's, and the
// FORGETs reach the daemon alongside the removal's LOOKUPs: a directory
// whose node outlived its volume root's was once handed back under the
// root made anew, and answered ENOENT to everything, so that RemoveAll
// took it for gone and the rmdir of its parent failed with ENOTEMPTY.
// Without the right to drop caches (not root) it still removes the tree
// under the walker's lookups.
func TestChrootGCStress(t *testing.T) {
	h := filepath.Join(t.TempDir(), "share")
	wideDeepTree(t, h)
	tm := newTestMountTuned(t, store.Options{}, func(o *MountOptions) {
		o.ChrootEnv = map[string]string{h: "/usr/share"}
	})
	env := map[string]string{h: "/usr/share"}
	budget := 3 * time.Second
	if testing.Short() {
		budget = 0
	}
	start := time.Now()
	for round := 1; round == 1 || time.Since(start) < budget; round++ {
		alloc := filepath.Join(tm.dir, fmt.Sprintf("a%d", round))
		box := filepath.Join(alloc, "box")
		must(t, os.Mkdir(alloc, 0o755))
		must(t, os.Mkdir(box, 0o777))
		must(t, os.Chmod(box, 0o777))
		must(t, os.Chown(box, nomadreplay.Nobody, nomadreplay.Nobody))
		if _, err := nomadreplay.Embed(box, env); err != nil {
			t.Fatal(err)
		}
		// Nomad's build chowns what it re-creates: a few directories
		// of the chroot are copied up and merge with the host's.
		for _, d := range []string{"usr/share/d0", "usr/share/d1/s1", "usr/share/d2/s0/t2"} {
			must(t, os.Chown(filepath.Join(box, d), nomadreplay.Nobody, nomadreplay.Nobody))
		}
		dropDentriesAndInodes(t)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				// Errors are the removal's: names vanish under the walk.
				_ = filepath.WalkDir(filepath.Join(box, "usr"), func(p string, e fs.DirEntry, err error) error {
					if err == nil {
						_, _ = os.Lstat(p)
					}
					return nil
				})
			}
		}()
		err := os.RemoveAll(alloc)
		close(stop)
		wg.Wait()
		if err != nil {
			left, _ := exec.Command("find", alloc).CombinedOutput()
			t.Fatalf("round %d: %v; left:\n%.2000s", round, err, left)
		}
		if _, err := os.Lstat(alloc); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("round %d: the allocation after its removal: %v", round, err)
		}
	}
}

// wideDeepTree makes at h a host tree of directories three deep, a few
// wide at each level, each holding files: thousands of entries, enough
// that the kernel's FORGETs of one removal's inodes take a while.
func wideDeepTree(t *testing.T, h string) {
	t.Helper()
	var mk func(dir string, depth int)
	mk = func(dir string, depth int) {
		must(t, os.MkdirAll(dir, 0o755))
		for f := range 12 {
			must(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", f)), nil, 0o644))
		}
		if depth == 0 {
			return
		}
		for s := range 3 {
			mk(filepath.Join(dir, fmt.Sprintf("%c%d", "dst"[3-depth], s)), depth-1)
		}
	}
	for d := range 8 {
		mk(filepath.Join(h, fmt.Sprintf("d%d", d)), 2)
	}
	must(t, os.Symlink("d0/f0", filepath.Join(h, "link")))
}

// dropDentriesAndInodes makes the kernel drop its unused dentries and
// inodes (not the page cache), as memory pressure does.
func dropDentriesAndInodes(t *testing.T) {
	t.Helper()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Logf("inodes left cached: %v", err)
	}
}
