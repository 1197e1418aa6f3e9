package fs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/integration/nomadreplay"
	"github.com/hashicorp/go-hclog"
)

// BenchmarkChrootEmbed times Nomad's embed of its chroot_env into an exec
// task's directory (nomadreplay.Embed: every directory re-created and
// chowned, every file stat'ed, then linked, else copied), cold, on three
// sides, and then Nomad's GC of it (os.RemoveAll, untimed by ns/op:
// removeall-s/op):
//
//	native  a directory on the filesystem of the data dir, as Nomad's
//	        alloc_dir on a plain disk: the files are hard links
//	mount   a task directory Nomad made through the mount, which shows the
//	        chroot environment: every file is found there, none copied
//	copy    a task directory of an allocation made through the API, which
//	        never shows it: a link into a FUSE mount fails (EXDEV), so
//	        every file is copied, as on a plain FUSE alloc_dir
//
// The environment is Nomad's default chroot_env, or
// ALLOCFS_BENCH_CHROOT_ENV (SRC[=DEST],...). The copy side writes a copy
// of all of it (gigabytes for the default): it runs only with
// ALLOCFS_BENCH_CHROOT_COPY=1. The GC is timed only with
// ALLOCFS_BENCH_CHROOT_GC=1: on the mount it takes minutes for the default
// environment, and the task directories go with the mount's data dir
// anyway.
func BenchmarkChrootEmbed(b *testing.B) {
	env, s, m, mnt, native := chrootBenchMount(b, DefaultChrootEnv())
	b.Logf("chroot_env %v, io_uring %v, passthrough %v", env, m.ioUring, m.Passthrough())

	n := 0
	// taskDir makes a fresh task directory on side as Nomad's task dir
	// hook does before the embed: made, chmod 0777, given to nobody.
	taskDir := func(b *testing.B, side string) string {
		n++
		id := fmt.Sprintf("a%04d", n)
		var dir string
		switch side {
		case "native":
			dir = filepath.Join(native, id, "box")
			must(b, os.MkdirAll(dir, 0o777))
		case "mount":
			must(b, os.Mkdir(filepath.Join(mnt, id), 0o755))
			dir = filepath.Join(mnt, id, "box")
			must(b, os.Mkdir(dir, 0o777))
		case "copy":
			if _, err := s.Create(id, []allocdir.Task{{Name: "box"}}, store.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			dir = filepath.Join(mnt, id, "box")
		}
		must(b, os.Chmod(dir, 0o777))
		must(b, os.Chown(dir, nomadreplay.Nobody, nomadreplay.Nobody))
		return dir
	}
	sides := []string{"native", "mount"}
	if os.Getenv("ALLOCFS_BENCH_CHROOT_COPY") == "1" {
		sides = append(sides, "copy")
	}
	for _, side := range sides {
		b.Run(side, func(b *testing.B) {
			var stats nomadreplay.EmbedStats
			var requests uint64
			var removal time.Duration
			byOp := map[string]uint64{}
			for range b.N {
				b.StopTimer()
				dir := taskDir(b, side)
				dropCaches(b)
				before := m.RequestCounts()
				b.StartTimer()
				st, err := nomadreplay.Embed(dir, env)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				after := m.RequestCounts()
				for op, c := range after {
					requests += c - before[op]
					if c > before[op] {
						byOp[op] += c - before[op]
					}
				}
				// Nomad's GC: os.RemoveAll of the task directory.
				if os.Getenv("ALLOCFS_BENCH_CHROOT_GC") == "1" {
					start := time.Now()
					if err := os.RemoveAll(dir); err != nil {
						b.Fatal(err)
					}
					removal += time.Since(start)
				}
				stats.Dirs += st.Dirs
				stats.Linked += st.Linked
				stats.Copied += st.Copied
				stats.Skipped += st.Skipped
				stats.Symlinks += st.Symlinks
				stats.CopiedBytes += st.CopiedBytes
			}
			per := float64(b.N)
			b.ReportMetric(float64(stats.Dirs+stats.Linked+stats.Copied+stats.Skipped+stats.Symlinks)/per, "entries/op")
			b.ReportMetric(float64(stats.CopiedBytes)/per/(1<<20), "copied-MiB/op")
			b.ReportMetric(float64(stats.Linked)/per, "linked/op")
			b.ReportMetric(removal.Seconds()/per, "removeall-s/op")
			if side != "native" {
				b.ReportMetric(float64(requests)/per, "requests/op")
				b.Logf("%s: FUSE requests by opcode over %d ops: %v", side, b.N, byOp)
			}
		})
	}
}

// BenchmarkChrootGC times Nomad's GC of an exec allocation (os.RemoveAll
// of the allocation directory, nomadreplay's Destroy) whose task
// directory holds a chroot, after Nomad's embed of it (untimed), on
// three sides: native, a directory on the data dir's filesystem whose
// chroot is hard links, as Nomad's alloc_dir on a plain disk; mount, an
// allocation Nomad made through the mount, whose task directory shows
// the chroot environment from the host layer; upper, the same tree's
// names made by the task itself in its own layer (empty files), what the
// kernel's requests for the removal cost on the mount with no host layer
// in the way. The environment is
// ALLOCFS_BENCH_CHROOT_ENV (SRC[=DEST],...), /usr/include by default:
// large enough to show the cost an entry, small enough for CI. It
// reports the entries removed and, on the mount, the FUSE requests the
// removal took, by opcode in the log.
func BenchmarkChrootGC(b *testing.B) {
	env, _, m, mnt, native := chrootBenchMount(b, map[string]string{"/usr/include": "/usr/include"})
	n := 0
	for _, side := range []string{"native", "mount", "upper"} {
		b.Run(side, func(b *testing.B) {
			var entries int
			var requests uint64
			byOp := map[string]uint64{}
			for range b.N {
				b.StopTimer()
				n++
				root := filepath.Join(native, fmt.Sprintf("a%04d", n))
				if side != "native" {
					root = filepath.Join(mnt, fmt.Sprintf("a%04d", n))
				}
				dir := filepath.Join(root, "box")
				must(b, os.Mkdir(root, 0o755))
				must(b, os.Mkdir(dir, 0o777))
				must(b, os.Chmod(dir, 0o777))
				if side == "upper" {
					// Written first, so no chroot turns on: the
					// tree is the task's own.
					must(b, os.WriteFile(filepath.Join(dir, "executor.out"), nil, 0o644))
					for src, dst := range env {
						emptyCopy(b, src, filepath.Join(dir, dst))
					}
				} else {
					must(b, os.Chown(dir, nomadreplay.Nobody, nomadreplay.Nobody))
					if _, err := nomadreplay.Embed(dir, env); err != nil {
						b.Fatal(err)
					}
				}
				entries += countEntries(b, dir)
				dropCaches(b)
				before := m.RequestCounts()
				b.StartTimer()
				if err := os.RemoveAll(root); err != nil {
					b.StopTimer()
					left, _ := exec.Command("find", root).CombinedOutput()
					b.Fatalf("%v; left:\n%.2000s", err, left)
				}
				b.StopTimer()
				for op, c := range m.RequestCounts() {
					if c > before[op] {
						requests += c - before[op]
						byOp[op] += c - before[op]
					}
				}
			}
			per := float64(b.N)
			b.ReportMetric(float64(entries)/per, "entries/op")
			if side != "native" {
				b.ReportMetric(float64(requests)/per, "requests/op")
				b.Logf("FUSE requests by opcode over %d ops: %v", b.N, byOp)
			}
		})
	}
}

// countEntries counts what a walk of dir finds below it.
func countEntries(b *testing.B, dir string) int {
	n := 0
	err := filepath.WalkDir(dir, func(_ string, _ os.DirEntry, err error) error {
		n++
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n - 1
}

// emptyCopy makes at dst the tree at src, its files empty: the names and
// types a removal meets, without the data.
func emptyCopy(b *testing.B, src, dst string) {
	err := filepath.WalkDir(src, func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case e.IsDir():
			return os.MkdirAll(to, 0o755)
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		}
		return os.WriteFile(to, nil, 0o644)
	})
	if err != nil {
		b.Fatal(err)
	}
}

// chrootBenchSetup returns the chroot environment a chroot benchmark
// runs with (ALLOCFS_BENCH_CHROOT_ENV, SRC[=DEST],..., else def) and the
// directory it works in (below ALLOCFS_BENCH_DIR when set).
func chrootBenchSetup(b *testing.B, def map[string]string) (map[string]string, string) {
	env := def
	if spec := os.Getenv("ALLOCFS_BENCH_CHROOT_ENV"); spec != "" {
		env = map[string]string{}
		for _, e := range strings.Split(spec, ",") {
			src, dst, ok := strings.Cut(e, "=")
			if !ok {
				dst = src
			}
			env[src] = dst
		}
	}
	base := b.TempDir()
	if d := os.Getenv("ALLOCFS_BENCH_DIR"); d != "" {
		var err error
		if base, err = os.MkdirTemp(d, "allocfs-bench-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(base) })
	}
	return env, base
}

// chrootBenchMount opens a store and mounts it with the chroot
// environment of chrootBenchSetup, for a chroot benchmark: the
// environment, the store, the mount (unmounted at the end), its mount
// point and an empty directory beside it for the native side.
func chrootBenchMount(b *testing.B, def map[string]string) (map[string]string, *store.Store, *Mount, string, string) {
	env, base := chrootBenchSetup(b, def)
	log := hclog.New(&hclog.LoggerOptions{Name: b.Name(), Level: hclog.Warn, Output: os.Stderr})
	s, err := store.Open(log, filepath.Join(base, "data"))
	if err != nil {
		b.Fatal(err)
	}
	mnt := filepath.Join(base, "mnt")
	native := filepath.Join(base, "native")
	for _, d := range []string{mnt, native} {
		must(b, os.Mkdir(d, 0o755))
	}
	mo := DefaultMountOptions()
	mo.IOUring = benchIOUring()
	mo.ChrootEnv = env
	m, err := NewMount(log, s, mnt, mo)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			b.Errorf("unmount: %v", err)
		}
	})
	return env, s, m, mnt, native
}
