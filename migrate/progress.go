package migrate

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress reports one attempt of a Fetch.
type Progress struct {
	// AllocID is the allocation being fetched.
	AllocID string
	// Attempt counts from 1; Bytes, Elapsed and Rate restart with it.
	Attempt int
	// Bytes is how much of the tar stream was received.
	Bytes int64
	// Total is the stream's size from Content-Length, or -1 when the
	// source did not say (allocfs sources never do: they stream).
	Total int64
	// Rate is the average since the attempt started, in bytes per second.
	Rate float64
	// Elapsed is the time since the attempt's response arrived.
	Elapsed time.Duration
	// Done marks the attempt's last report; Err is then its error, nil
	// when the snapshot was received.
	Done bool
	Err  error
}

// ETA estimates the time left; ok is false when Total is unknown or
// nothing has arrived yet.
func (p Progress) ETA() (d time.Duration, ok bool) {
	if p.Total < 0 || p.Rate <= 0 {
		return 0, false
	}
	left := max(p.Total-p.Bytes, 0)
	return time.Duration(float64(left) / p.Rate * float64(time.Second)), true
}

// plainInterval is how often the non-terminal printer writes a line.
const plainInterval = 5 * time.Second

// NewProgressPrinter returns a FetchOptions.Progress that writes to w. On
// a terminal it keeps one line up to date (rewritten with \r) with the
// bytes received, the rate and, when the size is known, the ETA;
// otherwise (a log file, journald) it writes a plain line at most every
// 5 s of an attempt. Either way the end of each attempt gets its own
// line.
func NewProgressPrinter(w io.Writer, isTerminal bool) func(Progress) {
	p := &printer{w: w, tty: isTerminal}
	return p.print
}

type printer struct {
	mu  sync.Mutex
	w   io.Writer
	tty bool
	// attempt is the attempt of the last report.
	attempt int
	// width is the length of the terminal line being rewritten, 0 when
	// none is open.
	width int
	// printed is the Elapsed of the last plain line of this attempt.
	printed time.Duration
}

func (p *printer) print(pr Progress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	newAttempt := pr.Attempt != p.attempt
	p.attempt = pr.Attempt
	line := formatProgress(pr)
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
	if !pr.Done && pr.Elapsed-p.printed < plainInterval {
		return
	}
	p.printed = pr.Elapsed
	fmt.Fprintln(p.w, line)
}

func formatProgress(p Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "snapshot of %s", shortID(p.AllocID))
	if p.Attempt > 1 {
		fmt.Fprintf(&b, " (attempt %d)", p.Attempt)
	}
	b.WriteString(": ")
	switch {
	case p.Done && p.Err != nil:
		fmt.Fprintf(&b, "interrupted after %s", formatBytes(p.Bytes))
		return b.String()
	case p.Done:
		fmt.Fprintf(&b, "%s in %s (%s/s)", formatBytes(p.Bytes), p.Elapsed.Round(100*time.Millisecond), formatBytes(int64(p.Rate)))
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
	if eta, ok := p.ETA(); ok {
		fmt.Fprintf(&b, ", ETA %s", eta.Round(time.Second))
	}
	return b.String()
}

// shortID keeps a UUID's first group, which is how people name
// allocations in conversation and in Nomad's CLI.
func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

// formatBytes prints n in binary units with one decimal.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		v /= unit
		if v < unit || u == "TiB" {
			return fmt.Sprintf("%.1f %s", v, u)
		}
	}
	return fmt.Sprintf("%d B", n)
}
