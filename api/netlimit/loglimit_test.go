package netlimit

import (
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/hashicorp/go-hclog"
)

// TestLogLimiter: one line per kind per interval; the next line after
// some were dropped says how many; kinds do not share a budget.
func TestLogLimiter(t *testing.T) {
	var buf allocdirtest.SyncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true, Level: hclog.Trace})
	clock := &frozenClock{t: time.Unix(1_700_000_000, 0)}
	l := NewLogLimiter(logger, 10*time.Second, clock.now)

	l.Warn("bad_token", "refused", "remote", "a")
	lines := buf.JSONLines(t)
	if len(lines) != 1 || lines[0]["@message"] != "refused" || lines[0]["remote"] != "a" || lines[0]["@level"] != "warn" {
		t.Fatalf("first line: %v, want one warning \"refused\" with remote=a", lines)
	}
	if _, ok := lines[0]["suppressed"]; ok {
		t.Errorf("first line carries a suppressed count: %v", lines[0])
	}

	for i := range 5 {
		clock.advance(time.Second)
		l.Warn("bad_token", "refused", "remote", i)
	}
	// Another kind is written even while bad_token is held back.
	l.Warn("tls_handshake", "handshake failed")
	lines = buf.JSONLines(t)
	if len(lines) != 1 || lines[0]["@message"] != "handshake failed" {
		t.Fatalf("within the interval: %v, want only the other kind's line", lines)
	}

	clock.advance(5 * time.Second) // 10s after the first line
	l.Warn("bad_token", "refused", "remote", "b")
	lines = buf.JSONLines(t)
	if len(lines) != 1 {
		t.Fatalf("after the interval: %d lines, want 1: %v", len(lines), lines)
	}
	if lines[0]["remote"] != "b" || lines[0]["suppressed"] != float64(5) || lines[0]["kind"] != "bad_token" {
		t.Errorf("line after the interval: %v, want remote=b suppressed=5 kind=bad_token", lines[0])
	}

	// The count restarts with each line written.
	clock.advance(10 * time.Second)
	l.Warn("bad_token", "refused", "remote", "c")
	lines = buf.JSONLines(t)
	if len(lines) != 1 {
		t.Fatalf("next interval: %d lines, want 1: %v", len(lines), lines)
	}
	if _, ok := lines[0]["suppressed"]; ok {
		t.Errorf("a line with nothing dropped before it carries a suppressed count: %v", lines[0])
	}
}

// TestLogLimiterConcurrent: many goroutines logging one kind at once
// produce one line, and every other call is counted (run with -race).
func TestLogLimiterConcurrent(t *testing.T) {
	var buf allocdirtest.SyncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Output: &buf, JSONFormat: true})
	clock := &frozenClock{t: time.Unix(1_700_000_000, 0)}
	l := NewLogLimiter(logger, time.Minute, clock.now)
	const n = 200
	done := make(chan struct{})
	for range n {
		go func() {
			l.Warn("over_cap", "full")
			done <- struct{}{}
		}()
	}
	for range n {
		<-done
	}
	if lines := buf.JSONLines(t); len(lines) != 1 {
		t.Fatalf("%d concurrent calls wrote %d lines, want 1", n, len(lines))
	}
	clock.advance(time.Minute)
	l.Warn("over_cap", "full")
	lines := buf.JSONLines(t)
	if len(lines) != 1 || lines[0]["suppressed"] != float64(n-1) {
		t.Errorf("line after the interval: %v, want suppressed=%d", lines, n-1)
	}
}
