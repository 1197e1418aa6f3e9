package store

// Local migration benchmarks: Store.Remap (adopt) and Store.Seal
// (snapshot) of an allocation whose alloc/data holds either 10,000 4 KiB
// files or one 1 GiB file. No mount is involved: the data is written
// straight into the layer, and only the store's records change.
//
// One op is one Remap (or Seal) of the two volumes alloc/data and
// web/local, with everything it does to make the change durable: one
// intent naming both records is appended to the journal and fsynced (the
// op's only fsync), and the two state files are rewritten without one;
// Remap also creates the previous allocation's MIGRATED-TO marker layers
// and removes the new allocation's empty placeholders, Seal creates the
// new allocation's empty upper layers. The journal's checkpoint, which
// syncs the state files later, is not in the op: it runs at close, or
// once the journal passes a megabyte (about 500 migrations). Untimed before every op: stop the current allocation, create
// the next one, sync(2), the fsync probe below, sync(2) again, and the
// data dir's disk usage.
//
// The data is written once per benchmark, and the allocations form a
// chain: op i migrates from allocation i-1 to a freshly created
// allocation i, which is stopped before op i+1. So each op migrates the
// same data, and a Seal chain stacks one more read-only layer per op.
// Run with a fixed count, e.g. -benchtime 5x: with a time target, b.Loop
// would grow the chain to thousands of allocations.
//
// ALLOCFS_BENCH_DIR puts the store on another filesystem, as for the
// mount benchmarks; on tmpfs (/dev/shm) fsync costs nothing, which leaves
// the op's own cost.
//
// Reported besides ns/op:
//   - bytes-copied: the change, per op, of the space allocated (st_blocks)
//     to every file and directory under the data dir, read before and
//     after the op. A copy of the data would show here as at least its
//     size; what does show is the op's metadata: marker files and layer
//     directories created, placeholder layers removed, state files
//     rewritten. After each op the benchmark also checks that the data
//     file is the same inode, reached through the new allocation's
//     volume.
//   - fastest-us: the fastest single op (ns/op is the mean).
//   - probe-fsync-us: the mean time of write(4 KiB)+fsync+close of a new
//     file in the data dir, taken untimed (after a sync) just before each
//     op, as a yardstick for the one fsync inside the op (the journal).

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

const (
	migBenchFiles    = 10_000
	migBenchFileSize = 4 << 10
	migBenchBigSize  = 1 << 30
	migBenchChunk    = 1 << 20
)

// migBenchKeys are the volumes a migration of a one-task ("web")
// allocation hands over.
var migBenchKeys = []string{"alloc/data", "web/local"}

// BenchmarkRemap10kFiles adopts an alloc/data of 10,000 4 KiB files.
func BenchmarkRemap10kFiles(b *testing.B) { benchLocalMigration(b, migWriteFiles, false) }

// BenchmarkRemap1GiB adopts an alloc/data holding one 1 GiB file.
func BenchmarkRemap1GiB(b *testing.B) { benchLocalMigration(b, migWriteBig, false) }

// BenchmarkSeal10kFiles snapshots an alloc/data of 10,000 4 KiB files.
func BenchmarkSeal10kFiles(b *testing.B) { benchLocalMigration(b, migWriteFiles, true) }

// BenchmarkSeal1GiB snapshots an alloc/data holding one 1 GiB file.
func BenchmarkSeal1GiB(b *testing.B) { benchLocalMigration(b, migWriteBig, true) }

