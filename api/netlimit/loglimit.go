package netlimit

import (
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

// LogLimiter writes warnings that clients can trigger at will, at most one
// per kind per interval; see NewLogLimiter. All methods are safe for
// concurrent use.
type LogLimiter struct {
	logger hclog.Logger
	every  time.Duration
	now    func() time.Time

	mu    sync.Mutex
	kinds map[string]*kindState
}

type kindState struct {
	last       time.Time // when the last line of this kind was written
	suppressed int       // lines dropped since then
}

// NewLogLimiter returns a limiter that writes to logger at most one line
// per kind every interval. now is the clock (time.Now when nil).
func NewLogLimiter(logger hclog.Logger, every time.Duration, now func() time.Time) *LogLimiter {
	if now == nil {
		now = time.Now
	}
	return &LogLimiter{logger: logger, every: every, now: now, kinds: make(map[string]*kindState)}
}

// Warn writes msg with args at warning level, unless a line of the same
// kind was written less than an interval ago: then it only counts it. A
// line written after some were dropped carries "suppressed", their number,
// and "kind". Kinds are few and fixed by the caller (never taken from a
// request), so their table stays small.
func (l *LogLimiter) Warn(kind, msg string, args ...any) {
	now := l.now()
	l.mu.Lock()
	st := l.kinds[kind]
	if st == nil {
		st = &kindState{}
		l.kinds[kind] = st
	} else if now.Sub(st.last) < l.every {
		st.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "kind", kind, "suppressed", suppressed)
	}
	l.logger.Warn(msg, args...)
}
