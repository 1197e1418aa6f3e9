package fs

import (
	"fmt"
	"os"
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
	env := DefaultChrootEnv()
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
	log := hclog.New(&hclog.LoggerOptions{Name: b.Name(), Level: hclog.Warn, Output: os.Stderr})
	s, err := store.Open(log, filepath.Join(base, "data"))
	if err != nil {
		b.Fatal(err)
	}
	mnt := filepath.Join(base, "mnt")
	native := filepath.Join(base, "native")
	for _, d := range []string{mnt, native} {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
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
			if _, err := s.Create(id, []allocdir.Task{{Name: "box"}}); err != nil {
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
