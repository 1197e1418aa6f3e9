package netlimit

import (
	"sync"
	"time"
)

// patience bounds how long a test waits for something that must happen;
// it decides when to give up, never what passes.
const patience = 10 * time.Second

// frozenClock never moves unless the test moves it.
type frozenClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *frozenClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *frozenClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
