package main

import (
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
)

// srcID is a UUID whose first group names it in progress lines.
const srcID = "5f0c7a2e-8d1b-4c3a-9e2f-7b6a5d4c3b2a"

// TestProgressETA: known only with a total and a rate.
func TestProgressETA(t *testing.T) {
	t.Parallel()
	p := api.ProgressEvent{Bytes: 25 << 20, Total: 100 << 20, Rate: 25 << 20}
	if d, ok := eta(p); !ok || d != 3*time.Second {
		t.Errorf("got ETA %s %v, want 3s true", d, ok)
	}
	p.Total = -1
	if _, ok := eta(p); ok {
		t.Error("unknown total: got an ETA, want none")
	}
}

// TestProgressPrinterTerminal: one line rewritten in place with \r,
// ended by a newline when the attempt is done.
func TestProgressPrinterTerminal(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	print := newProgressPrinter(&b, true, srcID)
	base := api.ProgressEvent{Attempt: 1, Total: 100 << 20}
	for i := 1; i <= 3; i++ {
		p := base
		p.Bytes = int64(i) * 10 << 20
		p.ElapsedMS = int64(i) * 1000
		p.Rate = 10 << 20
		print(p)
	}
	done := base
	done.Bytes, done.ElapsedMS, done.Rate, done.Done = 100<<20, 10000, 10<<20, true
	print(done)
	out := b.String()
	if n := strings.Count(out, "\r"); n != 4 {
		t.Errorf("got %d carriage returns, want 4 in %q", n, out)
	}
	if n := strings.Count(out, "\n"); n != 1 || !strings.HasSuffix(out, "\n") {
		t.Errorf("got %q, want a single newline at the end", out)
	}
	for _, want := range []string{"5f0c7a2e", "30.0 MiB of 100.0 MiB (30%)", "10.0 MiB/s", "ETA 7s", "100.0 MiB in 10s"} {
		if !strings.Contains(out, want) {
			t.Errorf("got %q, want it to contain %q", out, want)
		}
	}
}

// TestProgressPrinterRetry: a failed attempt's line is closed and the
// next attempt gets its own.
func TestProgressPrinterRetry(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	print := newProgressPrinter(&b, true, srcID)
	print(api.ProgressEvent{Attempt: 1, Bytes: 1 << 20, Total: -1, Rate: 1 << 20})
	print(api.ProgressEvent{Attempt: 1, Bytes: 2 << 20, Total: -1, Done: true, Err: "cut"})
	print(api.ProgressEvent{Attempt: 2, Bytes: 1 << 20, Total: -1, Rate: 1 << 20})
	lines := strings.Split(b.String(), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "interrupted after 2.0 MiB") || !strings.Contains(lines[1], "(attempt 2)") {
		t.Errorf("got lines %q, want the interrupted attempt 1, then attempt 2", lines)
	}
}

// TestProgressPrinterPlain: without a terminal, a line at most every 5 s
// of an attempt, plus the final one.
func TestProgressPrinterPlain(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	print := newProgressPrinter(&b, false, srcID)
	for s := 1; s <= 12; s++ {
		print(api.ProgressEvent{Attempt: 1, Bytes: int64(s) << 20, Total: -1, Rate: 1 << 20, ElapsedMS: int64(s) * 1000})
	}
	print(api.ProgressEvent{Attempt: 1, Bytes: 13 << 20, Total: -1, Rate: 1 << 20, ElapsedMS: 13000, Done: true})
	out := b.String()
	if strings.Contains(out, "\r") {
		t.Errorf("got %q, want no carriage return", out)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines %q, want 3 (5 s, 10 s, done)", len(lines), lines)
	}
	for i, want := range []string{"5.0 MiB, 1.0 MiB/s", "10.0 MiB, 1.0 MiB/s", "13.0 MiB in 13s"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d: got %q, want it to contain %q", i, lines[i], want)
		}
	}
}

// TestProgressPrinterRetryLine: a failed attempt that will be retried
// gets one line of its own, with the error and the wait, on a terminal or
// not.
func TestProgressPrinterRetryLine(t *testing.T) {
	t.Parallel()
	for _, tty := range []bool{true, false} {
		var b strings.Builder
		print := newProgressPrinter(&b, tty, srcID)
		print(api.ProgressEvent{Attempt: 1, Total: -1, Done: true, Err: "connection refused", RetryInMS: 2000})
		print(api.ProgressEvent{Attempt: 2, Total: -1, Done: true, Err: "connection refused", RetryInMS: 4000})
		want := "snapshot of 5f0c7a2e: failed (connection refused); attempt 2 in 2s\n" +
			"snapshot of 5f0c7a2e (attempt 2): failed (connection refused); attempt 3 in 4s\n"
		if got := b.String(); got != want {
			t.Errorf("tty %v: got %q, want %q", tty, got, want)
		}
	}
}
