//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/allocfs/allocfs/migrate"
	"github.com/hashicorp/go-hclog"
)

// patience bounds how long a test waits for something that must happen;
// it decides when to give up, never what passes.
const patience = 10 * time.Second

// lockedBuffer is a log output that servers' goroutines write while the
// test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the JSON log lines written so far and forgets them.
func (l *lockedBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(l.b.String()), "\n") {
		if s == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(s), &m); err != nil {
			t.Fatalf("log line %q: %v", s, err)
		}
		out = append(out, m)
	}
	l.b.Reset()
	return out
}

// frozenClock never moves unless the test moves it.
type frozenClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *frozenClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *frozenClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testGuard is a netGuard on budget b and timeouts to, whose refusals go
// to the returned buffer on a clock the test moves.
func testGuard(t *testing.T, b fdBudget, to serverTimeouts) (*netGuard, *lockedBuffer, *frozenClock) {
	t.Helper()
	out := &lockedBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Output: out, JSONFormat: true})
	g, err := newNetGuard(logger, b)
	if err != nil {
		t.Fatal(err)
	}
	clock := &frozenClock{t: time.Unix(1_700_000_000, 0)}
	g.refusals = netlimit.NewLogLimiter(logger, refusalLogEvery, clock.now)
	g.timeouts = to
	return g, out, clock
}

// serveOn serves srv on a loopback listener capped at conns, and returns
// the listener; cleanup closes the server.
func serveOn(t *testing.T, g *netGuard, srv *http.Server, conns int) *netlimit.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limited, err := g.limitListener(ln, conns, "tcp")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(limited)
	t.Cleanup(func() { srv.Close() })
	return limited.(*netlimit.Listener)
}

// waitEOF reads c until the server closes it; anything else fails.
func waitEOF(t *testing.T, c net.Conn, what string) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(patience))
	if n, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("%s: %v after %d bytes; want the server to close the connection", what, err, n)
	}
}

// waitOpen waits until l has want connections open.
func waitOpen(t *testing.T, l *netlimit.Listener, want int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for l.Open() != want {
		if time.Now().After(deadline) {
			t.Fatalf("open connections: %d, want %d", l.Open(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServerClosesIdle: a keep-alive connection
// that has had its answer is closed after the idle timeout, one that never
// sends a request after the header timeout, and both give their slot back.
func TestServerClosesIdle(t *testing.T) {
	g, _, _ := testGuard(t, fdBudget{Streams: 4}, serverTimeouts{readHeader: 200 * time.Millisecond, read: time.Minute, idle: 200 * time.Millisecond})
	srv := g.httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), "tcp")
	l := serveOn(t, g, srv, 4)

	keepAlive, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer keepAlive.Close()
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	io.WriteString(keepAlive, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(keepAlive)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "ok" || resp.Close {
		t.Fatalf("answer: %d %q close=%v, want a kept-alive 200 ok", resp.StatusCode, body, resp.Close)
	}
	waitEOF(t, keepAlive, "idle keep-alive connection")
	waitEOF(t, silent, "connection that never sent a request")
	waitOpen(t, l, 0)
}

// TestServerStreamOutlivesReadTimeout: a request whose answer takes longer
// than the read timeout (a follower, a snapshot) is answered whole, and its
// context is not cancelled; a request whose body does not arrive within
// the read timeout still fails to read it.
func TestServerStreamOutlivesReadTimeout(t *testing.T) {
	const read = 200 * time.Millisecond
	g, _, _ := testGuard(t, fdBudget{Streams: 4}, serverTimeouts{readHeader: read, read: read, idle: time.Minute})
	ctxErr := make(chan error, 1)
	bodyErr := make(chan error, 1)
	srv := g.httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			_, err := io.ReadAll(r.Body)
			bodyErr <- err
			return
		}
		io.WriteString(w, "start,")
		http.NewResponseController(w).Flush()
		// Past the read deadline, as a follower would be.
		time.Sleep(5 * read)
		ctxErr <- r.Context().Err()
		io.WriteString(w, "end")
	}), "tcp")
	l := serveOn(t, g, srv, 4)

	resp, err := http.Get("http://" + l.Addr().String() + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "start,end" {
		t.Errorf("long answer: %q, %v; want \"start,end\"", body, err)
	}
	if err := <-ctxErr; err != nil {
		t.Errorf("request context after the read timeout: %v, want not cancelled", err)
	}

	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
	select {
	case err := <-bodyErr:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("reading a body that stops: %v, want a timeout", err)
		}
	case <-time.After(patience):
		t.Fatal("a body that stopped arriving was read for longer than the read timeout")
	}
}

