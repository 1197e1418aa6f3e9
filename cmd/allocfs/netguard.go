//go:build linux

package main

import (
	"errors"
	"log"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/allocfs/allocfs/api/fsapi"
	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/hashicorp/go-hclog"
)

// refusalLogEvery is how often each kind of refusal may be logged.
const refusalLogEvery = 10 * time.Second

// serverTimeouts are the timeouts of serve's HTTP servers. A connection
// that sends nothing is closed after readHeader (the TLS handshake
// included); one that waits between requests, after idle; read bounds
// reading a whole request, body included. It does not bound the answer:
// net/http lifts the read deadline once the request is read (the read
// that watches for the client going away starts with none), so it never
// cuts a follower or a snapshot; TestServerStreamOutlivesReadTimeout
// holds net/http to that.
type serverTimeouts struct {
	readHeader, read, idle time.Duration
}

var defaultTimeouts = serverTimeouts{readHeader: 10 * time.Second, read: 30 * time.Second, idle: 60 * time.Second}

// netGuard holds serve's listeners and requests to the descriptor budget
// and writes the log lines of what it refuses at a bounded rate.
type netGuard struct {
	budget   fdBudget
	timeouts serverTimeouts
	refusals *netlimit.LogLimiter
	// streams caps the client-API and snapshot requests of both listeners
	// together.
	streams *netlimit.Gate
}

func newNetGuard(logger hclog.Logger, budget fdBudget) (*netGuard, error) {
	streams, err := netlimit.NewGate(budget.Streams)
	if err != nil {
		return nil, err
	}
	return &netGuard{
		budget:   budget,
		timeouts: defaultTimeouts,
		refusals: netlimit.NewLogLimiter(logger.Named("refused"), refusalLogEvery, nil),
		streams:  streams,
	}, nil
}

// limitListener caps ln at max open connections; name says which
// listener it is in the log. On failure it closes ln.
func (g *netGuard) limitListener(ln net.Listener, max int, name string) (net.Listener, error) {
	addr := ln.Addr().String()
	l, err := netlimit.NewListener(ln, max, func() {
		g.refusals.Warn("conns/"+name, "connection limit reached: new connections wait in the kernel's accept queue",
			"listener", name, "addr", addr, "limit", max)
	})
	if err != nil {
		return nil, errors.Join(err, ln.Close())
	}
	return l, nil
}

// limitStreams runs next under the stream cap: all of its requests when
// all is set (the snapshot handler), else those of the file-system API.
func (g *netGuard) limitStreams(next http.Handler, all bool) http.Handler {
	gated := g.streams.Handler(next, func(r *http.Request) {
		g.refusals.Warn("streams", "too many streams in progress: refused a request",
			"limit", g.streams.Cap(), "remote", r.RemoteAddr, "path", r.URL.Path)
	})
	if all {
		return gated
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, fsapi.Prefix) {
			gated.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// errorLog is the ErrorLog of an HTTP server: net/http writes a line there
// for every failed TLS handshake and failed accept, which any client can
// cause, so every line goes through the rate limit, by kind.
func (g *netGuard) errorLog(name string) *log.Logger {
	return log.New(httpErrorWriter{refusals: g.refusals, listener: name}, "", 0)
}

type httpErrorWriter struct {
	refusals *netlimit.LogLimiter
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

// httpServer returns the HTTP server of the listener called name, with
// the timeouts and the rate-limited error log.
func (g *netGuard) httpServer(handler http.Handler, name string) *http.Server {
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: g.timeouts.readHeader,
		ReadTimeout:       g.timeouts.read,
		IdleTimeout:       g.timeouts.idle,
		ErrorLog:          g.errorLog(name),
	}
}
