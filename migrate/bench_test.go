package migrate

// Remote migration benchmarks: Fetch of a snapshot served by
// SnapshotHandler over loopback TCP, against `tar -c | tar -x` of the
// same tree through a pipe, on the same machine and filesystem. The
// source is an on-disk allocation (disk.AllocDir) with one task, "web",
// whose alloc/data holds either one 1 GiB file or 10,000 4 KiB files.
//
// One op is one whole transfer into a fresh destination:
//   - Fetch: the request (a new TCP connection, as the product's default
//     client makes), the server's walk and tar writer, SHA-256 on both
//     sides, and the extraction into a new directory of the staging dir,
//     with owners restored as the product does when root (Chown);
//   - TarPipe: sh -c 'tar -C SRC -cf - alloc/data web/local | tar -C DST
//     -xf -', fork and exec included; GNU tar restores owners as root too.
//
// Neither side fsyncs, and the timed part ends when the transfer returns:
// the data is in the page cache, not necessarily on disk. Right after
// each op, sync(2) runs outside the timer; its duration is added to the
// op's for the sync-MB/s metric (throughput to disk). The source was
// written and synced before the first op and stays in the page cache, so
// both sides read warm; one untimed op runs before the timed ones. Between
// ops (untimed) the destination is checked and removed, and sync(2) runs
// again.
//
// MB/s counts file content only (1 GiB, or 10,000 × 4 KiB), the same
// figure for both sides. Run with a fixed count, e.g. -benchtime 3x.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/disk"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

const (
	benchAllocID = "3b8e1f6a-2c4d-4e9f-8a7b-1c2d3e4f5a6b"
	benchToken   = "bench-shared-token"

	benchFiles    = 10_000
	benchFileSize = 4 << 10
	benchBigSize  = 1 << 30
	benchChunk    = 1 << 20
)

// benchDataSet is one kind of alloc/data content.
type benchDataSet struct {
	name string
	// write fills dir and returns the path of one file (relative to
	// alloc/data) and its size, checked in every destination.
	write func(dir string) (probe string, size int64, err error)
	bytes int64
}

var benchDataSets = []benchDataSet{
	{"1GiB", benchWriteBig, benchBigSize},
	{"10kFiles", benchWriteFiles, benchFiles * benchFileSize},
}

// BenchmarkFetch fetches the snapshot of the source allocation from an
// httptest server running SnapshotHandler.
func BenchmarkFetch(b *testing.B) {
	for _, ds := range benchDataSets {
		b.Run(ds.name, func(b *testing.B) { benchFetch(b, ds) })
	}
}

// BenchmarkTarPipe copies the same tree with tar -c | tar -x.
func BenchmarkTarPipe(b *testing.B) {
	for _, ds := range benchDataSets {
		b.Run(ds.name, func(b *testing.B) { benchTarPipe(b, ds) })
	}
}

// benchSrc is a built source allocation and where the benchmark may put
// its destinations (on the same filesystem).
type benchSrc struct {
	disk  *disk.AllocDir
	work  string
	probe string
	size  int64
}

// newBenchSrc builds the source allocation under a fresh temporary
// directory, fills its alloc/data and syncs. It is removed (its task's
// memory-only mounts released) when b ends.
func newBenchSrc(b *testing.B, ds benchDataSet) *benchSrc {
	b.Helper()
	base := b.TempDir()
	logger := hclog.NewNullLogger()
	d, err := disk.New(logger, filepath.Join(base, "allocs"), benchAllocID)
	if err != nil {
		b.Fatal(err)
	}
	if err := d.Build(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := d.Destroy(); err != nil {
			b.Errorf("destroying the source: %v", err)
		}
	})
	if err := d.NewTaskDir(allocdir.Task{Name: "web"}).Build(); err != nil {
		b.Fatal(err)
	}
	probe, size, err := ds.write(filepath.Join(d.AllocDirPath(), "alloc", "data"))
	if err != nil {
		b.Fatal(err)
	}
	work := filepath.Join(base, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		b.Fatal(err)
	}
	unix.Sync()
	return &benchSrc{disk: d, work: work, probe: probe, size: size}
}

// check verifies that root (a received allocation directory) holds the
// probe file with its size.
func (s *benchSrc) check(root string) error {
	fi, err := os.Lstat(filepath.Join(root, "alloc", "data", s.probe))
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != s.size {
		return fmt.Errorf("received %s: %v, %d bytes; want a regular file of %d bytes", s.probe, fi.Mode(), fi.Size(), s.size)
	}
	return nil
}

// benchTimes accumulates the transfer and the sync after it.
type benchTimes struct {
	ops        int
	xfer, sync time.Duration
}

