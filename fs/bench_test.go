package fs

// Mount-versus-native benchmarks, with peers (benchpeers_test.go). Every
// benchmark has sub-benchmarks running the same workload: "native" in a
// plain directory on the filesystem that holds the store's data dir,
// "mount" in <mnt>/<alloc>/alloc/data, a passthrough loopback volume of the
// same store, and the peers of benchpeers_test.go beside them: "loopback"
// (go-fuse's loopback), "overlay" (kernel overlayfs), "fuse-overlayfs",
// "passthrough_ll" (libfuse's example) and, for the metadata benchmarks,
// "floor" (a raw FUSE server that only answers) and "floor-bridge" (the
// same through go-fuse's node bridge). One op is one whole workload, so
// run them with -benchtime=1x and compare the lines of each benchmark
// (`make bench` does, and prints the ratios against native and the
// mount's against each side). Cold variants drop the page, dentry and inode caches first,
// which needs root; so does mounting with passthrough.
//
// ALLOCFS_BENCH_DIR chooses the directory the store, the native directory
// and the peers are created in (the default is the test's temp dir),
// ALLOCFS_BENCH_ORDER=rotate-N runs the sides rotated by N places
// (mount-first is rotate-1), so that rounds can take turns at which side
// goes first, ALLOCFS_BENCH_METRICS=1 mounts with the metrics of allocfs
// serve (every request timed into its opcode's histogram, every copy-up
// counted), to measure what they cost, ALLOCFS_BENCH_IOURING=1 serves the
// mount and the floors over io_uring (benchIOUring), and
// ALLOCFS_BENCH_DAEMON_TIME=1 reports the time the mount's handlers took
// (daemon-ms/op, and by opcode in the log).

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/allocfs/allocfs/metrics"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

const (
	benchSeqSize    = 1 << 30 // sequential write and read
	benchSeqBlock   = 1 << 20 // their write(2)/read(2) size
	benchWarmPasses = 4       // re-opened reads of the file per warm op

	benchRandSize  = 256 << 20 // file the random reads hit
	benchRandBlock = 4 << 10
	benchRandReads = 1 << 18 // preads per op (4 times the file's blocks)

	benchAppends     = 100_000
	benchAppendSize  = 100
	benchFollowPoll  = time.Millisecond // follower's sleep at EOF
	benchFollowLimit = time.Minute      // give up waiting for the follower

	benchFiles    = 10_000 // files created, stat'ed, listed
	benchFileSize = 4 << 10
)

// benchEnv is one store mounted for one benchmark, next to a plain
// directory on the same filesystem and the peers.
type benchEnv struct {
	log    hclog.Logger
	mount  *Mount
	native string // plain directory beside the data dir, as deep as vol
	vol    string // <mnt>/<alloc>/alloc/data
	layer  string // the backing directory of vol
	peers  []benchSideSpec
	// daemon, with ALLOCFS_BENCH_DAEMON_TIME=1, times the mount's
	// handlers by opcode; nil otherwise.
	daemon *daemonTime
}

// daemonTime sums the time the mount's handlers took, from a request's
// read to its reply, by opcode: what of a workload's time the daemon
// spent, the rest being the kernel's and the transport's.
type daemonTime struct {
	next transport.Observer
	mu   sync.Mutex
	took map[uint32]time.Duration
	n    map[uint32]int
}

func (d *daemonTime) Request(op uint32, took time.Duration, errno syscall.Errno) {
	d.mu.Lock()
	if d.took == nil {
		d.took, d.n = map[uint32]time.Duration{}, map[uint32]int{}
	}
	d.took[op] += took
	d.n[op]++
	d.mu.Unlock()
	if d.next != nil {
		d.next.Request(op, took, errno)
	}
}

// take returns the time and count by opcode so far, and starts again.
func (d *daemonTime) take() (map[uint32]time.Duration, map[uint32]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	took, n := d.took, d.n
	d.took, d.n = nil, nil
	return took, n
}

// benchSide is where one sub-benchmark runs: dir is the fresh directory
// the workload uses; backing is the same directory on the backing
// filesystem, for untimed setup that need not go through the mount.
type benchSide struct {
	dir, backing string
	// quiet waits until the side's server has stopped answering
	// requests (quietSide).
	quiet func()
}

