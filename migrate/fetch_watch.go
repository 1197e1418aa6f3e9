package migrate

import (
	"context"
	"fmt"
	"hash"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Watching a transfer while it runs: the meter every byte passes through,
// the watchdog that ends a stalled one, the guard that ends one too slow
// to finish.

// meter sits between the response body and the extractor: it hashes and
// counts every byte, feeds the stall watchdog and the progress callback,
// and records how the body ended.
type meter struct {
	r    io.Reader
	hash hash.Hash
	n    int64
	// err is the body's first error other than io.EOF; eof is set once
	// the body ended cleanly.
	err error
	eof bool
	// zeros counts the zero bytes at the end of what was read so far.
	zeros int64

	wd       *watchdog
	pace     *paceGuard
	progress func(Progress)
	base     Progress
	start    time.Time
	last     time.Time
}

func (m *meter) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	if n > 0 {
		b := p[:n]
		m.hash.Write(b)
		m.n += int64(n)
		if i := lastNonZero(b); i < 0 {
			m.zeros += int64(n)
		} else {
			m.zeros = int64(n - 1 - i)
		}
		m.wd.touch()
		m.pace.add(n)
		if m.progress != nil {
			if now := time.Now(); now.Sub(m.last) >= progressInterval {
				m.last = now
				m.progress(m.report(now))
			}
		}
	}
	switch {
	case err == io.EOF:
		m.eof = true
	case err != nil && m.err == nil:
		m.err = err
	}
	return n, err
}

func lastNonZero(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] != 0 {
			return i
		}
	}
	return -1
}

// endsWithTrailer reports whether the body ended on tar's end-of-archive
// marker (two zero blocks, on a block boundary).
func (m *meter) endsWithTrailer() bool {
	return m.zeros >= tarTrailerSize && m.n%512 == 0
}

func (m *meter) report(now time.Time) Progress {
	p := m.base
	p.Bytes = m.n
	p.Elapsed = now.Sub(m.start)
	if s := p.Elapsed.Seconds(); s > 0 {
		p.Rate = float64(m.n) / s
	}
	return p
}

// done sends the attempt's last report.
func (m *meter) done(err error) {
	if m.progress == nil {
		return
	}
	p := m.report(time.Now())
	p.Done = true
	p.Err = err
	m.progress(p)
}

// watchdog cancels an attempt that received nothing for timeout. Reads
// only store a timestamp; the timer re-arms itself for what is left.
type watchdog struct {
	timeout time.Duration
	base    time.Time
	last    atomic.Int64 // nanoseconds since base of the last activity
	cancel  context.CancelCauseFunc

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

// newWatchdog returns nil (a watchdog that does nothing) for a timeout
// that is not positive.
func newWatchdog(timeout time.Duration, cancel context.CancelCauseFunc) *watchdog {
	if timeout <= 0 {
		return nil
	}
	w := &watchdog{timeout: timeout, base: time.Now(), cancel: cancel}
	w.mu.Lock()
	w.timer = time.AfterFunc(timeout, w.fire)
	w.mu.Unlock()
	return w
}

func (w *watchdog) touch() {
	if w != nil {
		w.last.Store(int64(time.Since(w.base)))
	}
}

func (w *watchdog) fire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	idle := time.Since(w.base) - time.Duration(w.last.Load())
	if idle >= w.timeout {
		w.cancel(errStalled)
		return
	}
	w.timer.Reset(w.timeout - idle)
}

func (w *watchdog) stop() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.stopped = true
	w.timer.Stop()
	w.mu.Unlock()
}

// paceGuard cancels an attempt whose body brings fewer than min bytes in
// a window. Reads only add to a counter; the timer checks it once per
// window.
type paceGuard struct {
	min    int64
	window time.Duration
	n      atomic.Int64
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	timer   *time.Timer
	last    int64 // n at the previous check
	stopped bool
}

// newPaceGuard returns nil (a guard that does nothing) for a minBytes that is
// not positive.
func newPaceGuard(minBytes int64, window time.Duration, cancel context.CancelCauseFunc) *paceGuard {
	if minBytes <= 0 {
		return nil
	}
	g := &paceGuard{min: minBytes, window: window, cancel: cancel}
	g.mu.Lock()
	g.timer = time.AfterFunc(window, g.fire)
	g.mu.Unlock()
	return g
}

func (g *paceGuard) add(n int) {
	if g != nil {
		g.n.Add(int64(n))
	}
}

// check closes a window: it reports the bytes the window brought and
// whether that is too few.
func (g *paceGuard) check() (int64, bool) {
	total := g.n.Load()
	got := total - g.last
	g.last = total
	return got, got < g.min
}

func (g *paceGuard) fire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return
	}
	if got, slow := g.check(); slow {
		g.cancel(fmt.Errorf("%w: %d bytes in %s, want at least %d", ErrTooSlow, got, g.window, g.min))
		return
	}
	g.timer.Reset(g.window)
}

func (g *paceGuard) stop() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.stopped = true
	g.timer.Stop()
	g.mu.Unlock()
}
