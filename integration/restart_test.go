package integration

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"golang.org/x/sys/unix"
)

// The helpers TestLiveRestart runs as tasks: the test binary again, in a
// process of its own, told what to do by its environment.
const (
	appendEnv = "ALLOCFS_IT_APPEND"
	mmapEnv   = "ALLOCFS_IT_MMAP"
	// bigSize is the size of the file the mapping reads.
	bigSize = 64 << 20
)

// TestHelperAppender is not a test: it appends a numbered line to the
// file appendEnv names and fsyncs it, every 10 ms, until SIGTERM; then it
// prints how many lines it wrote. Any error ends it with status 1.
func TestHelperAppender(t *testing.T) {
	path := os.Getenv(appendEnv)
	if path == "" {
		t.Skip("run as a task by TestLiveRestart")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for i := 1; ; i++ {
		select {
		case <-stop:
			if err := f.Close(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			fmt.Printf("wrote %d\n", i-1)
			os.Exit(0)
		default:
		}
		if _, err := fmt.Fprintf(f, "line %06d\n", i); err != nil {
			fmt.Fprintf(os.Stderr, "line %d: %v\n", i, err)
			os.Exit(1)
		}
		if err := f.Sync(); err != nil {
			fmt.Fprintf(os.Stderr, "fsync after line %d: %v\n", i, err)
			os.Exit(1)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHelperMmapReader is not a test: it maps the file mmapEnv names and
// reads every page of it over and over, each starting with its own index,
// until SIGTERM; then it prints how many passes it made. A wrong page
// ends it with status 1, and a page the kernel cannot read with SIGBUS.
func TestHelperMmapReader(t *testing.T) {
	path := os.Getenv(mmapEnv)
	if path == "" {
		t.Skip("run as a task by TestLiveRestart")
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	f, err := os.Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, bigSize, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for pass := 0; ; pass++ {
		select {
		case <-stop:
			fmt.Printf("passes %d\n", pass)
			os.Exit(0)
		default:
		}
		for p := 0; p < bigSize/4096; p++ {
			if got := binary.LittleEndian.Uint64(m[p*4096:]); got != uint64(p) {
				fmt.Fprintf(os.Stderr, "page %d starts with %d\n", p, got)
				os.Exit(1)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// task is a process TestLiveRestart runs against the mount.
type task struct {
	name     string
	cmd      *exec.Cmd
	out, err allocdirtest.SyncBuffer
	done     chan struct{}
}

func startTask(t *testing.T, name string, cmd *exec.Cmd) *task {
	t.Helper()
	k := &task{name: name, cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &k.out, &k.err
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		cmd.Wait()
		close(k.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-k.done
	})
	return k
}

// helperTask runs the test binary's helper test name with env.
func helperTask(t *testing.T, name string, env string) *task {
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$")
	cmd.Env = append(os.Environ(), env)
	return startTask(t, name, cmd)
}

// stopTask sends sig and waits for the task to end.
func (k *task) stopTask(t *testing.T, sig syscall.Signal) {
	t.Helper()
	k.cmd.Process.Signal(sig)
	select {
	case <-k.done:
	case <-time.After(harness.Timeout):
		t.Fatalf("%s did not end within %v of %v", k.name, harness.Timeout, sig)
	}
}

// stallProbe looks up a new name in dir every 5 ms (each a request the
// daemon must answer) and records the longest wait.
type stallProbe struct {
	mu      sync.Mutex
	longest time.Duration
	errs    []string
	stop    chan struct{}
	done    chan struct{}
}

func startStallProbe(dir string) *stallProbe {
	p := &stallProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			start := time.Now()
			var st unix.Stat_t
			err := unix.Stat(filepath.Join(dir, "probe-"+strconv.Itoa(i)), &st)
			took := time.Since(start)
			p.mu.Lock()
			p.longest = max(p.longest, took)
			if err != unix.ENOENT {
				p.errs = append(p.errs, fmt.Sprintf("probe %d: %v", i, err))
			}
			p.mu.Unlock()
		}
	}()
	return p
}

// TestLiveRestart is the live-restart issue's bar: on one allocation, a
// writer appends a numbered line and fsyncs every 10 ms, tail -F follows
// that file, a shell with its working directory in <task>/local runs ls
// every 100 ms, a process reads a 64 MiB file through a mapping, and a
// process in another mount namespace reads through a bind mount of the
// allocation's alloc/; the task's secrets/ and private/ hold a file each.
// Then serve is started again on the same mount (an
// upgrade), and the daemon is killed with SIGKILL and started again. No
// process may see an error; the log has every line once and in order,
// and tail -F printed them all.
func TestLiveRestart(t *testing.T) {
	fstest.RequireFUSE(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		fstest.Lacks(t, "unshare (util-linux) is needed for the bind mount in another namespace: %v", err)
	}
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	secrets := secretFiles("a1")
	for p := range secrets {
		if strings.HasPrefix(p, "a1/api/") {
			delete(secrets, p)
			continue
		}
		if err := os.WriteFile(filepath.Join(n.mnt, p), []byte(secrets[p]), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(n.mnt, "a1/alloc/data")
	big := filepath.Join(data, "big")
	page := make([]byte, 4096)
	bf, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriterSize(bf, 1<<20)
	for p := 0; p < bigSize/4096; p++ {
		binary.LittleEndian.PutUint64(page, uint64(p))
		w.Write(page)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := bf.Close(); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(data, "log.txt")

	writer := helperTask(t, "TestHelperAppender", appendEnv+"="+logPath)
	for deadline := time.Now().Add(harness.Timeout); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(logPath); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the writer wrote nothing: %s", writer.err.String())
		}
	}
	tail := startTask(t, "tail -F", exec.Command("tail", "-n", "+1", "-F", logPath))
	shell := exec.Command("sh", "-c", "while :; do ls > /dev/null || echo ls failed >&2; sleep 0.1; done")
	shell.Dir = filepath.Join(n.mnt, "a1/web/local")
	lister := startTask(t, "ls in <task>/local", shell)
	mapper := helperTask(t, "TestHelperMmapReader", mmapEnv+"="+big)
	bind := filepath.Join(t.TempDir(), "alloc")
	if err := os.Mkdir(bind, 0o755); err != nil {
		t.Fatal(err)
	}
	binder := startTask(t, "bind mount", exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$2" || exit 1
		while :; do
			cat "$2/data/log.txt" > /dev/null || echo cat failed >&2
			ls "$2/data" > /dev/null || echo ls failed >&2
			sleep 0.1
		done`, "sh", filepath.Join(n.mnt, "a1/alloc"), bind))
	probe := startStallProbe(data)
	// What libcontainer keeps in alloc/container while an exec task
	// runs, and a socket and a ready file tasks share through alloc/
	// and the allocation's own directory: outside every volume of the
	// layout, and used across the upgrade and the crash.
	container := filepath.Join(n.mnt, "a1/alloc/container")
	if err := os.Mkdir(container, 0o711); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(container, "exec.fifo")
	if err := unix.Mkfifo(fifo, 0o622); err != nil {
		t.Fatal(err)
	}
	fifoReader := startTask(t, "FIFO reader", exec.Command("sh", "-c", `while read l < "$1"; do echo "$l"; done`, "sh", fifo))
	sock, err := net.Listen("unix", filepath.Join(container, "api.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	go func() {
		for {
			c, err := sock.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("pong"))
			c.Close()
		}
	}()
	ready, err := os.OpenFile(filepath.Join(n.mnt, "a1/ready"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer ready.Close()
	time.Sleep(500 * time.Millisecond)

	// (a) An upgrade: serve again on the same data dir and mount.
	old := n.Daemon
	n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket})
	if code := old.Wait(t); code != 0 {
		t.Errorf("the daemon that handed over exited %d, want 0:\n%s", code, old.Out)
	}
	waitLog(t, n.Daemon, "took the mount over")
	time.Sleep(500 * time.Millisecond)

	// (b) A crash, and a start.
	n.kill9(t)
	n.Restart(t)
	waitLog(t, n.Daemon, "took the mount over")
	time.Sleep(500 * time.Millisecond)

	if err := os.WriteFile(fifo, []byte("after the crash\n"), 0); err != nil {
		t.Errorf("writing alloc/container/exec.fifo after the crash: %v", err)
	}
	if c, err := net.Dial("unix", filepath.Join(container, "api.sock")); err != nil {
		t.Errorf("connecting to alloc/container/api.sock after the crash: %v", err)
	} else {
		if b, err := io.ReadAll(c); err != nil || string(b) != "pong" {
			t.Errorf("alloc/container/api.sock answered %q, %v; want pong", b, err)
		}
		c.Close()
	}
	if _, err := ready.WriteString("ready\n"); err != nil {
		t.Errorf("writing a1/ready through its descriptor after the crash: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(n.mnt, "a1/ready")); err != nil || string(b) != "ready\n" {
		t.Errorf("a1/ready after the crash: %q, %v", b, err)
	}
	for deadline := time.Now().Add(harness.Timeout); !strings.Contains(fifoReader.out.String(), "after the crash") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if got := fifoReader.out.String(); got != "after the crash\n" {
		t.Errorf("the FIFO's reader read %q, want the line written after the crash", got)
	}
	fifoReader.stopTask(t, syscall.SIGKILL)

	// SIGHUP reloads and the daemon serves on.
	if err := syscall.Kill(n.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitLog(t, n.Daemon, "reloaded")
	time.Sleep(200 * time.Millisecond)

	writer.stopTask(t, syscall.SIGTERM)
	close(probe.stop)
	<-probe.done
	wrote, want := writer.appended(t, logPath)
	for deadline := time.Now().Add(harness.Timeout); tail.out.String() != want && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}
	if got := tail.out.String(); got != want {
		t.Errorf("tail -F did not print every line once and in order:\n%s", firstDifference(got, want))
	}
	mapper.stopTask(t, syscall.SIGTERM)
	if code := mapper.cmd.ProcessState.ExitCode(); code != 0 || !strings.HasPrefix(mapper.out.String(), "passes ") {
		t.Errorf("the mapping's reader: exit %d, %q %q", code, mapper.out.String(), mapper.err.String())
	}
	for _, k := range []*task{tail, lister, binder} {
		select {
		case <-k.done:
			t.Errorf("%s ended early: %v\n%s", k.name, k.cmd.ProcessState, k.err.String())
		default:
		}
		k.stopTask(t, syscall.SIGKILL)
		if k.err.String() != "" {
			t.Errorf("%s saw errors:\n%s", k.name, k.err.String())
		}
	}
	for p, content := range secrets {
		if b, err := os.ReadFile(filepath.Join(n.mnt, p)); err != nil || string(b) != content {
			t.Errorf("%s after an upgrade and a crash: %q, %v; want %q", p, b, err, content)
		}
	}
	probe.mu.Lock()
	if len(probe.errs) > 0 {
		t.Errorf("lookups failed: %v", probe.errs)
	}
	t.Logf("%d lines over an upgrade and a crash; the longest a lookup waited: %v", wrote, probe.longest)
	probe.mu.Unlock()
	n.stop(t)
}

// appended checks, once the TestHelperAppender task k has ended, that
// the file at path has every line it wrote, once and in order, and
// returns how many it wrote and what they are.
func (k *task) appended(t *testing.T, path string) (int, string) {
	t.Helper()
	wrote := 0
	if _, err := fmt.Sscanf(k.out.String(), "wrote %d", &wrote); err != nil || k.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("the writer: exit %d, %q %q", k.cmd.ProcessState.ExitCode(), k.out.String(), k.err.String())
	}
	var want strings.Builder
	for i := 1; i <= wrote; i++ {
		fmt.Fprintf(&want, "line %06d\n", i)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != want.String() {
		t.Errorf("%s after %d lines (%v) is not every line once and in order:\n%s", path, wrote, err, firstDifference(string(b), want.String()))
	}
	return wrote, want.String()
}

// waitLog waits until the daemon's log says text.
func waitLog(t *testing.T, d *harness.Daemon, text string) {
	t.Helper()
	for deadline := time.Now().Add(harness.Timeout); !strings.Contains(d.Out.String(), text); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's log never said %q:\n%s", text, d.Out)
		}
	}
}

// firstDifference describes where got first differs from want.
func firstDifference(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return fmt.Sprintf("line %d: got %q, want %q (%d lines, want %d)", i+1, g[i], w[i], len(g)-1, len(w)-1)
		}
	}
	return fmt.Sprintf("%d lines, want %d", len(g)-1, len(w)-1)
}

// serveOnce runs `allocfs serve` on n's directories, expecting it to
// fail, and returns its exit code and output.
func serveOnce(t *testing.T, n *node) (int, string) {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), "serve", "--data-dir", n.dataDir, "--mount", n.mnt, "--socket", n.socket)
	done := make(chan struct{})
	var out []byte
	go func() {
		out, _ = cmd.CombinedOutput()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(harness.Timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("serve did not give up within %v:\n%s", harness.Timeout, out)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestUpgradeRefusals: a serve started on a running daemon's mount does
// not get it when the recorded session is of a version it cannot take
// over; the running daemon serves on, unchanged.
func TestUpgradeRefusals(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	session := filepath.Join(n.dataDir, "fuse/session.json")
	b, err := os.ReadFile(session)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(session, []byte(strings.Replace(string(b), `"Version":1`, `"Version":99`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out := serveOnce(t, n)
	if code == 0 || !strings.Contains(out, "keeps serving") || !strings.Contains(out, "version 99") {
		t.Errorf("serve over a session of another version: exit %d, want a refusal:\n%s", code, out)
	}
	if err := os.WriteFile(session, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadDir(filepath.Join(n.mnt, "a1/alloc/data")); err != nil {
		t.Errorf("the running daemon after two refusals: %v", err)
	}
	select {
	case <-n.Exited():
		t.Fatalf("the running daemon exited:\n%s", n.Out)
	default:
	}
	n.stop(t)
}

// TestUpgradeRace: two serves started at once on a running daemon's
// mount: exactly one takes it over, the other fails and says why.
func TestUpgradeRace(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	old := n.Daemon
	type outcome struct {
		code int
		out  string
		cmd  *exec.Cmd
	}
	results := make(chan outcome, 2)
	for range 2 {
		cmd := exec.Command(harness.Binary(t), "serve", "--data-dir", n.dataDir, "--mount", n.mnt, "--socket", n.socket)
		var out allocdirtest.SyncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() {
			cmd.Wait()
			close(exited)
		}()
		t.Cleanup(func() {
			cmd.Process.Kill()
			<-exited
		})
		go func() {
			// The winner serves until told to stop; the loser exits.
			for deadline := time.Now().Add(harness.Timeout); time.Now().Before(deadline); {
				select {
				case <-exited:
					results <- outcome{cmd.ProcessState.ExitCode(), out.String(), cmd}
					return
				case <-time.After(20 * time.Millisecond):
				}
				if s := out.String(); strings.Contains(s, "serving:") {
					results <- outcome{-1, s, cmd}
					return
				}
			}
			results <- outcome{-2, out.String(), cmd}
		}()
	}
	a, b := <-results, <-results
	if (a.code == -1) == (b.code == -1) {
		t.Fatalf("two serves racing: want exactly one serving, got exit %d and %d:\n%s\n---\n%s", a.code, b.code, a.out, b.out)
	}
	winner, loser := a, b
	if b.code == -1 {
		winner, loser = b, a
	}
	if loser.code == 0 || !strings.Contains(loser.out, "in use by another allocfs") {
		t.Errorf("the serve that lost: exit %d, want a failure naming the data dir's lock:\n%s", loser.code, loser.out)
	}
	if code := old.Wait(t); code != 0 {
		t.Errorf("the daemon that handed over exited %d", code)
	}
	if _, err := os.ReadDir(filepath.Join(n.mnt, "a1/alloc/data")); err != nil {
		t.Errorf("the mount after the race: %v", err)
	}
	winner.cmd.Process.Signal(syscall.SIGUSR1)
	for deadline := time.Now().Add(harness.Timeout); harness.MountsAt(t, n.mnt) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the winner's full stop left the mount")
		}
	}
}

// notifications is systemd's end of NOTIFY_SOCKET, for one test.
type notifications struct {
	c    *net.UnixConn
	path string
}

func listenNotify(t *testing.T) *notifications {
	t.Helper()
	dir, err := os.MkdirTemp("", "allocfs-sd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "notify")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &notifications{c: c, path: path}
}

// expect reads notifications until one has every line of want, and
// returns the descriptors it carried.
func (s *notifications) expect(t *testing.T, want ...string) []int {
	t.Helper()
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4*4))
	s.c.SetReadDeadline(time.Now().Add(harness.Timeout))
	for {
		n, oobn, _, _, err := s.c.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Fatalf("waiting for %q from the daemon: %v", want, err)
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if got, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		lines := strings.Split(string(buf[:n]), "\n")
		all := true
		for _, w := range want {
			all = all && slices.Contains(lines, w)
		}
		if all {
			return fds
		}
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// TestSystemdKeepsTheConnection plays systemd's side of
// deploy/allocfs.service: serve says READY=1 and stores the FUSE
// connection (FDSTORE=1, named fuse) on NOTIFY_SOCKET; after a SIGKILL
// the next serve, started with that descriptor as LISTEN_FDS, takes the
// mount over; a reload says RELOADING=1 then READY=1; a full stop says
// STOPPING=1 and takes the descriptor back out of the store. A task's
// secrets/ goes to the store as well, and is there after the SIGKILL. The unit
// itself passes systemd-analyze verify.
func TestSystemdKeepsTheConnection(t *testing.T) {
	fstest.RequireFUSE(t)
	if path, err := exec.LookPath("systemd-analyze"); err == nil {
		unit, err := os.ReadFile("../deploy/allocfs.service")
		if err != nil {
			t.Fatal(err)
		}
		local := filepath.Join(t.TempDir(), "allocfs.service")
		if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/allocfs", harness.Binary(t))), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(path, "verify", local).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify deploy/allocfs.service: %v\n%s", err, out)
		}
	} else {
		t.Logf("systemd-analyze not found: the unit is not verified (%v)", err)
	}

	sd := listenNotify(t)
	root, err := os.MkdirTemp("", "allocfs-it-")
	if err != nil {
		t.Fatal(err)
	}
	if root, err = filepath.EvalSymlinks(root); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	n := &node{dataDir: filepath.Join(root, "data"), mnt: filepath.Join(root, "mnt"), socket: filepath.Join(root, "allocfs.sock")}
	n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket, Env: []string{"NOTIFY_SOCKET=" + sd.path}})
	fds := sd.expect(t, "FDSTORE=1", "FDNAME=fuse")
	if len(fds) != 1 {
		t.Fatalf("FDSTORE=1 carried %d descriptors, want 1", len(fds))
	}
	stored := os.NewFile(uintptr(fds[0]), "fuse")
	defer stored.Close()
	sd.expect(t, "READY=1")
	if strings.Contains(n.Out.String(), "holder runs") {
		t.Errorf("under systemd serve started a holder too:\n%s", n.Out)
	}
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	f := filepath.Join(n.mnt, "a1/alloc/data/f")
	if err := os.WriteFile(f, []byte("kept by systemd"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A memory volume goes to the store as it is made, named by a hash
	// of its key (restart/memkeep.go).
	secret := filepath.Join(n.mnt, "a1/web/secrets/token")
	if err := os.WriteFile(secret, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("a1/web/secrets"))
	memName := "mem-" + hex.EncodeToString(sum[:16])
	memFds := sd.expect(t, "FDSTORE=1", "FDPOLL=0", "FDNAME="+memName)
	if len(memFds) != 1 {
		t.Fatalf("the memory volume's FDSTORE=1 carried %d descriptors, want 1", len(memFds))
	}
	memStored := os.NewFile(uintptr(memFds[0]), memName)
	defer memStored.Close()

	n.kill9(t)
	waited := make(chan error, 1)
	go func() {
		_, err := os.ReadFile(f)
		waited <- err
	}()
	// As systemd starts the next one: the stored descriptor as fd 3,
	// named in LISTEN_FDNAMES, with LISTEN_PID the new process's.
	n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket,
		Prefix:     []string{"sh", "-c", `export LISTEN_PID=$$; exec "$@"`, "sh"},
		Env:        []string{"NOTIFY_SOCKET=" + sd.path, "LISTEN_FDS=2", "LISTEN_FDNAMES=fuse:" + memName},
		ExtraFiles: []*os.File{stored, memStored}})
	waitLog(t, n.Daemon, "took the mount over")
	if err := <-waited; err != nil {
		t.Errorf("a read made while no daemon ran: %v", err)
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "s3cr3t" {
		t.Errorf("the secret after a SIGKILL, kept by systemd: %q, %v", b, err)
	}
	for _, fd := range sd.expect(t, "FDSTORE=1", "FDNAME=fuse") {
		unix.Close(fd)
	}
	sd.expect(t, "READY=1")
	if err := syscall.Kill(n.Pid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	sd.expect(t, "RELOADING=1")
	sd.expect(t, "READY=1")
	if err := syscall.Kill(n.Pid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	sd.expect(t, "STOPPING=1")
	sd.expect(t, "FDSTOREREMOVE=1", "FDNAME="+memName)
	sd.expect(t, "FDSTOREREMOVE=1", "FDNAME=fuse")
	if code := n.Wait(t); code != 0 {
		t.Errorf("serve after SIGUSR1: exit %d", code)
	}
	if c := harness.MountsAt(t, n.mnt); c != 0 {
		t.Errorf("after the full stop: %d mounts at %s", c, n.mnt)
	}
}