// quietSide waits until served, a count of the requests a side's server
// answered, has not moved for 30 ms, for at most 3 s; with no count it
// waits 30 ms. A cold run drops the kernel's caches right before it
// starts, and the kernel then sends a FORGET for every node it dropped:
// the mount and the floor would serve those while the timed workload runs
// (10,000 of them after a listing of 10,000 files), which a daemon whose
// caches shrink under memory pressure does long before a task's next
// listing.
func quietSide(served func() uint64) {
	const still = 30 * time.Millisecond
	if served == nil {
		time.Sleep(still)
		return
	}
	last := served()
	for range 100 {
		time.Sleep(still)
		now := served()
		if now == last {
			return
		}
		last = now
	}
}

// totalOf is the sum of a side's request counts.
func totalOf(counts func() map[string]uint64) func() uint64 {
	if counts == nil {
		return nil
	}
	return func() uint64 {
		var n uint64
		for _, c := range counts() {
			n += c
		}
		return n
	}
}

var benchEnvOnce sync.Once

// newBenchEnv mounts a fresh store and the peers cfg asks for, for
// benchmark b, and unmounts them when b ends. It skips b where FUSE mounts
// are impossible; a peer that cannot be mounted skips only its side.
func newBenchEnv(b *testing.B, cfg benchConfig) *benchEnv {
	b.Helper()
	fstest.RequireFUSE(b)
	base := b.TempDir()
	if d := os.Getenv("ALLOCFS_BENCH_DIR"); d != "" {
		var err error
		if base, err = os.MkdirTemp(d, "allocfs-bench-"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(base) })
	}
	// Only the mount's own lines (passthrough on or off) and warnings.
	storeLog := hclog.New(&hclog.LoggerOptions{Name: b.Name(), Level: hclog.Warn, Output: os.Stderr})
	mountLog := hclog.New(&hclog.LoggerOptions{Name: b.Name(), Level: hclog.Info, Output: os.Stderr})
	s, err := store.Open(storeLog, filepath.Join(base, "data"))
	if err != nil {
		b.Fatal(err)
	}
	// The native directory is as deep as the volume in the mount, so
	// that path walks cost the same number of components on both sides.
	env := &benchEnv{log: mountLog, native: filepath.Join(base, "native", "bench", "alloc", "data")}
	mnt := filepath.Join(base, "mnt")
	if err := os.MkdirAll(env.native, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		b.Fatal(err)
	}
	mo := DefaultMountOptions()
	mo.IOUring = benchIOUring()
	if os.Getenv("ALLOCFS_BENCH_METRICS") == "1" {
		nm := metrics.New(mountLog)
		mo.Requests, mo.CopyUps = nm.FUSE(), nm.CopyUps()
	}
	if os.Getenv("ALLOCFS_BENCH_DAEMON_TIME") == "1" {
		env.daemon = &daemonTime{next: mo.Requests}
		mo.Requests = env.daemon
	}
	env.mount, err = NewMount(mountLog, s, mnt, mo)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := env.mount.Unmount(); err != nil {
			b.Errorf("unmount: %v", err)
		}
	})
	st, err := s.Create("bench", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	env.vol = filepath.Join(mnt, "bench", "alloc", "data")
	env.layer = s.LayerPath(st.Volumes["alloc/data"].Upper)
	env.peers = mountPeers(b, mountLog, base, cfg)
	benchEnvOnce.Do(func() {
		mountLog.Info("benchmark environment", "data_dir", s.DataDir(), "fs", fsTypeName(s.DataDir()),
			"gomaxprocs", runtime.GOMAXPROCS(0), "passthrough", env.mount.Passthrough(), "io_uring", env.mount.ioUring,
			"metrics", mo.Requests != nil)
	})
	return env
}

// benchIOUring says whether the mount and the floor take requests over
// io_uring: no, as allocfs serve does by default (its /dev/fuse transport
// survives a daemon's crash, the rings do not), unless
// ALLOCFS_BENCH_IOURING=1 asks for the rings (serve --fuse-io-uring), to
// compare the two.
func benchIOUring() bool {
	return os.Getenv("ALLOCFS_BENCH_IOURING") == "1"
}

