package logmon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// runTask runs script with sh as a task whose output m collects, and
// stops m; it returns Stop's error.
func runTask(t *testing.T, m *Monitor, script string) error {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	cmd.Stdout, cmd.Stderr = m.Stdout(), m.Stderr()
	// Its own process group, so that the test can end whatever the
	// script leaves behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err := cmd.Start()
	m.CloseWriters()
	if err != nil {
		m.Stop(time.Second)
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	if err := cmd.Wait(); err != nil {
		t.Errorf("task: %v", err)
	}
	return m.Stop(2 * time.Second)
}

// concat is the content of base's files in index order.
func concat(t *testing.T, dir, base string) string {
	t.Helper()
	idx, files := readFiles(t, dir, base)
	var b strings.Builder
	for _, i := range idx {
		b.Write(files[i])
	}
	return b.String()
}

// TestMonitorCollectsOutput: a task's stdout and stderr, numbered lines
// across many rotations, reach their own files whole and in order, the
// FIFOs are 0600 while the task runs and gone afterwards.
func TestMonitorCollectsOutput(t *testing.T) {
	d, dir := openTestDir(t)
	m, err := Start(testLogger(t), d, "web", byteConfig(1000, 4096))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Streams {
		fi, err := os.Lstat(filepath.Join(dir, FIFOName("web", s)))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != os.ModeNamedPipe|0o600 {
			t.Errorf("%s FIFO: mode %v, want %v", s, fi.Mode(), os.ModeNamedPipe|0o600)
		}
	}
	const n = 20000
	if err := runTask(t, m, fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done`, n)); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	var wantOut, wantErr strings.Builder
	for i := range n {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	if got := concat(t, dir, "web.stdout"); got != wantOut.String() {
		t.Errorf("stdout files: got %d bytes, want %d, in order", len(got), wantOut.Len())
	}
	if got := concat(t, dir, "web.stderr"); got != wantErr.String() {
		t.Errorf("stderr files: got %d bytes, want %d, in order", len(got), wantErr.Len())
	}
	for _, s := range Streams {
		if _, err := os.Lstat(filepath.Join(dir, FIFOName("web", s))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s FIFO after Stop: %v, want it removed", s, err)
		}
	}
}

// TestMonitorRefusesSymlinkFIFO (HCSEC-2026-14): a task that replaced its
// FIFO with a link to a host file gets Start refused with ErrUnsafePath,
// and the host file is neither read, written, nor replaced.
func TestMonitorRefusesSymlinkFIFO(t *testing.T) {
	for _, s := range Streams {
		t.Run(s, func(t *testing.T) {
			d, dir := openTestDir(t)
			outside := filepath.Join(t.TempDir(), "shadow")
			if err := os.WriteFile(outside, []byte("root:secret\n"), 0o640); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Stat(outside)
			link := filepath.Join(dir, FIFOName("web", s))
			if err := os.Symlink(outside, link); err != nil {
				t.Fatal(err)
			}
			m, err := Start(testLogger(t), d, "web", DefaultConfig())
			if err == nil {
				m.CloseWriters()
				m.Stop(time.Second)
				t.Fatal("Start through a symlinked FIFO succeeded")
			}
			if !errors.Is(err, ErrUnsafePath) {
				t.Errorf("Start: got %v, want ErrUnsafePath", err)
			}
			t.Logf("Start: %v", err)
			after, err := os.Lstat(outside)
			if err != nil || !after.Mode().IsRegular() || after.Mode() != before.Mode() || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
				t.Errorf("host file after Start: %v, %v; want it untouched (%v)", after, err, before)
			}
			if b, _ := os.ReadFile(outside); string(b) != "root:secret\n" {
				t.Errorf("host file holds %q, want it untouched", b)
			}
			if target, err := os.Readlink(link); err != nil || target != outside {
				t.Errorf("the planted link: %q, %v; want it left as it was", target, err)
			}
			// Nothing was created for either stream.
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != filepath.Base(link) {
					t.Errorf("left behind in the log directory: %s", e.Name())
				}
			}
		})
	}
}

// TestMonitorRefusesForeignFIFO: a FIFO the task made itself, at the
// path logmon would use, is refused: the task could read its own
// secrets-bearing output back or inject lines into the logs.
func TestMonitorRefusesForeignFIFO(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a FIFO owned by another user")
	}
	d, dir := openTestDir(t)
	p := filepath.Join(dir, FIFOName("web", "stdout"))
	if err := syscall.Mkfifo(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_, err := Start(testLogger(t), d, "web", DefaultConfig())
	if !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("Start over a FIFO owned by uid 65534: got %v, want ErrUnsafePath", err)
	}
}

// TestMonitorReusesStaleFIFO: a FIFO of its own left by a crash is
// reused, and tightened to 0600.
func TestMonitorReusesStaleFIFO(t *testing.T) {
	d, dir := openTestDir(t)
	p := filepath.Join(dir, FIFOName("web", "stderr"))
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	m, err := Start(testLogger(t), d, "web", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("stale FIFO: %v, %v; want mode 0600", fi, err)
	}
	if err := runTask(t, m, "echo oops >&2"); err != nil {
		t.Fatal(err)
	}
	if got := concat(t, dir, "web.stderr"); got != "oops\n" {
		t.Errorf("stderr: got %q, want %q", got, "oops\n")
	}
}

// TestMonitorStopGrace: a process the task left behind, holding stdout
// open, does not keep Stop waiting beyond its grace, and what the task
// wrote before exiting is kept.
func TestMonitorStopGrace(t *testing.T) {
	d, dir := openTestDir(t)
	m, err := Start(testLogger(t), d, "web", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "seq 1 50000; sleep 30 & exit 0")
	cmd.Stdout, cmd.Stderr = m.Stdout(), m.Stderr()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	m.CloseWriters()
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := m.Stop(300 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Stop took %v with a grace of 300ms", took)
	}
	var want bytes.Buffer
	for i := 1; i <= 50000; i++ {
		fmt.Fprintf(&want, "%d\n", i)
	}
	if got := concat(t, dir, "web.stdout"); got != want.String() {
		t.Errorf("stdout: got %d bytes, want %d", len(got), want.Len())
	}
}

// TestMonitorStopWithBusyLeftover: a process the task left behind that
// keeps writing does not keep Stop from finishing, and the task's own
// output comes first, whole.
func TestMonitorStopWithBusyLeftover(t *testing.T) {
	d, dir := openTestDir(t)
	m, err := Start(testLogger(t), d, "web", DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "echo first; (while :; do echo leftover; done) & exit 0")
	cmd.Stdout, cmd.Stderr = m.Stdout(), m.Stderr()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	m.CloseWriters()
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := m.Stop(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Stop took %v with a grace of 200ms", took)
	}
	got := concat(t, dir, "web.stdout")
	if !strings.HasPrefix(got, "first\nleftover\n") {
		t.Errorf("stdout starts with %.40q, want the task's line then the leftover's", got)
	}
}

// TestMonitorStepsOverAPlantedRun: a task that plants more links than
// a rotation steps over one at a time, where the rotations will look,
// neither stops its logging nor reaches what the links point at: the
// rotator goes on after the highest name there is.
func TestMonitorStepsOverAPlantedRun(t *testing.T) {
	d, dir := openTestDir(t)
	m, err := Start(hclogOff(), d, "web", byteConfig(100, 100))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= maxSkips+1; i++ {
		if err := os.Symlink("/etc/passwd", filepath.Join(dir, fmt.Sprintf("web.stdout.%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := os.Stat("/etc/passwd")
	if err := runTask(t, m, "seq 1 1000"); err != nil {
		t.Errorf("Stop: %v, want a clean run", err)
	}
	if after, _ := os.Stat("/etc/passwd"); before == nil || after == nil || after.Size() != before.Size() || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("/etc/passwd changed: %v, then %v", before, after)
	}
	want, err := exec.Command("seq", "1", "1000").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := concatRegular(t, dir, "web.stdout"); got != string(want) {
		t.Errorf("the regular log files hold %d bytes, want all %d of the output in order", len(got), len(want))
	}
}

// concatRegular is concat over regular files only: planted links are not
// read.
func concatRegular(t *testing.T, dir, base string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	byIndex := map[int]string{}
	var idx []int
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), base+".")
		i, err := strconv.Atoi(rest)
		if !ok || err != nil || !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		byIndex[i] = string(b)
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var b strings.Builder
	for _, i := range idx {
		b.WriteString(byIndex[i])
	}
	return b.String()
}

// TestMonitorCountsLostOutput: on a log directory that fills up, reading
// goes on, and Stop reports ErrOutputLost with the reason (ENOSPC) and
// Lost counts exactly the bytes the files did not take: what the task
// wrote is what is in the files plus what was lost. The other stream,
// which wrote nothing, reports nothing, and the FIFOs are removed.
func TestMonitorCountsLostOutput(t *testing.T) {
	dir := smallTmpfs(t, "size=128k")
	d, err := OpenDir(dir, ".")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	m, err := Start(hclogOff(), d, "web", byteConfig(1000, 16<<20))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Lost(); got != 0 {
		t.Fatalf("Lost before any output: got %d, want 0", got)
	}
	want, err := exec.Command("seq", "1", "100000").Output() // 588,895 bytes
	if err != nil {
		t.Fatal(err)
	}
	err = runTask(t, m, "seq 1 100000")
	if !errors.Is(err, ErrOutputLost) || !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Stop: got %v, want ErrOutputLost and ENOSPC", err)
	}
	if strings.Contains(err.Error(), "stderr") {
		t.Errorf("Stop: %v; stderr lost nothing", err)
	}
	got := concat(t, dir, "web.stdout")
	if !strings.HasPrefix(string(want), got) {
		t.Errorf("the files hold %d bytes that are not the start of the output", len(got))
	}
	if lost := m.Lost(); lost == 0 || int64(len(got))+lost != int64(len(want)) {
		t.Errorf("Lost: got %d with %d bytes in the files, want the %d the task wrote in all", lost, len(got), len(want))
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("%d bytes of stdout", m.Lost())) {
		t.Errorf("Stop: %v, want it to say how many bytes of stdout were lost", err)
	}
	for _, s := range Streams {
		if _, err := os.Lstat(filepath.Join(dir, FIFOName("web", s))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("FIFO of %s after Stop: %v, want it removed", s, err)
		}
	}
	if got := concat(t, dir, "web.stderr"); got != "" {
		t.Errorf("stderr: got %q, want nothing", got)
	}
}

// smallTmpfs mounts a tmpfs with opts on a fresh directory for the
// test, so that it fills up; it skips where mounting is not allowed.
func smallTmpfs(t *testing.T, opts string) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, opts); err != nil {
		t.Skipf("cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}
