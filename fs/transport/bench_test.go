package transport_test

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// BenchmarkRoundTrip measures the transport alone: an in-memory tree
// whose entries and attributes the kernel may not cache, so that every
// stat(2) is a LOOKUP and a GETATTR answered from memory, over /dev/fuse
// and over io_uring. Run with -cpu 1,2 to see the effect of the caller's
// and the daemon's threads sharing CPUs.
func BenchmarkRoundTrip(b *testing.B) {
	for _, side := range []struct {
		name string
		ring bool
	}{{"dev-fuse", false}, {"io-uring", true}} {
		b.Run(side.name, func(b *testing.B) {
			fstest.RequireFUSE(b)
			if side.ring {
				requireFUSEOverIOUring(b)
			}
			mnt := b.TempDir()
			conn, err := transport.Mount(mnt, transport.Options{
				FsName:       "transport-bench",
				Capabilities: fuse.CAP_ASYNC_READ | fuse.CAP_PARALLEL_DIROPS,
				IOUring:      side.ring,
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
			if conn.IOUring() != side.ring {
				b.Fatalf("over io_uring: %v, want %v", conn.IOUring(), side.ring)
			}
			ctx := context.Background()
			root.AddChild("f", root.NewPersistentInode(ctx, &gofs.MemRegularFile{}, gofs.StableAttr{Mode: syscall.S_IFREG}), true)
			p := filepath.Join(mnt, "f")
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