// sides returns every side of the benchmark in the order
// ALLOCFS_BENCH_ORDER asks for; it fails b on a bad order.
func (e *benchEnv) sides(b *testing.B) []benchSideSpec {
	n, err := parseBenchOrder(os.Getenv("ALLOCFS_BENCH_ORDER"))
	if err != nil {
		b.Fatal(err)
	}
	all := append([]benchSideSpec{
		{name: sideNative, dir: e.native, backing: e.native},
		{name: sideMount, dir: e.vol, backing: e.layer, counts: e.mount.RequestCounts},
	}, e.peers...)
	return rotated(all, n)
}

// run runs fn as one sub-benchmark per side, each in a fresh directory
// that is removed (through its backing directory) afterwards.
func (e *benchEnv) run(b *testing.B, fn func(b *testing.B, s benchSide)) {
	for _, side := range e.sides(b) {
		b.Run(side.name, func(b *testing.B) {
			if side.skip != "" {
				b.Skip(side.skip)
			}
			b.StopTimer()
			backing, err := os.MkdirTemp(side.backing, "w")
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { os.RemoveAll(backing) })
			var before map[string]uint64
			if side.counts != nil {
				before = side.counts()
			}
			if side.name == sideMount && e.daemon != nil {
				e.daemon.take()
			}
			b.ResetTimer()
			b.StartTimer()
			served := totalOf(side.counts)
			if side.served != nil {
				served = side.served
			}
			fn(b, benchSide{dir: filepath.Join(side.dir, filepath.Base(backing)), backing: backing, quiet: func() { quietSide(served) }})
			b.StopTimer()
			if side.counts != nil {
				e.reportRequests(b, side.counts, before)
			}
			if side.name == sideMount && e.daemon != nil {
				e.reportDaemonTime(b)
			}
		})
	}
	if !e.mount.Passthrough() {
		e.log.Warn("the mount ran without passthrough: file data went through the daemon")
	}
}

// reportRequests reports the FUSE requests a side's server (counts)
// served since before, per benchmark op (setup included), and logs them
// by opcode: what a workload costs in round trips.
func (e *benchEnv) reportRequests(b *testing.B, counts func() map[string]uint64, before map[string]uint64) {
	var total uint64
	var byOp []any
	after := counts()
	names := make([]string, 0, len(after))
	for name := range after {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if n := after[name] - before[name]; n > 0 {
			total += n
			byOp = append(byOp, name, n)
		}
	}
	b.ReportMetric(float64(total)/float64(b.N), "fuse-req/op")
	e.log.Info("FUSE requests", append([]any{"benchmark", b.Name(), "total", total}, byOp...)...)
}

// reportDaemonTime reports the time the mount's handlers took per
// benchmark op (setup included), and logs it by opcode with the mean per
// request.
func (e *benchEnv) reportDaemonTime(b *testing.B) {
	took, n := e.daemon.take()
	var total time.Duration
	var byOp []any
	ops := make([]uint32, 0, len(took))
	for op := range took {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i] < ops[j] })
	for _, op := range ops {
		total += took[op]
		byOp = append(byOp, transport.OpName(op), fmt.Sprintf("%d x %.2fµs", n[op], float64(took[op].Nanoseconds())/1e3/float64(n[op])))
	}
	b.ReportMetric(total.Seconds()*1e3/float64(b.N), "daemon-ms/op")
	e.log.Info("daemon time", append([]any{"benchmark", b.Name(), "total", total}, byOp...)...)
}

// fsTypeName names the filesystem holding p, for the log.
func fsTypeName(p string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return err.Error()
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlayfs"
	}
	return fmt.Sprintf("fs magic %#x", st.Type)
}

// settle writes back dirty data, so that one side's writeback does not
// run during the other side's timed part. The timer must be stopped.
func settle() { unix.Sync() }

// dropCaches empties the page, dentry and inode caches; the timer must be
// stopped. It skips b where that is not allowed.
func dropCaches(b *testing.B) {
	b.Helper()
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0); err != nil {
		b.Skipf("a cold run needs to drop caches: %v", err)
	}
}

