package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/allocfs/allocfs/api"
)

// plainInterval is how often the non-terminal printer writes a line.
const plainInterval = 5 * time.Second

// newProgressPrinter returns what renders the progress events of a fetch
// of allocation allocID, as the daemon streams them, to w. On
// a terminal it keeps one line up to date (rewritten with \r) with the
// bytes received, the rate and, when the size is known, the ETA;
// otherwise (a log file, journald) it writes a plain line at most every
// 5 s of an attempt. Either way the end of each attempt gets its own
// line.
func newProgressPrinter(w io.Writer, isTerminal bool, allocID string) func(api.ProgressEvent) {
	p := &printer{w: w, tty: isTerminal, allocID: allocID}
	return p.print
}

type printer struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	allocID string
	// attempt is the attempt of the last report.
	attempt int
	// width is the length of the terminal line being rewritten, 0 when
	// none is open.
	width int
	// printed is the Elapsed of the last plain line of this attempt.
	printed time.Duration
}

func (p *printer) print(pr api.ProgressEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	newAttempt := pr.Attempt != p.attempt
	p.attempt = pr.Attempt
	line := formatProgress(p.allocID, pr)
	if pr.RetryInMS > 0 {
		// Its own line, terminal or not: the attempt is over.
		if p.tty && p.width > 0 {
			fmt.Fprintln(p.w)
			p.width = 0
		}
		fmt.Fprintln(p.w, line)
		return
	}
	if p.tty {
		if newAttempt && p.width > 0 {
			fmt.Fprintln(p.w)
			p.width = 0
		}
		pad := max(p.width-len(line), 0)
		fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
		p.width = len(line)
		if pr.Done {
			fmt.Fprintln(p.w)
			p.width = 0
		}
		return
	}
	if newAttempt {
		p.printed = 0
	}
	elapsed := time.Duration(pr.ElapsedMS) * time.Millisecond
	if !pr.Done && elapsed-p.printed < plainInterval {
		return
	}
	p.printed = elapsed
	fmt.Fprintln(p.w, line)
}

func formatProgress(allocID string, p api.ProgressEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapshot of %s", shortID(allocID))
	if p.Attempt > 1 {
		fmt.Fprintf(&b, " (attempt %d)", p.Attempt)
	}
	b.WriteString(": ")
	switch {
	case p.RetryInMS > 0:
		fmt.Fprintf(&b, "failed (%s); attempt %d in %s", p.Err, p.Attempt+1, time.Duration(p.RetryInMS)*time.Millisecond)
		return b.String()
	case p.Done && p.Err != "":
		fmt.Fprintf(&b, "interrupted after %s", formatBytes(p.Bytes))
		return b.String()
	case p.Done:
		fmt.Fprintf(&b, "%s in %s (%s/s)", formatBytes(p.Bytes), (time.Duration(p.ElapsedMS) * time.Millisecond).Round(100*time.Millisecond), formatBytes(int64(p.Rate)))
		return b.String()
	}
	b.WriteString(formatBytes(p.Bytes))
	if p.Total >= 0 {
		pct := 100.0
		if p.Total > 0 {
			pct = float64(p.Bytes) * 100 / float64(p.Total)
		}
		fmt.Fprintf(&b, " of %s (%.0f%%)", formatBytes(p.Total), pct)
	}
	fmt.Fprintf(&b, ", %s/s", formatBytes(int64(p.Rate)))
	if left, ok := eta(p); ok {
		fmt.Fprintf(&b, ", ETA %s", left.Round(time.Second))
	}
	return b.String()
}

// eta estimates the time left of a fetch; ok is false when the total is
// unknown or nothing has arrived yet.
func eta(p api.ProgressEvent) (d time.Duration, ok bool) {
	if p.Total < 0 || p.Rate <= 0 {
		return 0, false
	}
	left := max(p.Total-p.Bytes, 0)
	return time.Duration(float64(left) / p.Rate * float64(time.Second)), true
}

// shortID keeps a UUID's first group, which is how people name
// allocations in conversation and in Nomad's CLI.
func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
