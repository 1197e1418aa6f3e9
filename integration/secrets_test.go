package integration

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// socketEnv names the unix socket TestHelperSocketServer listens on.
const socketEnv = "ALLOCFS_IT_SOCKET"

// TestHelperSocketServer is not a test: it listens on the unix socket
// socketEnv names (a task API socket in secrets/, as Nomad's) and answers
// every connection with "pong <n>" until SIGTERM.
func TestHelperSocketServer(t *testing.T) {
	path := os.Getenv(socketEnv)
	if path == "" {
		t.Skip("run as a task by TestSecretsOutliveTheDaemon")
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go func() {
		<-stop
		os.Exit(0)
	}()
	for i := 1; ; i++ {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Fprintf(c, "pong %d\n", i)
		c.Close()
	}
}

// askSocket connects to the unix socket at path and returns its answer.
func askSocket(path string) (string, error) {
	c, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// askHolder sends one request to the holder of the node's mount, in its
// protocol (restart/holder.go), and returns its answer.
func (n *node) askHolder(t *testing.T, request string) string {
	t.Helper()
	c, err := net.DialTimeout("unix", filepath.Join(n.dataDir, "fuse/holder.sock"), 5*time.Second)
	if err != nil {
		t.Fatalf("reaching the holder: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, request+"\n"); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("the holder's answer to %q: %v", request, err)
	}
	return strings.TrimSpace(string(b))
}

// holderPid is the PID of the holder of the node's mount.
func (n *node) holderPid(t *testing.T) int {
	t.Helper()
	pid, err := strconv.Atoi(n.askHolder(t, "pid"))
	if err != nil {
		t.Fatalf("the holder's PID: %v", err)
	}
	return pid
}

// secretFiles are what the test puts in every memory volume, by path in
// the mount.
func secretFiles(allocs ...string) map[string]string {
	files := make(map[string]string)
	for _, a := range allocs {
		for _, task := range []string{"web", "api"} {
			files[a+"/"+task+"/secrets/token"] = "token of " + a + "/" + task
			files[a+"/"+task+"/private/key"] = "key of " + a + "/" + task
		}
	}
	return files
}

// TestSecretsOutliveTheDaemon is the bar of memory volumes kept beyond
// the daemon: every memory volume of two allocations with the same task
// names holds a file, a writer appends to a file in secrets/ through one
// descriptor and fsyncs it, and a server listens on a unix socket in
// secrets/. Then the daemon is upgraded, killed with SIGKILL and started
// again, and stopped with SIGTERM (which leaves the mount with a running
// allocation) and started again. After each, every secret reads back, a
// client connects to the socket, and the writer carries on; at the end
// its file has every line once and in order. The daemon's RSS stays put
// while a task fills its secrets/.
func TestSecretsOutliveTheDaemon(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web", "--task", "api", "--secrets-mb", "16")
	n.mustCLI(t, "alloc", "create", "a2", "--task", "web", "--task", "api")
	files := secretFiles("a1", "a2")
	for p, content := range files {
		if err := os.WriteFile(filepath.Join(n.mnt, p), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	logPath := filepath.Join(n.mnt, "a1/web/secrets/log.txt")
	writer := helperTask(t, "TestHelperAppender", appendEnv+"="+logPath)
	sock := filepath.Join(n.mnt, "a1/web/secrets/api.sock")
	server := helperTask(t, "TestHelperSocketServer", socketEnv+"="+sock)
	for deadline := time.Now().Add(harness.Timeout); ; time.Sleep(10 * time.Millisecond) {
		if _, err := askSocket(sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the socket server never answered: %s", server.err.String())
		}
	}

	// A task filling its 16 MiB secrets/ costs the daemon no memory: the
	// pages are the kernel's tmpfs's.
	rss := func() int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				return kb << 10
			}
		}
		t.Fatal("no VmRSS")
		return 0
	}
	fill := filepath.Join(n.mnt, "a1/api/secrets/fill")
	if err := os.WriteFile(fill, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	daemonOpens := n.scrape(t).value("allocfs_fuse_file_opens_total", map[string]string{"mode": "daemon"})
	// The daemon has just been started and has served the checks above
	// and the scrape: its RSS is measured once it stopped moving, so that
	// what it grows by is the fill's.
	before := rss()
	for settle := time.Now().Add(5 * time.Second); time.Now().Before(settle); {
		time.Sleep(200 * time.Millisecond)
		now := rss()
		if d := now - before; d > -64<<10 && d < 64<<10 {
			break
		}
		before = now
	}
	f, err := os.OpenFile(fill, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	written := 0
	for {
		k, err := f.Write(chunk)
		written += k
		if err != nil {
			if !strings.Contains(err.Error(), "no space left") {
				t.Fatalf("filling secrets/: %v", err)
			}
			break
		}
	}
	f.Close()
	grown := rss() - before
	t.Logf("the daemon's RSS: %d KiB before a task wrote %d bytes into its 16 MiB secrets/ (to ENOSPC), %+d KiB after", before>>10, written, grown>>10)
	if grown > 1<<20 {
		t.Errorf("the daemon's RSS grew by %d KiB while a task filled its secrets/; want at most 1 MiB", grown>>10)
	}
	// And no byte of it reached the daemon: the fill's handle was the
	// kernel's to serve (no handle more served by the daemon), and
	// passthrough was never lost.
	after := n.scrape(t)
	if opens := after.value("allocfs_fuse_file_opens_total", map[string]string{"mode": "daemon"}); opens != daemonOpens {
		t.Errorf("handles the daemon serves: %v before the fill, %v after; want the fill served by passthrough", daemonOpens, opens)
	}
	if lost := after.value("allocfs_fuse_passthrough_lost", nil); lost != 0 {
		t.Errorf("allocfs_fuse_passthrough_lost after the fill: %v, want 0", lost)
	}
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}

	check := func(after string) {
		t.Helper()
		for p, content := range files {
			if b, err := os.ReadFile(filepath.Join(n.mnt, p)); err != nil || string(b) != content {
				t.Errorf("after %s: %s reads %q, %v; want %q", after, p, b, err, content)
			}
		}
		if answer, err := askSocket(sock); err != nil || !strings.HasPrefix(answer, "pong ") {
			t.Errorf("after %s: a client of the socket in secrets/ got %q, %v", after, answer, err)
		}
		select {
		case <-writer.done:
			t.Fatalf("after %s: the writer ended: %s", after, writer.err.String())
		default:
		}
		size := func() int64 {
			fi, err := os.Stat(logPath)
			if err != nil {
				t.Fatalf("after %s: %v", after, err)
			}
			return fi.Size()
		}
		was := size()
		for deadline := time.Now().Add(harness.Timeout); size() == was; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %s: the writer's file stopped growing", after)
			}
		}
	}
	check("the start")

	old := n.Daemon
	n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket})
	if code := old.Wait(t); code != 0 {
		t.Errorf("the daemon that handed over exited %d, want 0:\n%s", code, old.Out)
	}
	waitLog(t, n.Daemon, "took the mount over")
	check("an upgrade")

	n.kill9(t)
	n.Restart(t)
	waitLog(t, n.Daemon, "took the mount over")
	check("a SIGKILL and a start")

	if code := n.Signal(t, syscall.SIGTERM); code != 0 {
		t.Errorf("serve after SIGTERM: exit %d, want 0", code)
	}
	if !strings.Contains(n.Out.String(), "the mount stays for the next serve") {
		t.Errorf("SIGTERM with running allocations did not leave the mount:\n%s", n.Out)
	}
	n.Restart(t)
	waitLog(t, n.Daemon, "took the mount over")
	check("a SIGTERM that left the mount and a start")

	if _, h := n.health(t); !checkOK(h, "memory") {
		t.Errorf("health after the restarts: %+v", h)
	}
	writer.stopTask(t, syscall.SIGTERM)
	writer.appended(t, logPath)
	server.stopTask(t, syscall.SIGTERM)

	// A full stop ends them; the next start finds them empty, and says
	// nothing was lost: they ended as they should.
	n.stop(t)
	n.Restart(t)
	if _, err := os.Stat(filepath.Join(n.mnt, "a1/web/secrets/token")); !os.IsNotExist(err) {
		t.Errorf("a secret after a full stop and a start: %v, want none", err)
	}
	if strings.Contains(n.Out.String(), "memory volumes lost") {
		t.Errorf("a start after a full stop reports lost memory volumes:\n%s", n.Out)
	}
	n.stop(t)
}

