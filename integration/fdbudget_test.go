package integration

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
)

// The daemon's descriptor limit in these tests, soft and hard alike: the
// runtime cannot raise it, and 2,000 connections are twice what it allows.
const (
	fdLimit   = 1024
	fdClients = 2000
)

// fdNode is a daemon under `prlimit --nofile=1024:1024` serving the client
// API on TCP behind apiToken, with its budget read from its log.
type fdNode struct {
	*node
	tcp                       string
	tcpConns, streams, perStr int
}

func startFDNode(t *testing.T) *fdNode {
	t.Helper()
	fstest.RequireFUSE(t)
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		fstest.Lacks(t, "prlimit (util-linux) is missing: %v", err)
	}
	var own syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &own); err != nil {
		t.Fatal(err)
	}
	if own.Cur < fdClients+256 {
		t.Skipf("the test's own open files limit (%d) cannot hold %d client connections", own.Cur, fdClients)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(apiToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	n := startNodeWith(t, []string{prlimit, fmt.Sprintf("--nofile=%d:%d", fdLimit, fdLimit), "--"},
		"--http-addr", addr, "--token-file", tokenFile)
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", n.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if want := regexp.MustCompile(fmt.Sprintf(`Max open files\s+%d\s+%d\s`, fdLimit, fdLimit)); !want.Match(limits) {
		t.Fatalf("the daemon's limits, want %d open files soft and hard:\n%s", fdLimit, limits)
	}
	f := &fdNode{node: n, tcp: addr}
	m := regexp.MustCompile(`file descriptor budget: limit=(\d+) .* tcp_conns=(\d+) streams=(\d+) fds_per_stream=(\d+)`).FindStringSubmatch(n.Out.String())
	if m == nil {
		t.Fatalf("no budget line in the daemon's log:\n%s", n.Out)
	}
	if m[1] != strconv.Itoa(fdLimit) {
		t.Fatalf("the daemon's budget is for a limit of %s, want %d", m[1], fdLimit)
	}
	f.tcpConns, _ = strconv.Atoi(m[2])
	f.streams, _ = strconv.Atoi(m[3])
	f.perStr, _ = strconv.Atoi(m[4])
	return f
}