// holdCache keeps path's cached pages in memory until the returned
// function runs, and reports how often the machine's caches were dropped
// meanwhile. The warm benchmarks share the machine with others that write
// /proc/sys/vm/drop_caches: a drop in the middle of a mount-side pass
// makes it re-read the file through the daemon, and the pair's ratio then
// measures the drop, not the mount. drop_caches leaves mapped pages alone,
// so path is mapped with MAP_POPULATE; read(2) copies from the same page
// cache folios, mapped or not. The pages are faulted in inside mmap(2),
// never by touching them: this process is the FUSE server too, and a
// goroutine blocked in a page fault on its own mount stops the Go runtime
// from reaching a safe point (deadlock at the next GC).
func holdCache(b *testing.B, path string) func() {
	b.Helper()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		b.Fatal(err)
	}
	drops := cacheDrops()
	return func() {
		b.ReportMetric(float64(cacheDrops()-drops), "cache-drops")
		unix.Munmap(m)
	}
}

// cacheDrops is how often anyone has written drop_caches since boot, or
// -1 where /proc/vmstat does not say.
func cacheDrops() int64 {
	data, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "drop_pagecache "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// benchData is a block of incompressible bytes.
func benchData(n int) []byte {
	buf := make([]byte, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			buf[i+j] = byte(v >> (8 * j))
		}
	}
	return buf
}

// writeSeq writes size bytes to path in block-sized writes and fsyncs.
// It returns how long the writes took before the fsync.
func writeSeq(path string, size int64, block []byte) (time.Duration, error) {
	start := time.Now()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	for off := int64(0); off < size; off += int64(len(block)) {
		if _, err := f.Write(block); err != nil {
			f.Close()
			return 0, err
		}
	}
	written := time.Since(start)
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, err
	}
	return written, f.Close()
}