// checkOK reports whether the health check name passed.
func checkOK(h api.Health, name string) bool {
	for _, c := range h.Checks {
		if c.Name == name {
			return c.OK
		}
	}
	return false
}

// TestSecretsWhenTheHolderDies: the holder killed with SIGKILL while the
// daemon runs is replaced, and the memory volumes go to the new one (a
// crash of the daemon after that keeps them); killed together with the
// daemon, the mount and its memory volumes end, and the next start says
// so in its log and its health, naming them.
func TestSecretsWhenTheHolderDies(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	secret := filepath.Join(n.mnt, "a1/web/secrets/token")
	if err := os.WriteFile(secret, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	first := n.holderPid(t)
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitLog(t, n.Daemon, "a new holder keeps the FUSE connection and the memory volumes")
	if got := n.askHolder(t, "names"); got != "a1%2Fweb%2Fsecrets" {
		t.Errorf("the new holder keeps %q, want a1/web/secrets", got)
	}
	n.kill9(t)
	n.Restart(t)
	waitLog(t, n.Daemon, "took the mount over")
	if b, err := os.ReadFile(secret); err != nil || string(b) != "s3cr3t" {
		t.Errorf("the secret after its holder was replaced and the daemon killed: %q, %v", b, err)
	}

	holder := n.holderPid(t)
	n.kill9(t)
	if err := syscall.Kill(holder, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n.Restart(t)
	waitLog(t, n.Daemon, "memory volumes lost")
	if c := strings.Count(n.Out.String(), "memory volumes lost"); c != 1 {
		t.Errorf("the start said %d times that memory volumes were lost, want once:\n%s", c, n.Out)
	}
	if !strings.Contains(n.Out.String(), "a1/web/secrets") {
		t.Errorf("the start did not name the lost volume:\n%s", n.Out)
	}
	if _, err := os.Stat(secret); !os.IsNotExist(err) {
		t.Errorf("the secret after both were killed: %v, want none", err)
	}
	_, h := n.health(t)
	found := false
	for _, c := range h.Checks {
		if c.Name == "memory" {
			found = true
			if c.OK || !strings.Contains(c.Detail, "a1/web/secrets") {
				t.Errorf("the memory health check after the loss: %+v, want a failure naming a1/web/secrets", c)
			}
		}
	}
	if !found {
		t.Errorf("no memory health check: %+v", h)
	}
	n.mustCLI(t, "alloc", "destroy", "a1")
	if _, h := n.health(t); !checkOK(h, "memory") {
		t.Errorf("the memory health check once the allocation is gone: %+v, want it passing", h)
	}
	n.stop(t)
}

// alarms are the lines of a daemon's log at WARN or ERROR.
func alarms(log string) []string {
	var found []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "[WARN]") || strings.Contains(l, "[ERROR]") {
			found = append(found, l)
		}
	}
	return found
}