// fds returns how many descriptors the daemon has open.
func (n *fdNode) fds(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", n.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// layerRootsOfANewAlloc is how many descriptors checkServes's new
// allocation leaves the daemon holding: the layer roots its lookups of
// <id>, <id>/web and <id>/web/local cached (layer.RootCache, bounded).
const layerRootsOfANewAlloc = 3

// settledFDs waits until the daemon's descriptor count is at most want and
// returns it; a count that stays above it fails the test.
func (n *fdNode) settledFDs(t *testing.T, want int, what string) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := n.fds(t)
		if got <= want {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the daemon holds %d descriptors, want at most %d", what, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dialAll opens count connections to addr, writing request on every
// every-th one (the first included), and never reads: each stays open,
// idle, until the test closes it. Cleanup closes what the test did not.
func dialAll(t *testing.T, addr string, count int, request string, every int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, count)
	t.Cleanup(func() { closeAll(conns) })
	d := net.Dialer{Timeout: 10 * time.Second}
	deadline := time.Now().Add(2 * time.Minute)
	for i := range count {
		if time.Now().After(deadline) {
			t.Fatalf("opened %d of %d connections in 2 minutes", i, count)
		}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("connection %d of %d: %v", i+1, count, err)
		}
		conns = append(conns, c)
		if i%every == 0 {
			c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write([]byte(request)); err != nil {
				t.Fatalf("request on connection %d: %v", i+1, err)
			}
		}
	}
	return conns
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// checkServes checks that the node still does its job for its tasks
// within a bound: a file created in alloc/data through the mount is
// written, synced and read back, and `alloc create` over the control
// socket succeeds.
func (n *fdNode) checkServes(t *testing.T, alloc, newAlloc string) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		p := filepath.Join(n.mnt, alloc, "alloc", "data", "under-pressure-"+newAlloc)
		want := bytes.Repeat([]byte("budget "), 4096)
		f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o644)
		if err != nil {
			done <- err
			return
		}
		defer f.Close()
		if _, err := f.Write(want); err != nil {
			done <- fmt.Errorf("write: %w", err)
			return
		}
		if err := f.Sync(); err != nil {
			done <- fmt.Errorf("fsync: %w", err)
			return
		}
		got, err := os.ReadFile(p)
		if err == nil && !bytes.Equal(got, want) {
			err = fmt.Errorf("read back %d bytes that differ from the %d written", len(got), len(want))
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("I/O through the mount: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("I/O through the mount still blocked after 30s")
	}
	// cli is bounded by harness.Timeout.
	if r := n.cli(t, "alloc", "create", newAlloc, "--task", "web"); r.code != 0 {
		t.Fatalf("alloc create %s: exit %d\n%s", newAlloc, r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(n.mnt, newAlloc, "web", "local")); err != nil {
		t.Fatalf("the allocation created under pressure: %v", err)
	}
}

// TestIdleConnectionsLeaveTheMountItsFDs: 2,000 connections to a daemon
// whose limit is 1,024 descriptors, every other one having sent one
// unauthenticated request and all then idle, take no more than the TCP
// share of its budget: writes through the mount and `alloc create` still
// work, the refusals are logged at a bounded rate, and once the clients
// go the daemon is back to the descriptors it had.
func TestIdleConnectionsLeaveTheMountItsFDs(t *testing.T) {
	n := startFDNode(t)
	n.mustCLI(t, "alloc", "create", "a0", "--task", "web")
	// The first of everything (the notifier, a connection of the control
	// socket) is in the baseline.
	n.checkServes(t, "a0", "warmup")
	baseline := n.fds(t)

	start := time.Now()
	request := "GET /v1/client/fs/ls/a0?path=/ HTTP/1.1\r\nHost: allocfs\r\n\r\n"
	conns := dialAll(t, n.tcp, fdClients, request, 2)
	// The daemon takes the connections it can; the rest wait in the
	// kernel's accept queue and cost it nothing.
	peak := n.fds(t)
	if max := baseline + n.tcpConns + 8; peak > max {
		t.Errorf("with %d idle connections the daemon holds %d descriptors, want at most %d (baseline %d + TCP share %d + 8)",
			fdClients, peak, max, baseline, n.tcpConns)
	}
	n.checkServes(t, "a0", "a1")
	if got := n.fds(t); got > baseline+n.tcpConns+8 {
		t.Errorf("after I/O under pressure the daemon holds %d descriptors, want at most %d", got, baseline+n.tcpConns+8)
	}

	// At most one refusal line per kind every 10 seconds, and a summary.
	out := n.Out.String()
	refusals := strings.Count(out, "refused a client API request")
	if max := int(time.Since(start)/(10*time.Second)) + 2; refusals == 0 || refusals > max {
		t.Errorf("%d refusal lines for %d unauthenticated requests in %v, want between 1 and %d", refusals, fdClients/2, time.Since(start), max)
	}
	if !waitFor(10*time.Second, func() bool { return strings.Contains(n.Out.String(), "connection limit reached") }) {
		t.Errorf("no log line says the TCP listener reached its cap")
	}

	closeAll(conns)
	after := n.settledFDs(t, baseline+layerRootsOfANewAlloc, "after the clients closed their connections")
	t.Logf("descriptors: baseline %d, with %d connections %d, after %d; %d refusal lines", baseline, fdClients, peak, after, refusals)
}

// TestFollowersLeaveTheMountItsFDs: 2,000 authenticated followers of a
// task's log over TCP take no more than the network share: the daemon
// streams to at most its stream cap, refuses more at once with 503, and
// keeps the rest waiting; the mount and `alloc create` still work, and
// once the followers go the daemon is back to the descriptors it had.
func TestFollowersLeaveTheMountItsFDs(t *testing.T) {
	n := startFDNode(t)
	n.mustCLI(t, "alloc", "create", "a0", "--task", "web")
	if err := os.WriteFile(filepath.Join(n.mnt, "a0", "alloc", "logs", "web.stdout.0"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.checkServes(t, "a0", "warmup")
	// One follower first, so that the notifier is in the baseline.
	follow := "GET /v1/client/fs/logs/a0?task=web&type=stdout&follow=true HTTP/1.1\r\nHost: allocfs\r\nX-Nomad-Token: " + apiToken + "\r\n\r\n"
	one := dialAll(t, n.tcp, 1, follow, 1)
	if code := readStatus(t, one[0], time.Now().Add(10*time.Second)); code != 200 {
		t.Fatalf("the first follower: status %d, want 200", code)
	}
	closeAll(one)
	baseline := n.settledFDs(t, n.fds(t), "after the first follower")

	conns := dialAll(t, n.tcp, fdClients, follow, 1)
	// The daemon accepts connections in the order they were made, and
	// answers each follower it accepted at once: 200 and its stream, or
	// 503. The others wait in the kernel's accept queue, unanswered.
	codes := map[int]int{}
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range conns[:n.tcpConns] {
		codes[readStatus(t, c, deadline)]++
	}
	if codes[200] == 0 || codes[200] > n.streams {
		t.Errorf("followers answered 200: %d, want between 1 and the stream cap %d (answers %v)", codes[200], n.streams, codes)
	}
	if codes[503] == 0 {
		t.Errorf("no follower beyond the stream cap was refused with 503 (answers %v)", codes)
	}
	peak := n.fds(t)
	if max := baseline + n.tcpConns + n.streams*n.perStr + 8; peak > max {
		t.Errorf("with %d followers the daemon holds %d descriptors, want at most %d", fdClients, peak, max)
	}
	n.checkServes(t, "a0", "a1")

	closeAll(conns)
	after := n.settledFDs(t, baseline+layerRootsOfANewAlloc, "after the followers left")
	t.Logf("descriptors: baseline %d, with %d followers %d, after %d; answers %v", baseline, fdClients, peak, after, codes)
}

// readStatus returns the status code of the answer that starts on c, or
// 0 when none has come by deadline (a connection still in the daemon's
// accept queue). It reads no further than the status line.
func readStatus(t *testing.T, c net.Conn, deadline time.Time) int {
	t.Helper()
	c.SetReadDeadline(deadline)
	defer c.SetReadDeadline(time.Time{})
	buf := make([]byte, len("HTTP/1.1 200"))
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() && n == 0 {
				return 0
			}
			t.Fatalf("reading a status line: %q, %v", buf[:n], err)
		}
	}
	code, err := strconv.Atoi(string(buf[len("HTTP/1.1 "):]))
	if err != nil {
		t.Fatalf("status line %q: %v", buf, err)
	}
	return code
}