// TestLimitStreams: the control socket's handler runs at most Streams
// requests of the file-system API at once, answers the next 503, and lets
// every other request through meanwhile.
func TestLimitStreams(t *testing.T) {
	g, logs, _ := testGuard(t, fdBudget{Streams: 1}, defaultTimeouts)
	entered := make(chan struct{})
	release := make(chan struct{})
	h := g.limitStreams(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/client/fs/logs/a1" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}), false)
	done := make(chan int)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/client/fs/logs/a1", nil))
		done <- w.Code
	}()
	<-entered
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/client/fs/stream/a1", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("second stream: %d, want 503", w.Code)
	}
	for _, path := range []string{"/v1/allocs", "/v1/status", "/v1/client/gc"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusOK {
			t.Errorf("%s while the stream slot is taken: %d, want 200", path, w.Code)
		}
	}
	close(release)
	if code := <-done; code != http.StatusOK {
		t.Errorf("first stream: %d, want 200", code)
	}
	lines := logs.lines(t)
	if len(lines) != 1 || lines[0]["path"] != "/v1/client/fs/stream/a1" {
		t.Errorf("log: %v, want one line for the refused stream", lines)
	}

	// The snapshot handler is gated whole, whatever the path, and shares
	// the cap with the file-system API.
	release2 := make(chan struct{})
	snapshots := g.limitStreams(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release2
	}), true)
	go func() {
		w := httptest.NewRecorder()
		snapshots.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/client/allocation/a1/snapshot", nil))
		done <- w.Code
	}()
	<-entered
	w = httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/client/fs/ls/a1", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("file-system API while a snapshot holds the slot: %d, want 503", w.Code)
	}
	close(release2)
	if code := <-done; code != http.StatusOK {
		t.Errorf("snapshot: %d, want 200", code)
	}
}