// TestHolderQuietWithoutTrouble: an upgrade while no memory volume has
// been made finds the holder keeping none, which is no failure; a full
// stop, whose unmount ends the holder with the connection before the
// mount lets its memory volumes go, has nothing left to drop from it.
// Neither logs a warning or an error.
func TestHolderQuietWithoutTrouble(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	if got := n.askHolder(t, "names"); got != "" {
		t.Fatalf("the holder keeps %q before any secrets/ was made, want nothing", got)
	}
	if code := n.Upgrade(t); code != 0 {
		t.Errorf("the daemon that handed over exited %d, want 0", code)
	}
	waitLog(t, n.Daemon, "took the mount over")
	if a := alarms(n.Out.String()); len(a) > 0 {
		t.Errorf("an upgrade with no memory volume logged:\n%s", strings.Join(a, "\n"))
	}

	for _, p := range []string{"a1/web/secrets/token", "a1/web/private/key"} {
		if err := os.WriteFile(filepath.Join(n.mnt, p), []byte("s3cr3t"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.askHolder(t, "names"); !strings.Contains(got, "a1%2Fweb%2Fsecrets") || !strings.Contains(got, "a1%2Fweb%2Fprivate") {
		t.Fatalf("the holder keeps %q, want a1/web/secrets and a1/web/private", got)
	}
	before := len(n.Out.String())
	n.stop(t)
	if a := alarms(n.Out.String()[before:]); len(a) > 0 {
		t.Errorf("a full stop with memory volumes logged:\n%s", strings.Join(a, "\n"))
	}
}
