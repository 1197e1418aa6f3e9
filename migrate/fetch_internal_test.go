package migrate

import (
	"testing"
	"time"
)

// TestPaceGuardWindows: each check judges only what arrived since the
// previous one, so an early burst does not cover a later trickle.
func TestPaceGuardWindows(t *testing.T) {
	g := &paceGuard{min: 100, window: time.Minute}
	for i, step := range []struct {
		add      int
		wantGot  int64
		wantSlow bool
	}{
		{add: 5000, wantGot: 5000, wantSlow: false},
		{add: 99, wantGot: 99, wantSlow: true},
		{add: 100, wantGot: 100, wantSlow: false},
		{add: 0, wantGot: 0, wantSlow: true},
	} {
		g.add(step.add)
		got, slow := g.check()
		if got != step.wantGot || slow != step.wantSlow {
			t.Errorf("window %d: got (%d, slow %v), want (%d, slow %v)", i, got, slow, step.wantGot, step.wantSlow)
		}
	}
	// A disabled guard is nil, and safe to feed and stop.
	off := newPaceGuard(0, time.Millisecond, nil)
	off.add(1)
	off.stop()
}