// primeMemory writes size bytes to a file in dir and deletes it before
// writeback. On this project's VMs, page-cache pages that have not been
// touched for a while cost a host fault each the first time (a 1 GiB
// write runs at 0.3-1.2 GB/s instead of 4-5 GB/s), while pages just
// freed do not; priming makes both sides of a pair start alike.
func primeMemory(dir string, size int64, block []byte) error {
	path := filepath.Join(dir, "prime")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	for off := int64(0); off < size; off += int64(len(block)) {
		if _, err := f.Write(block); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Remove(path)
}

// readSeq reads path to EOF in len(buf) reads and checks it had want bytes.
func readSeq(path string, buf []byte, want int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var got int64
	for {
		n, err := f.Read(buf)
		got += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if got != want {
		return fmt.Errorf("read %d bytes of %q, want %d", got, path, want)
	}
	return nil
}

// makeFiles creates n files of size bytes named f00000... in dir.
func makeFiles(dir string, n, size int) error {
	data := benchData(size)
	for i := 0; i < n; i++ {
		if err := os.WriteFile(filepath.Join(dir, benchName(i)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func benchName(i int) string { return fmt.Sprintf("f%05d", i) }

// reportRate reports count events per second of the timed part of the run.
func reportRate(b *testing.B, count int, unit string) {
	b.ReportMetric(float64(count)*float64(b.N)/b.Elapsed().Seconds(), unit)
}

// BenchmarkSeqWrite writes 1 GiB in 1 MiB writes to a new file and
// fsyncs it; the op includes open, the fsync and close. nofsync-MB/s is
// the rate of the writes alone, before the fsync. Before each op, an
// untimed 1 GiB file is written and deleted (primeMemory).
func BenchmarkSeqWrite(b *testing.B) {
	env := newBenchEnv(b, benchConfig{})
	block := benchData(benchSeqBlock)
	env.run(b, func(b *testing.B, s benchSide) {
		b.SetBytes(benchSeqSize)
		path := filepath.Join(s.dir, "seq")
		var written time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			os.Remove(path)
			if err := primeMemory(s.backing, benchSeqSize, block); err != nil {
				b.Fatal(err)
			}
			settle()
			b.StartTimer()
			w, err := writeSeq(path, benchSeqSize, block)
			if err != nil {
				b.Fatal(err)
			}
			written += w
		}
		b.StopTimer()
		b.ReportMetric(float64(benchSeqSize)*float64(b.N)/1e6/written.Seconds(), "nofsync-MB/s")
	})
}

// benchSeqRead sets up a 1 GiB file per side and times reading it in
// 1 MiB reads, from the page cache (warm) or after dropping the caches.
func benchSeqRead(b *testing.B, cold bool) {
	env := newBenchEnv(b, benchConfig{})
	block := benchData(benchSeqBlock)
	env.run(b, func(b *testing.B, s benchSide) {
		b.StopTimer()
		if _, err := writeSeq(filepath.Join(s.backing, "seq"), benchSeqSize, block); err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(s.dir, "seq")
		buf := make([]byte, benchSeqBlock)
		passes := benchWarmPasses
		if cold {
			passes = 1
		} else if err := readSeq(path, buf, benchSeqSize); err != nil {
			b.Fatal(err)
		} else {
			defer holdCache(b, path)()
		}
		b.SetBytes(int64(passes) * benchSeqSize)
		b.ResetTimer()
		b.StartTimer()
		for i := 0; i < b.N; i++ {
			if cold {
				b.StopTimer()
				dropCaches(b)
				b.StartTimer()
			}
			for p := 0; p < passes; p++ {
				if err := readSeq(path, buf, benchSeqSize); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkSeqReadWarm reads a cached 1 GiB file 4 times per op, opening
// it each time.
func BenchmarkSeqReadWarm(b *testing.B) { benchSeqRead(b, false) }

// BenchmarkSeqReadCold reads a 1 GiB file once per op after
// drop_caches.
func BenchmarkSeqReadCold(b *testing.B) { benchSeqRead(b, true) }

// BenchmarkRandRead4K does 4 KiB preads at random aligned offsets of a
// cached 256 MiB file, one at a time, from one open fd.
func BenchmarkRandRead4K(b *testing.B) {
	env := newBenchEnv(b, benchConfig{})
	env.run(b, func(b *testing.B, s benchSide) {
		b.StopTimer()
		if _, err := writeSeq(filepath.Join(s.backing, "rand"), benchRandSize, benchData(benchSeqBlock)); err != nil {
			b.Fatal(err)
		}
		preadCached(b, filepath.Join(s.dir, "rand"))
	})
}

// preadCached reads the benchRandSize file at path into the page cache,
// holds it there, and times preadRandom on it.
func preadCached(b *testing.B, path string) {
	if err := readSeq(path, make([]byte, benchSeqBlock), benchRandSize); err != nil {
		b.Fatal(err)
	}
	defer holdCache(b, path)()
	f, err := os.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.ResetTimer()
	b.StartTimer()
	preadRandom(b, int(f.Fd()))
	b.StopTimer()
	reportRate(b, benchRandReads, "reads/s")
}

// preadRandom does benchRandReads 4 KiB preads per op at random aligned
// offsets of the benchRandSize file open at fd.
func preadRandom(b *testing.B, fd int) {
	buf := make([]byte, benchRandBlock)
	r := rand.New(rand.NewPCG(3, 4))
	blocks := benchRandSize / benchRandBlock
	for i := 0; i < b.N; i++ {
		for j := 0; j < benchRandReads; j++ {
			off := int64(r.IntN(blocks)) * benchRandBlock
			if n, err := unix.Pread(fd, buf, off); err != nil || n != benchRandBlock {
				b.Fatalf("pread at %d: %d bytes, %v", off, n, err)
			}
		}
	}
}

// BenchmarkLowerSeqReadWarm is BenchmarkSeqReadWarm for a file that a
// snapshot migration left in a lower layer of the volume: such a file is
// read without passthrough (the kernel binds one backing file to an
// inode, and a copy-up must be able to replace it), through the kernel's
// page cache, which FOPEN_KEEP_CACHE keeps across opens.
func BenchmarkLowerSeqReadWarm(b *testing.B) {
	block := benchData(benchSeqBlock)
	buf := make([]byte, benchSeqBlock)
	benchLower(b, benchSeqSize, func(b *testing.B, path string) {
		if err := readSeq(path, buf, benchSeqSize); err != nil {
			b.Fatal(err)
		}
		defer holdCache(b, path)()
		b.SetBytes(benchWarmPasses * benchSeqSize)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for p := 0; p < benchWarmPasses; p++ {
				if err := readSeq(path, buf, benchSeqSize); err != nil {
					b.Fatal(err)
				}
			}
		}
	}, block)
}

// BenchmarkLowerRandRead4K is BenchmarkRandRead4K for a file in a lower
// layer (see BenchmarkLowerSeqReadWarm).
func BenchmarkLowerRandRead4K(b *testing.B) {
	benchLower(b, benchRandSize, preadCached, benchData(benchSeqBlock))
}

// benchLower writes a file of size on each side, the mount's into an
// allocation that is then stopped and snapshot-migrated, so that the
// new allocation shows it from a lower layer, the overlays' into their
// lower directories and the loopback's and passthrough_ll's into their
// backing directories, and runs read on each side's path as that side's
// sub-benchmark.
func benchLower(b *testing.B, size int64, read func(b *testing.B, path string), block []byte) {
	env := newBenchEnv(b, benchConfig{overlayLower: func(dir string) error {
		_, err := writeSeq(filepath.Join(dir, "lower"), size, block)
		return err
	}})
	st := env.mount.store
	web := []allocdir.Task{{Name: "web"}}
	prev, err := st.Create("lowersrc", web, store.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := writeSeq(filepath.Join(st.LayerPath(prev.Volumes["alloc/data"].Upper), "lower"), size, block); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Stop("lowersrc"); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Create("lower", web, store.CreateOptions{Previous: "lowersrc", Migration: store.MigrationSnapshot}); err != nil {
		b.Fatal(err)
	}
	mnt := filepath.Dir(filepath.Dir(filepath.Dir(env.vol)))
	sides := env.sides(b)
	paths := make([]string, len(sides))
	for i, side := range sides {
		paths[i] = filepath.Join(side.dir, "lower")
		switch side.name {
		case sideMount:
			paths[i] = filepath.Join(mnt, "lower", "alloc", "data", "lower")
		case sideNative, sideLoopback, sidePassthroughLL:
			if _, err := writeSeq(filepath.Join(side.backing, "lower"), size, block); err != nil {
				b.Fatal(err)
			}
		}
	}
	for i, side := range sides {
		path := paths[i]
		b.Run(side.name, func(b *testing.B) {
			if side.skip != "" {
				b.Skip(side.skip)
			}
			b.StopTimer()
			settle()
			b.StartTimer()
			read(b, path)
		})
	}
}

// BenchmarkAppendFollow appends 100,000 lines of 100 bytes with one
// write(2) each to an O_APPEND file, while a follower reads the file to
// EOF in a loop (sleeping 1 ms at EOF, like a quick tail -f). The op is
// the writes; it reports writes/s and how long after the last write
// returned the follower had read every byte (catchup-ms).
func BenchmarkAppendFollow(b *testing.B) {
	env := newBenchEnv(b, benchConfig{})
	line := benchData(benchAppendSize)
	line[len(line)-1] = '\n'
	env.run(b, func(b *testing.B, s benchSide) {
		var catchup time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			settle()
			c, err := appendFollow(b, filepath.Join(s.dir, fmt.Sprintf("log.%d", i)), line)
			if err != nil {
				b.Fatal(err)
			}
			catchup += c
		}
		reportRate(b, benchAppends, "writes/s")
		b.ReportMetric(catchup.Seconds()*1000/float64(b.N), "catchup-ms")
	})
}

// appendFollow runs one append workload on path with the timer stopped
// on entry; it times only the writes and returns the follower's lag.
func appendFollow(b *testing.B, path string, line []byte) (time.Duration, error) {
	w, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	r, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	const total = benchAppends * benchAppendSize
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		buf := make([]byte, 64<<10)
		var got int64
		for {
			n, err := r.Read(buf)
			got += int64(n)
			if got >= total {
				done <- result{at: time.Now()}
				return
			}
			if err != nil && err != io.EOF {
				done <- result{err: err}
				return
			}
			if n == 0 {
				select {
				case <-stop:
					return
				case <-time.After(benchFollowPoll):
				}
			}
		}
	}()
	b.StartTimer()
	for i := 0; i < benchAppends; i++ {
		if _, err := w.Write(line); err != nil {
			b.StopTimer()
			return 0, err
		}
	}
	b.StopTimer()
	last := time.Now()
	select {
	case res := <-done:
		if res.err != nil {
			return 0, res.err
		}
		return max(0, res.at.Sub(last)), nil
	case <-time.After(benchFollowLimit):
		return 0, errors.New("the follower did not catch up within a minute")
	}
}

// benchCreate creates 10,000 files in a new directory, each with
// open(O_CREAT|O_EXCL), one 4 KiB write and close. Cold runs after
// drop_caches, so ext4 re-reads its bitmaps and inode tables from disk;
// warm runs after creating 10,000 other files in the same directory
// (untimed, on the backing filesystem), so that they are cached whichever
// side goes first.
func benchCreate(b *testing.B, cold bool) {
	env := newBenchEnv(b, benchConfig{floor: true})
	data := benchData(benchFileSize)
	env.run(b, func(b *testing.B, s benchSide) {
		var took time.Duration
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			name := fmt.Sprintf("c%d", i)
			backing := filepath.Join(s.backing, name)
			if err := os.Mkdir(backing, 0o755); err != nil {
				b.Fatal(err)
			}
			if !cold {
				if err := primeCreate(backing, data); err != nil {
					b.Fatal(err)
				}
			}
			took += benchClient(b, "create", filepath.Join(s.dir, name), func() {
				if cold {
					dropCaches(b)
					s.quiet()
				} else {
					settle()
				}
			})
		}
		reportRateOf(b, benchFiles, "files/s", took)
	})
}

// primeCreate creates benchFiles other files in dir. It does not remove
// them: on this machine's ext4 (mounted with discard) a mass unlink makes
// the next journal commits slow, which would land in the timed part.
func primeCreate(dir string, data []byte) error {
	for j := 0; j < benchFiles; j++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("p%05d", j)), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkCreate10K creates 10,000 4 KiB files with ext4's metadata
// cached.
func BenchmarkCreate10K(b *testing.B) { benchCreate(b, false) }

// BenchmarkCreate10KCold creates 10,000 4 KiB files after drop_caches.
func BenchmarkCreate10KCold(b *testing.B) { benchCreate(b, true) }

// benchMetadata sets up a directory of 10,000 4 KiB files per side and
// times op on it: cold after drop_caches, warm after one untimed op.
func benchMetadata(b *testing.B, cold bool, unit, op string) {
	env := newBenchEnv(b, benchConfig{floor: true})
	env.run(b, func(b *testing.B, s benchSide) {
		b.StopTimer()
		if err := makeFiles(s.backing, benchFiles, benchFileSize); err != nil {
			b.Fatal(err)
		}
		var took time.Duration
		for i := 0; i < b.N; i++ {
			if !cold {
				settle()
				if err := benchClientOps[op](s.dir); err != nil {
					b.Fatal(err)
				}
			}
			took += benchClient(b, op, s.dir, func() {
				if cold {
					dropCaches(b)
					s.quiet()
				}
			})
		}
		reportRateOf(b, benchFiles, unit, took)
	})
}

// statAll lstats every file of dir by its full path.
func statAll(dir string) error {
	for i := 0; i < benchFiles; i++ {
		if _, err := os.Lstat(filepath.Join(dir, benchName(i))); err != nil {
			return err
		}
	}
	return nil
}

// listEntries reads dir's names with getdents into a 32 KiB buffer, the
// size glibc's readdir uses; with lstat it also lstats each entry,
// relative to the directory's fd, as soon as its batch is read, which is
// what ls -l does (readdir, then lstat of that entry, then the next
// readdir). The interleaving matters on FUSE: the kernel asks for
// attributes with the next batch only once a lookup of an entry shows the
// lister wants them (READDIRPLUS_AUTO). dir must have want entries besides
// "." and "..".
func listEntries(dir string, lstat bool, want int) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	var st unix.Stat_t
	count := 0
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return &os.PathError{Op: "getdents", Path: dir, Err: err}
		}
		if n == 0 {
			break
		}
		for off := 0; off < n; {
			// struct linux_dirent64: ino u64, off s64, reclen u16,
			// type u8, then the NUL-terminated name.
			reclen := int(binary.NativeEndian.Uint16(buf[off+16:]))
			name := buf[off+19 : off+reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			off += reclen
			if string(name) == "." || string(name) == ".." {
				continue
			}
			count++
			if !lstat {
				continue
			}
			if err := unix.Fstatat(fd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &os.PathError{Op: "fstatat", Path: filepath.Join(dir, string(name)), Err: err}
			}
		}
	}
	if count != want {
		return fmt.Errorf("%q has %d entries, want %d", dir, count, want)
	}
	return nil
}

// BenchmarkStatCold lstats 10,000 files after drop_caches.
func BenchmarkStatCold(b *testing.B) { benchMetadata(b, true, "stats/s", "stat") }

// BenchmarkStatWarm lstats 10,000 files right after doing it once.
func BenchmarkStatWarm(b *testing.B) { benchMetadata(b, false, "stats/s", "stat") }

// BenchmarkReaddirCold lists the names of a 10,000-entry directory after
// drop_caches.
func BenchmarkReaddirCold(b *testing.B) {
	benchMetadata(b, true, "entries/s", "readdir")
}

// BenchmarkReaddirWarm lists the names of a 10,000-entry directory right
// after listing it once.
func BenchmarkReaddirWarm(b *testing.B) {
	benchMetadata(b, false, "entries/s", "readdir")
}

// BenchmarkReaddirLstatCold lists a 10,000-entry directory and lstats
// every entry, after drop_caches.
func BenchmarkReaddirLstatCold(b *testing.B) {
	benchMetadata(b, true, "entries/s", "readdir-lstat")
}

// BenchmarkReaddirLstatWarm lists a 10,000-entry directory and lstats
// every entry, right after doing it once.
func BenchmarkReaddirLstatWarm(b *testing.B) {
	benchMetadata(b, false, "entries/s", "readdir-lstat")
}

// The metadata benchmarks' client runs in a process of its own, as a
// task's would: a client inside the daemon's process shares its Go
// runtime (GOMAXPROCS threads, the scheduler, the collector) with the
// server, and each of its blocked system calls holds a processor the
// server's readers wait for. benchClient re-executes the test binary
// with benchClientEnv naming the workload and its directory; the child
// (runBenchClient, from TestMain) gets ready, waits for the parent's
// go-ahead on stdin (so that a cold run drops the caches after the
// child's own pages are in), runs the workload once and prints the
// nanoseconds it took.
const benchClientEnv = "ALLOCFS_BENCH_CLIENT"

// benchClientOps are the workloads a client process can run, by name.
var benchClientOps = map[string]func(dir string) error{
	"create":        createFiles,
	"stat":          statAll,
	"readdir":       func(dir string) error { return listEntries(dir, false, benchFiles) },
	"readdir-lstat": func(dir string) error { return listEntries(dir, true, benchFiles) },
}

// runBenchClient runs the workload benchClientEnv names, in a client
// process, and exits; it returns at once in any other process.
func runBenchClient() {
	spec := os.Getenv(benchClientEnv)
	if spec == "" {
		return
	}
	name, dir, _ := strings.Cut(spec, ":")
	op, ok := benchClientOps[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown benchmark client workload %q\n", name)
		os.Exit(2)
	}
	fmt.Println("ready")
	if _, err := fmt.Scanln(); err != nil {
		fmt.Fprintf(os.Stderr, "waiting for the go-ahead: %v\n", err)
		os.Exit(2)
	}
	start := time.Now()
	if err := op(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(time.Since(start).Nanoseconds())
	os.Exit(0)
}

// benchClient runs the workload op on dir in a client process and
// returns the time it took there. prepare runs once the client is ready
// and before it starts (the timer stopped); the timer runs while the
// client works.
func benchClient(b *testing.B, op, dir string, prepare func()) time.Duration {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchClientEnv+"="+op+":"+dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	out := bufio.NewScanner(stdout)
	if !out.Scan() || out.Text() != "ready" {
		b.Fatalf("the benchmark client did not get ready: %q %v", out.Text(), out.Err())
	}
	if prepare != nil {
		prepare()
	}
	b.StartTimer()
	if _, err := io.WriteString(stdin, "\n"); err != nil {
		b.Fatal(err)
	}
	ok := out.Scan()
	b.StopTimer()
	if err := cmd.Wait(); err != nil || !ok {
		b.Fatalf("the benchmark client's %s on %s failed: %v", op, dir, err)
	}
	ns, err := strconv.ParseInt(out.Text(), 10, 64)
	if err != nil {
		b.Fatalf("the benchmark client printed %q: %v", out.Text(), err)
	}
	return time.Duration(ns)
}

// createFiles creates benchFiles new files in dir, each with
// open(O_CREAT|O_EXCL), one benchFileSize write and close.
func createFiles(dir string) error {
	data := benchData(benchFileSize)
	for j := 0; j < benchFiles; j++ {
		f, err := os.OpenFile(filepath.Join(dir, benchName(j)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return err
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	return nil
}

// reportRateOf reports count things done per op at the rate the clients
// measured, took being their time over all of b's ops.
func reportRateOf(b *testing.B, count int, unit string, took time.Duration) {
	b.ReportMetric(float64(count)*float64(b.N)/took.Seconds(), unit)
}