// benchLocalMigration writes the data with populate into the first
// allocation's alloc/data layer, then times one Remap (or Seal) per
// iteration along a chain of allocations. populate returns the path of a
// file, relative to the layer, whose inode must survive every op.
func benchLocalMigration(b *testing.B, populate func(dir string) (string, error), seal bool) {
	b.StopTimer()
	base := b.TempDir()
	if d := os.Getenv("ALLOCFS_BENCH_DIR"); d != "" {
		var err error
		if base, err = os.MkdirTemp(d, "allocfs-bench-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(base) })
	}
	store, err := Open(hclog.NewNullLogger(), filepath.Join(base, "data"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	tasks := []allocdir.Task{{Name: "web"}}
	cur := "prev"
	st, err := store.Create(cur, tasks, CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	probe, err := populate(store.LayerPath(st.Volumes["alloc/data"].Upper))
	if err != nil {
		b.Fatal(err)
	}
	want, err := migInode(filepath.Join(store.LayerPath(st.Volumes["alloc/data"].Upper), probe))
	if err != nil {
		b.Fatal(err)
	}

	var ops, copied int64
	var fsyncs, fastest time.Duration
	b.ReportAllocs()
	b.StartTimer()
	for b.Loop() {
		b.StopTimer()
		ops++
		next := fmt.Sprintf("next%d", ops)
		if _, err := store.Stop(cur); err != nil {
			b.Fatal(err)
		}
		if _, err := store.Create(next, tasks, CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		unix.Sync()
		d, err := migProbeFsync(store.DataDir())
		if err != nil {
			b.Fatal(err)
		}
		fsyncs += d
		unix.Sync()
		before, err := migDiskUsage(store.DataDir())
		if err != nil {
			b.Fatal(err)
		}

		b.StartTimer()
		start := time.Now()
		var n int
		if seal {
			n, err = store.Migrate(cur, next, migBenchKeys, MigrationSnapshot)
		} else {
			n, err = store.Migrate(cur, next, migBenchKeys, MigrationAdopt)
		}
		took := time.Since(start)
		b.StopTimer()
		if ops == 1 || took < fastest {
			fastest = took
		}

		if err != nil || n != len(migBenchKeys) {
			b.Fatalf("migrating %s to %s: %d volumes, %v", cur, next, n, err)
		}
		after, err := migDiskUsage(store.DataDir())
		if err != nil {
			b.Fatal(err)
		}
		copied += after - before
		if err := migCheckAdopted(store, next, probe, want); err != nil {
			b.Fatal(err)
		}
		cur = next
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(copied)/float64(ops), "bytes-copied")
	b.ReportMetric(float64(fastest.Nanoseconds())/1e3, "fastest-us")
	b.ReportMetric(float64(fsyncs.Nanoseconds())/1e3/float64(ops), "probe-fsync-us")
}

// migWriteFiles writes 10,000 4 KiB files of incompressible bytes into dir.
func migWriteFiles(dir string) (string, error) {
	data := migBenchBytes(migBenchFileSize)
	for i := 0; i < migBenchFiles; i++ {
		if err := os.WriteFile(filepath.Join(dir, migFileName(i)), data, 0o644); err != nil {
			return "", err
		}
	}
	return migFileName(migBenchFiles - 1), nil
}

// migWriteBig writes one 1 GiB file of real bytes, in 1 MiB writes.
func migWriteBig(dir string) (string, error) {
	const name = "big.bin"
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", err
	}
	chunk := migBenchBytes(migBenchChunk)
	for written := 0; written < migBenchBigSize; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return "", err
		}
	}
	return name, f.Close()
}

func migFileName(i int) string { return fmt.Sprintf("f%05d", i) }

// migBenchBytes returns n bytes that do not compress (xorshift output).
func migBenchBytes(n int) []byte {
	buf := make([]byte, n)
	x := uint64(0x9e3779b97f4a7c15)
	for i := range buf {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		buf[i] = byte(x)
	}
	return buf
}

// migInode identifies the file at p.
func migInode(p string) ([2]uint64, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return [2]uint64{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]uint64{st.Dev, st.Ino}, nil
}

// migCheckAdopted checks that allocation id's alloc/data reaches the very
// file that was written at first, in its bottom layer.
func migCheckAdopted(s *Store, id, probe string, want [2]uint64) error {
	st, err := s.Get(id)
	if err != nil {
		return err
	}
	v := st.Volumes["alloc/data"]
	if v == nil {
		return fmt.Errorf("%s has no alloc/data", id)
	}
	bottom := v.Upper
	if len(v.Lowers) > 0 {
		bottom = v.Lowers[len(v.Lowers)-1]
	}
	got, err := migInode(filepath.Join(s.LayerPath(bottom), probe))
	if err != nil {
		return fmt.Errorf("%s's alloc/data: %w", id, err)
	}
	if got != want {
		return fmt.Errorf("%s's alloc/data/%s is inode %v, want %v: the data was copied", id, probe, got, want)
	}
	return nil
}

// migDiskUsage sums the space allocated to everything under dir, as du
// does (a file with several links counts once).
func migDiskUsage(dir string) (int64, error) {
	var total int64
	seen := make(map[uint64]bool)
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}

// migProbeFsync times write(4 KiB)+fsync+close of a new file in dir, then
// removes it.
func migProbeFsync(dir string) (time.Duration, error) {
	p := filepath.Join(dir, "fsync-probe")
	data := make([]byte, 4<<10)
	start := time.Now()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	d := time.Since(start)
	if rerr := os.Remove(p); err == nil {
		err = rerr
	}
	return d, err
}
