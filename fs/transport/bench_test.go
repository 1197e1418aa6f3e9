package transport_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/allocfs/allocfs/metrics"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// BenchmarkRoundTrip measures the transport alone: an in-memory tree
// whose entries and attributes the kernel may not cache, so that every
// stat(2) is a LOOKUP and a GETATTR answered from memory, over /dev/fuse
// and over io_uring. Run with -cpu 1,2 to see the effect of the caller's
// and the daemon's threads sharing CPUs, and with ALLOCFS_BENCH_METRICS=1
// to time every request into allocfs serve's histograms: the requests
// are as cheap as they come, so this is the most the metrics can cost.
func BenchmarkRoundTrip(b *testing.B) {
	for _, side := range []struct {
		name string
		ring bool
	}{{"dev-fuse", false}, {"io-uring", true}} {
		b.Run(side.name, func(b *testing.B) {
			p := benchMount(b, side.ring, benchObserver())
			b.Run("serial", func(b *testing.B) {
				var st unix.Stat_t
				for range b.N {
					if err := unix.Stat(p, &st); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "stats/s")
			})
			b.Run("parallel", func(b *testing.B) {
				b.RunParallel(func(pb *testing.PB) {
					var st unix.Stat_t
					for pb.Next() {
						if err := unix.Stat(p, &st); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "stats/s")
			})
		})
	}
}

// BenchmarkObserverCost measures what allocfs serve's FUSE metrics add to
// a round trip, on a machine whose load changes under the measure: two
// mounts of in-memory trees over /dev/fuse, one observed and one not, are
// stat'ed in turns of 1,000 (a LOOKUP and a GETATTR each), so that what
// else the machine does falls on both alike. One op is one turn of each;
// it reports the ns per stat of each side and their difference. The
// control sub-benchmark observes neither mount: its difference is the
// noise the metrics' one is to be read against.
func BenchmarkObserverCost(b *testing.B) {
	for _, c := range []struct {
		name string
		obs  func() transport.Observer
	}{
		{"metrics", func() transport.Observer { return metrics.New(nil).FUSE() }},
		{"control", func() transport.Observer { return nil }},
	} {
		b.Run(c.name, func(b *testing.B) {
			const batch = 1000
			plain := benchMount(b, false, nil)
			observed := benchMount(b, false, c.obs())
			var took [2]time.Duration
			var st unix.Stat_t
			for i := range b.N {
				for k := range 2 {
					// Each side goes first in every other turn.
					side := (i + k) % 2
					p := []string{plain, observed}[side]
					start := time.Now()
					for range batch {
						if err := unix.Stat(p, &st); err != nil {
							b.Fatal(err)
						}
					}
					took[side] += time.Since(start)
				}
			}
			stats := float64(b.N * batch)
			off, on := float64(took[0].Nanoseconds())/stats, float64(took[1].Nanoseconds())/stats
			b.ReportMetric(off, "off-ns/stat")
			b.ReportMetric(on, "on-ns/stat")
			b.ReportMetric(on-off, "delta-ns/stat")
		})
	}
}

// benchMount mounts an in-memory tree whose entries and attributes the
// kernel may not cache, with one file, told to obs if not nil, and
// returns the file's path; the benchmark's cleanup unmounts it.
func benchMount(b *testing.B, ring bool, obs transport.Observer) string {
	b.Helper()
	fstest.RequireFUSE(b)
	if ring {
		requireFUSEOverIOUring(b)
	}
	mnt := b.TempDir()
	conn, err := transport.Mount(mnt, transport.Options{
		FsName:       "transport-bench",
		Capabilities: fuse.CAP_ASYNC_READ | fuse.CAP_PARALLEL_DIROPS,
		IOUring:      ring,
		Observer:     obs,
	})
	if err != nil {
		b.Fatal(err)
	}
	var zero time.Duration
	root := &memDir{}
	if err := conn.Serve(gofs.NewNodeFS(root, &gofs.Options{EntryTimeout: &zero, AttrTimeout: &zero, ServerCallbacks: conn})); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := conn.Unmount(); err != nil {
			b.Errorf("unmount: %v", err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		conn.Wait()
	})
	if conn.IOUring() != ring {
		b.Fatalf("over io_uring: %v, want %v", conn.IOUring(), ring)
	}
	ctx := context.Background()
	root.AddChild("f", root.NewPersistentInode(ctx, &gofs.MemRegularFile{}, gofs.StableAttr{Mode: syscall.S_IFREG}), true)
	return filepath.Join(mnt, "f")
}

// benchObserver is allocfs serve's FUSE metrics when
// ALLOCFS_BENCH_METRICS=1, and no observer otherwise.
func benchObserver() transport.Observer {
	if os.Getenv("ALLOCFS_BENCH_METRICS") != "1" {
		return nil
	}
	return metrics.New(nil).FUSE()
}