// syncAfter runs sync(2) (the timer must be stopped) and records it.
func (t *benchTimes) syncAfter(xfer time.Duration) {
	start := time.Now()
	unix.Sync()
	t.sync += time.Since(start)
	t.xfer += xfer
	t.ops++
}

func (t *benchTimes) report(b *testing.B, n int64) {
	if t.ops == 0 {
		return
	}
	total := float64(n) * float64(t.ops)
	b.ReportMetric(total/1e6/(t.xfer+t.sync).Seconds(), "sync-MB/s")
	b.ReportMetric(float64(t.sync.Milliseconds())/float64(t.ops), "sync-ms")
}

func benchFetch(b *testing.B, ds benchDataSet) {
	src := newBenchSrc(b, ds)
	lookup := func(id string) (allocdir.FS, error) {
		if id != benchAllocID {
			return nil, fmt.Errorf("alloc %s: %w", id, allocdir.ErrUnknownAlloc)
		}
		return src.disk, nil
	}
	srv := httptest.NewServer(SnapshotHandler(hclog.NewNullLogger(), lookup, SharedToken(benchToken)))
	b.Cleanup(srv.Close)
	staging := filepath.Join(src.work, "staging")
	if err := os.Mkdir(staging, 0o755); err != nil {
		b.Fatal(err)
	}
	opts := FetchOptions{
		URL:        srv.URL,
		AllocID:    benchAllocID,
		Token:      benchToken,
		StagingDir: staging,
		Retries:    1,
		Limits:     snapshot.ExtractOptions{Chown: os.Geteuid() == 0},
	}
	benchTransfer(b, src, ds, func(int) (string, error) {
		res, err := Fetch(context.Background(), opts)
		if err != nil {
			return "", err
		}
		if !res.Verified {
			return res.Dir, errors.New("the snapshot's SHA-256 trailer was not verified")
		}
		return res.Dir, nil
	})
}

func benchTarPipe(b *testing.B, ds benchDataSet) {
	src := newBenchSrc(b, ds)
	const script = `tar -C "$1" -cf - alloc/data web/local | tar -C "$2" -xf -`
	benchTransfer(b, src, ds, func(i int) (string, error) {
		dst := filepath.Join(src.work, fmt.Sprintf("dst%d", i))
		if err := os.Mkdir(dst, 0o755); err != nil {
			return "", err
		}
		var stderr bytes.Buffer
		cmd := exec.Command("sh", "-c", script, "sh", src.disk.AllocDirPath(), dst)
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return dst, fmt.Errorf("tar pipe: %w: %s", err, stderr.Bytes())
		}
		return dst, nil
	})
}

// benchTransfer times op, which copies the source into a new directory
// and returns it. One untimed op runs first, so that both sides start
// with their code, the tar binaries and recycled page-cache memory warm
// (on this VM, memory not touched for a while costs a host fault on first
// touch). After every op, untimed: sync (measured), check, remove the
// destination, sync again.
func benchTransfer(b *testing.B, src *benchSrc, ds benchDataSet, op func(i int) (string, error)) {
	after := func(dir string, err error) {
		if err == nil {
			err = src.check(dir)
		}
		if dir != "" {
			if rerr := allocdir.RemoveAll(dir); rerr != nil && err == nil {
				err = rerr
			}
		}
		if err != nil {
			b.Fatal(err)
		}
		unix.Sync()
	}
	unix.Sync()
	after(op(-1))

	var times benchTimes
	b.SetBytes(ds.bytes)
	for b.Loop() {
		start := time.Now()
		dir, err := op(times.ops)
		xfer := time.Since(start)
		b.StopTimer()
		if err == nil {
			times.syncAfter(xfer)
		}
		after(dir, err)
		b.StartTimer()
	}
	times.report(b, ds.bytes)
}

// benchWriteBig writes one 1 GiB file of real bytes, in 1 MiB writes.
func benchWriteBig(dir string) (string, int64, error) {
	const name = "big.bin"
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return "", 0, err
	}
	chunk := benchBytes(benchChunk)
	for written := 0; written < benchBigSize; written += len(chunk) {
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return "", 0, err
		}
	}
	return name, benchBigSize, f.Close()
}

// benchWriteFiles writes 10,000 4 KiB files into dir.
func benchWriteFiles(dir string) (string, int64, error) {
	data := benchBytes(benchFileSize)
	name := ""
	for i := 0; i < benchFiles; i++ {
		name = fmt.Sprintf("f%05d", i)
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", 0, err
		}
	}
	return name, benchFileSize, nil
}

// benchBytes returns n bytes that do not compress (xorshift output).
func benchBytes(n int) []byte {
	buf := make([]byte, n)
	x := uint64(0x2545f4914f6cdd1d)
	for i := range buf {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		buf[i] = byte(x)
	}
	return buf
}
