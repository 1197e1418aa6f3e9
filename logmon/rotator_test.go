package logmon

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/hashicorp/go-hclog"
)

// testLogger writes to the test's log; see allocdirtest.Logger.
var testLogger = allocdirtest.Logger

// hclogOff is a logger for tests that make it warn by the hundred.
func hclogOff() hclog.Logger { return hclog.NewNullLogger() }

// openTestDir returns a fresh log directory, closed at the end of the
// test.
func openTestDir(t *testing.T) (*Dir, string) {
	t.Helper()
	path := t.TempDir()
	d, err := OpenDir(path, ".")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, path
}

// byteConfig is a Config that rotates at n bytes.
func byteConfig(maxFiles int, n int64) Config {
	return Config{MaxFiles: maxFiles, maxFileBytes: n}
}

// readFiles returns the indices of base's files in dir, ascending, and
// their contents.
func readFiles(t *testing.T, dir, base string) ([]int, map[int][]byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	contents := map[int][]byte{}
	var idx []int
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(rest)
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		idx = append(idx, i)
		contents[i] = b
	}
	sort.Ints(idx)
	return idx, contents
}

// numberedLines returns n lines "<number> <filler>\n" of random lengths,
// about one in twenty longer than lineLookahead.
func numberedLines(rng *rand.Rand, n int) [][]byte {
	lines := make([][]byte, n)
	for i := range lines {
		filler := rng.IntN(200)
		switch r := rng.IntN(100); {
		case r < 5:
			filler = lineLookahead + rng.IntN(3*lineLookahead)
		case r < 15:
			filler = lineLookahead/2 + rng.IntN(lineLookahead/2-20)
		}
		lines[i] = fmt.Appendf(nil, "%08d %s\n", i, bytes.Repeat([]byte{'a' + byte(i%26)}, filler))
	}
	return lines
}

// TestConfigValidate: max_files and max_file_size below one are refused,
// with ErrInvalidConfig.
func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", DefaultConfig(), true},
		{"one file of one MiB", Config{MaxFiles: 1, MaxFileSizeMB: 1}, true},
		{"no files", Config{MaxFiles: 0, MaxFileSizeMB: 10}, false},
		{"negative files", Config{MaxFiles: -1, MaxFileSizeMB: 10}, false},
		{"zero size", Config{MaxFiles: 10, MaxFileSizeMB: 0}, false},
		{"byte size", byteConfig(2, 100), true},
		{"negative byte size", byteConfig(2, -1), false},
	}
	for _, c := range cases {
		err := c.cfg.Validate()
		if c.ok && err != nil {
			t.Errorf("%s: got %v, want nil", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: got %v, want ErrInvalidConfig", c.name, err)
		}
	}
	if got := DefaultConfig().fileBytes(); got != 10<<20 {
		t.Errorf("default file size: got %d, want %d", got, 10<<20)
	}
}

