package netlimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/hashicorp/go-hclog"
)

// testGuard is a Guard on budget b and timeouts to, whose refusals go
// to the returned buffer on a clock the test moves.
func testGuard(t *testing.T, b Budget, to Timeouts) (*Guard, *allocdirtest.SyncBuffer, *frozenClock) {
	t.Helper()
	out := &allocdirtest.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Output: out, JSONFormat: true})
	g, err := NewGuard(logger, b)
	if err != nil {
		t.Fatal(err)
	}
	clock := &frozenClock{t: time.Unix(1_700_000_000, 0)}
	g.refusals = NewLogLimiter(logger, refusalLogEvery, clock.now)
	g.timeouts = to
	return g, out, clock
}

// serveOn serves srv on a loopback listener capped at conns, and returns
// the listener; cleanup closes the server.
func serveOn(t *testing.T, g *Guard, srv *http.Server, conns int) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limited, err := g.LimitListener(ln, conns, "tcp")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(limited)
	t.Cleanup(func() { srv.Close() })
	return limited.(*Listener)
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
func waitOpen(t *testing.T, l *Listener, want int) {
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
	g, _, _ := testGuard(t, Budget{Streams: 4}, Timeouts{ReadHeader: 200 * time.Millisecond, Read: time.Minute, Idle: 200 * time.Millisecond})
	srv := g.HTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }), "tcp")
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
	g, _, _ := testGuard(t, Budget{Streams: 4}, Timeouts{ReadHeader: read, Read: read, Idle: time.Minute})
	ctxErr := make(chan error, 1)
	bodyErr := make(chan error, 1)
	srv := g.HTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	g, logs, _ := testGuard(t, Budget{Streams: 1}, DefaultTimeouts)
	entered := make(chan struct{})
	release := make(chan struct{})
	h := g.LimitStreams(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/client/fs/logs/a1" {
			entered <- struct{}{}
			<-release
		}
		io.WriteString(w, "ok")
	}), "/v1/client/fs/")
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
	lines := logs.JSONLines(t)
	if len(lines) != 1 || lines[0]["path"] != "/v1/client/fs/stream/a1" {
		t.Errorf("log: %v, want one line for the refused stream", lines)
	}

	// The snapshot handler is gated whole, whatever the path, and shares
	// the cap with the file-system API.
	release2 := make(chan struct{})
	snapshots := g.LimitStreams(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release2
	}), "")
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

// TestServerTLSErrorsRateLimited: failed TLS handshakes, which anyone
// who can connect causes, are logged once per interval.
func TestServerTLSErrorsRateLimited(t *testing.T) {
	g, logs, _ := testGuard(t, Budget{Streams: 4}, DefaultTimeouts)
	ts := httptest.NewUnstartedServer(nil)
	ts.Config = g.HTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), "tcp")
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
	lines := logs.JSONLines(t)
	if len(lines) != 1 {
		t.Fatalf("%d failed handshakes wrote %d lines, want 1: %v", n, len(lines), lines)
	}
	if lines[0]["@message"] != "refused a TLS handshake" || !strings.Contains(lines[0]["detail"].(string), "TLS handshake error") {
		t.Errorf("log line %v, want the TLS handshake refusal", lines[0])
	}
}