// TestNodeHandlerRefusalsRateLimited: requests with a bad or missing
// token are answered 403 without reaching the API or the snapshot
// handler, and are logged once per kind per interval, with the count of
// those left out on the next line.
func TestNodeHandlerRefusalsRateLimited(t *testing.T) {
	g, logs, clock := testGuard(t, fdBudget{Streams: 4}, defaultTimeouts)
	secret := migrate.NodeSecretToken("node-secret")
	// The routes follow the flags; the tokens are what the files held.
	cfg := nodeConfig{apiTokenFile: "token", nodeSecretFile: "secret"}
	var secrets atomic.Pointer[nodeSecrets]
	secrets.Store(&nodeSecrets{apiToken: "api-token", migrateTokens: secret})
	var reached []string
	next := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached = append(reached, name+" "+r.URL.Path)
			io.WriteString(w, "ok")
		})
	}
	h := nodeHandler(g.refusals, cfg, &secrets, next("snapshot"), next("client"), next("metrics"))
	do := func(path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if token != "" {
			r.Header.Set("X-Nomad-Token", token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	const n = 50
	for i := range n {
		token := []string{"", "wrong"}[i%2]
		if w := do("/v1/client/fs/ls/a1", token); w.Code != http.StatusForbidden || w.Body.String() != "Permission denied" {
			t.Fatalf("client API with token %q: %d %q, want 403 Permission denied", token, w.Code, w.Body)
		}
		// A token for another allocation is no token for this one.
		token = []string{"", "wrong", secret.Derive("other")}[i%3]
		if w := do("/v1/client/allocation/a1/snapshot", token); w.Code != http.StatusForbidden {
			t.Fatalf("snapshot with token %q: %d %q, want 403", token, w.Code, w.Body)
		}
	}
	if len(reached) != 0 {
		t.Fatalf("refused requests reached the handlers: %v", reached)
	}
	lines := logs.lines(t)
	if len(lines) != 2 {
		t.Fatalf("%d refusals of each kind wrote %d lines, want 2: %v", n, len(lines), lines)
	}
	clock.advance(refusalLogEvery)
	do("/v1/client/fs/ls/a1", "")
	do("/v1/client/allocation/a1/snapshot", "")
	lines = logs.lines(t)
	if len(lines) != 2 {
		t.Fatalf("after the interval: %d lines, want 2: %v", len(lines), lines)
	}
	for _, l := range lines {
		if l["suppressed"] != float64(n-1) {
			t.Errorf("line after the interval: %v, want suppressed=%d", l, n-1)
		}
	}

	if w := do("/v1/client/fs/ls/a1", "api-token"); w.Code != http.StatusOK {
		t.Errorf("client API with the token: %d, want 200", w.Code)
	}
	if w := do("/v1/client/allocation/a1/snapshot", secret.Derive("a1")); w.Code != http.StatusOK {
		t.Errorf("snapshot with the allocation's token: %d, want 200", w.Code)
	}
	for _, path := range []string{"/v1/metrics", "/v1/allocations", "/v1/agent/health"} {
		for _, token := range []string{"", "wrong", secret.Derive("a1")} {
			if w := do(path, token); w.Code != http.StatusForbidden {
				t.Errorf("%s with token %q: %d, want 403", path, token, w.Code)
			}
		}
		if w := do(path, "api-token"); w.Code != http.StatusOK {
			t.Errorf("%s with the API token: %d, want 200", path, w.Code)
		}
	}
	if w := do("/v1/allocs", "api-token"); w.Code != http.StatusNotFound {
		t.Errorf("the control API on TCP, with the API token: %d, want 404", w.Code)
	}
	if want := []string{"client /v1/client/fs/ls/a1", "snapshot /v1/client/allocation/a1/snapshot", "metrics /v1/metrics", "client /v1/allocations", "client /v1/agent/health"}; strings.Join(reached, ",") != strings.Join(want, ",") {
		t.Errorf("admitted requests reached %v, want %v", reached, want)
	}
}

// TestNodeHandlerMetricsNeedTheAPIToken: without --token-file the TCP
// listener serves no metrics at all, whatever the token; the snapshot
// token, which other nodes hold, never admits them.
func TestNodeHandlerMetricsNeedTheAPIToken(t *testing.T) {
	g, _, _ := testGuard(t, fdBudget{Streams: 4}, defaultTimeouts)
	var secrets atomic.Pointer[nodeSecrets]
	secrets.Store(&nodeSecrets{migrateTokens: migrate.SharedToken("migrate-token")})
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	h := nodeHandler(g.refusals, nodeConfig{migrateTokenFile: "token"}, &secrets, ok, ok, ok)
	r := httptest.NewRequest(http.MethodGet, "/v1/metrics", nil)
	r.Header.Set("X-Nomad-Token", "migrate-token")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotFound {
		t.Errorf("metrics on a listener without --token-file: %d, want 404", w.Code)
	}
}

// TestServerTLSErrorsRateLimited: failed TLS handshakes, which anyone
// who can connect causes, are logged once per interval.
func TestServerTLSErrorsRateLimited(t *testing.T) {
	g, logs, _ := testGuard(t, fdBudget{Streams: 4}, defaultTimeouts)
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = g.httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), "tcp")
	ts.StartTLS()
	defer ts.Close()
	addr := ts.Listener.Addr().String()
	const n = 20
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "garbage, not a TLS record\r\n\r\n")
		// The server logs before it closes the connection.
		waitEOF(t, c, "connection with a bad handshake")
		c.Close()
	}
	lines := logs.lines(t)
	if len(lines) != 1 {
		t.Fatalf("%d failed handshakes wrote %d lines, want 1: %v", n, len(lines), lines)
	}
	if lines[0]["@message"] != "refused a TLS handshake" || !strings.Contains(lines[0]["detail"].(string), "TLS handshake error") {
		t.Errorf("log line %v, want the TLS handshake refusal", lines[0])
	}
}