// TestRotatorKeepsEveryByte: numbered lines, some longer than the 32 KiB
// lookahead, written in chunks of random sizes across many rotations,
// come out of the files concatenated in index order byte for byte; every
// file but the last is full and within the lookahead of the limit; and a
// file boundary falls inside a line only when that line is longer than
// the lookahead.
func TestRotatorKeepsEveryByte(t *testing.T) {
	d, dir := openTestDir(t)
	const limit = 64 << 10
	r, err := NewRotator(testLogger(t), d, "web.stdout", byteConfig(1000, limit))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var want []byte
	for _, l := range numberedLines(rng, 3000) {
		want = append(want, l...)
	}
	for p := want; len(p) > 0; {
		n := min(len(p), 1+rng.IntN(100<<10))
		if m, err := r.Write(p[:n]); err != nil || m != n {
			t.Fatalf("Write(%d bytes): got %d, %v", n, m, err)
		}
		p = p[n:]
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	idx, files := readFiles(t, dir, "web.stdout")
	if len(idx) < 50 {
		t.Fatalf("got %d files for %d bytes at %d bytes each, want at least 50", len(idx), len(want), limit)
	}
	var got []byte
	var bounds []int
	for k, i := range idx {
		if i != k {
			t.Fatalf("indices %v: want 0..%d without gaps", idx, len(idx)-1)
		}
		f := files[i]
		if k < len(idx)-1 && (len(f) < limit || len(f) > limit+lineLookahead) {
			t.Errorf("file %d: %d bytes, want between %d and %d", i, len(f), limit, limit+lineLookahead)
		}
		got = append(got, f...)
		bounds = append(bounds, len(got))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("the files hold %d bytes that differ from the %d written", len(got), len(want))
	}
	split := 0
	for _, b := range bounds[:len(bounds)-1] {
		if got[b-1] == '\n' {
			continue
		}
		start := bytes.LastIndexByte(got[:b], '\n') + 1
		end := b + bytes.IndexByte(got[b:], '\n') + 1
		if n := end - start; n <= lineLookahead {
			t.Errorf("a line of %d bytes (%.20q) is split at offset %d; only lines over %d bytes may be", n, got[start:], b, lineLookahead)
		}
		split++
	}
	t.Logf("%d files, %d of them end inside a long line", len(idx), split)
}

// TestRotatorRetention: after many rotations exactly max_files files
// remain, the newest, and together they hold the tail of the output,
// starting at a line.
func TestRotatorRetention(t *testing.T) {
	d, dir := openTestDir(t)
	r, err := NewRotator(testLogger(t), d, "web.stderr", byteConfig(3, 1000))
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for i := range 5000 {
		line := fmt.Appendf(nil, "line %06d\n", i)
		want = append(want, line...)
		if _, err := r.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	last := r.Index()
	idx, files := readFiles(t, dir, "web.stderr")
	if fmt.Sprint(idx) != fmt.Sprint([]int{last - 2, last - 1, last}) {
		t.Fatalf("kept indices %v, want the newest three ending at %d", idx, last)
	}
	var got []byte
	for _, i := range idx {
		got = append(got, files[i]...)
	}
	if !bytes.HasSuffix(want, got) || !strings.HasPrefix(string(got), "line ") {
		t.Errorf("the kept files do not hold the tail of the output from a line start: %.40q...", got)
	}
}

// TestRotatorRestart: a new Rotator appends to the highest index unless
// it is full, in which case it moves past it, and a lower index is never
// reused.
func TestRotatorRestart(t *testing.T) {
	d, dir := openTestDir(t)
	cfg := byteConfig(10, 100)
	write := func(s string) int {
		t.Helper()
		r, err := NewRotator(testLogger(t), d, "web.stdout", cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
		i := r.Index()
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		return i
	}
	if i := write("one\n"); i != 0 {
		t.Errorf("first run wrote index %d, want 0", i)
	}
	if i := write("two\n"); i != 0 {
		t.Errorf("second run wrote index %d, want 0 (append)", i)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "web.stdout.0")); string(b) != "one\ntwo\n" {
		t.Errorf("web.stdout.0 holds %q, want both runs", b)
	}
	// A higher index left by an earlier run wins, even with gaps below.
	if err := os.WriteFile(filepath.Join(dir, "web.stdout.7"), []byte("seven\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if i := write("three\n"); i != 7 {
		t.Errorf("third run wrote index %d, want 7", i)
	}
	// A full highest file is stepped over.
	if err := os.WriteFile(filepath.Join(dir, "web.stdout.8"), bytes.Repeat([]byte("x"), 100), 0o644); err != nil {
		t.Fatal(err)
	}
	if i := write("four\n"); i != 9 {
		t.Errorf("fourth run wrote index %d, want 9 (8 is full)", i)
	}
	fi, err := os.Stat(filepath.Join(dir, "web.stdout.9"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("web.stdout.9 has mode %v, want 0644", fi.Mode().Perm())
	}
}

// TestRotatorFlushesInTime: buffered output reaches the file within a
// few flush intervals, without Close.
func TestRotatorFlushesInTime(t *testing.T) {
	d, dir := openTestDir(t)
	r, err := NewRotator(testLogger(t), d, "web.stdout", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * flushInterval)
	for {
		b, _ := os.ReadFile(filepath.Join(dir, "web.stdout.0"))
		if string(b) == "hello\n" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v web.stdout.0 holds %q, want %q", 10*flushInterval, b, "hello\n")
		}
		time.Sleep(flushInterval / 4)
	}
}

// TestRotatorStepsOverPlantedFiles: a symbolic link, a FIFO or a second
// name of another file where a log file belongs is never written
// through; the rotator moves to the next index and the planted file's
// target is untouched.
func TestRotatorStepsOverPlantedFiles(t *testing.T) {
	outside := filepath.Join(t.TempDir(), "host-file")
	if err := os.WriteFile(outside, []byte("host data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plant := map[string]func(path string) error{
		"symlink":   func(p string) error { return os.Symlink(outside, p) },
		"dangling":  func(p string) error { return os.Symlink(outside+".missing", p) },
		"fifo":      func(p string) error { return syscall.Mkfifo(p, 0o666) },
		"hard link": func(p string) error { return os.Link(outside, p) },
		"directory": func(p string) error { return os.Mkdir(p, 0o777) },
	}
	for name, fn := range plant {
		t.Run(name, func(t *testing.T) {
			d, dir := openTestDir(t)
			if err := fn(filepath.Join(dir, "web.stdout.0")); err != nil {
				t.Fatal(err)
			}
			r, err := NewRotator(testLogger(t), d, "web.stdout", byteConfig(10, 100))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Write([]byte("task output\n")); err != nil {
				t.Fatal(err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
			if i := r.Index(); i != 1 {
				t.Errorf("wrote index %d, want 1", i)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "web.stdout.1")); string(b) != "task output\n" {
				t.Errorf("web.stdout.1 holds %q, want the output", b)
			}
			if b, err := os.ReadFile(outside); err != nil || string(b) != "host data\n" {
				t.Errorf("the host file holds %q (%v), want it untouched", b, err)
			}
			if _, err := os.Stat(outside + ".missing"); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the dangling link's target: got %v, want it still missing", err)
			}
		})
	}
}

// TestRotatorRefusesLinkedDir: the log directory itself is opened
// without following a link.
func TestRotatorRefusesLinkedDir(t *testing.T) {
	root := t.TempDir()
	if err := os.Symlink(t.TempDir(), filepath.Join(root, "logs")); err != nil {
		t.Fatal(err)
	}
	_, err := OpenDir(root, "logs")
	if !errors.Is(err, ErrUnsafePath) {
		t.Errorf("OpenDir through a link: got %v, want ErrUnsafePath", err)
	}
}

// TestRotatorIgnoresPlantedIndices: names a task planted cannot make the
// rotator delete the real logs (retention counts only regular files up to
// the current one) nor push its index past what it can hold.
func TestRotatorIgnoresPlantedIndices(t *testing.T) {
	d, dir := openTestDir(t)
	for i := 0; i < 3; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("web.stdout.%d", i)), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"web.stdout.100", "web.stdout.101", "web.stdout.102", "web.stdout.9223372036854775807"} {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r, err := NewRotator(hclogOff(), d, "web.stdout", byteConfig(3, 4))
	if err != nil {
		t.Fatal(err)
	}
	if r.Index() != 2 {
		t.Errorf("started at index %d, want 2 (the newest regular file)", r.Index())
	}
	if _, err := r.Write([]byte("more\nmore\n")); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var regular []string
	for _, e := range entries {
		if e.Type().IsRegular() {
			regular = append(regular, e.Name())
		}
		if strings.Contains(e.Name(), "-") {
			t.Errorf("%s: an index that wrapped around", e.Name())
		}
	}
	if len(regular) != 3 {
		t.Errorf("regular log files after a rotation: %v, want exactly max_files (3)", regular)
	}
	if _, err := os.Stat(filepath.Join(dir, "web.stdout.2")); err != nil {
		t.Errorf("web.stdout.2, the file written before the rotation, was pruned: %v", err)
	}
}
