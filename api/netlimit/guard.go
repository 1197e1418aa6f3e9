package netlimit

import (
	"errors"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
)

// refusalLogEvery is how often each kind of refusal may be logged.
const refusalLogEvery = 10 * time.Second

// Timeouts are the timeouts of a Guard's HTTP servers. A connection
// that sends nothing is closed after ReadHeader (the TLS handshake
// included); one that waits between requests, after Idle; Read bounds
// reading a whole request, body included. It does not bound the answer:
// net/http lifts the read deadline once the request is read (the read
// that watches for the client going away starts with none), so it never
// cuts a follower or a snapshot; TestServerStreamOutlivesReadTimeout
// holds net/http to that.
type Timeouts struct {
	ReadHeader, Read, Idle time.Duration
}

// DefaultTimeouts are a daemon's: long enough for a client on a slow
// link, short enough that idle connections give their descriptors back.
var DefaultTimeouts = Timeouts{ReadHeader: 10 * time.Second, Read: 30 * time.Second, Idle: 60 * time.Second}

// Guard holds a daemon's listeners and requests to its descriptor budget
// and writes the log lines of what it refuses at a bounded rate, through
// one LogLimiter that the daemon's other refusals (bad tokens) share.
type Guard struct {
	timeouts Timeouts
	refusals *LogLimiter
	// streams caps the client-API and snapshot requests of both listeners
	// together.
	streams *Gate
}

// NewGuard returns the guard of budget; its refusals are logged by a
// logger named "refused".
func NewGuard(logger hclog.Logger, budget Budget) (*Guard, error) {
	streams, err := NewGate(budget.Streams)
	if err != nil {
		return nil, err
	}
	return &Guard{
		timeouts: DefaultTimeouts,
		refusals: NewLogLimiter(logger.Named("refused"), refusalLogEvery, nil),
		streams:  streams,
	}, nil
}

// Refusals is the rate-limited log of what the guard, and whatever the
// caller adds to it, refuses.
func (g *Guard) Refusals() *LogLimiter { return g.refusals }

// LimitListener caps ln at max open connections; name says which
// listener it is in the log. On failure it closes ln.
func (g *Guard) LimitListener(ln net.Listener, max int, name string) (net.Listener, error) {
	addr := ln.Addr().String()
	l, err := NewListener(ln, max, func() {
		g.refusals.Warn("conns/"+name, "connection limit reached: new connections wait in the kernel's accept queue",
			"listener", name, "addr", addr, "limit", max)
	})
	if err != nil {
		return nil, errors.Join(err, ln.Close())
	}
	return l, nil
}

// LimitStreams runs next under the stream cap: those of its requests
// whose path starts with prefix (the file-system API's), or all of them
// for an empty prefix (a snapshot handler).
func (g *Guard) LimitStreams(next http.Handler, prefix string) http.Handler {
	gated := g.streams.Handler(next, func(r *http.Request) {
		g.refusals.Warn("streams", "too many streams in progress: refused a request",
			"limit", g.streams.Cap(), "remote", r.RemoteAddr, "path", r.URL.Path)
	})
	if prefix == "" {
		return gated
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, prefix) {
			gated.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// errorLog is the ErrorLog of an HTTP server: net/http writes a line there
// for every failed TLS handshake and failed accept, which any client can
// cause, so every line goes through the rate limit, by kind.
func (g *Guard) errorLog(name string) *log.Logger {
	return log.New(httpErrorWriter{refusals: g.refusals, listener: name}, "", 0)
}

type httpErrorWriter struct {
	refusals *LogLimiter
	listener string
}

func (h httpErrorWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	kind, msg := "http", "http server error"
	switch {
	case strings.HasPrefix(line, "http: TLS handshake error"):
		kind, msg = "tls", "refused a TLS handshake"
	case strings.HasPrefix(line, "http: Accept error"):
		kind, msg = "accept", "failed to accept a connection"
	case strings.HasPrefix(line, "http2:"):
		kind = "http2"
	}
	h.refusals.Warn(kind+"/"+h.listener, msg, "listener", h.listener, "detail", line)
	return len(p), nil
}

// HTTPServer returns the HTTP server of the listener called name, with
// the timeouts and the rate-limited error log.
func (g *Guard) HTTPServer(handler http.Handler, name string) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: g.timeouts.ReadHeader,
		ReadTimeout:       g.timeouts.Read,
		IdleTimeout:       g.timeouts.Idle,
		ErrorLog:          g.errorLog(name),
	}
}
