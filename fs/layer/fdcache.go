package layer

import (
	"sync"

	"golang.org/x/sys/unix"
)

// fdCache keeps open descriptors by key, at most max of them: the core of
// RootCache and DirCache. A descriptor in use is pinned; one that is not
// may be closed to make room (CLOCK: the hand passes over the keys in the
// order they came, sparing once each one used since it last passed). A
// dropped descriptor that is still pinned is closed by its last user.
type fdCache[K comparable] struct {
	mu  sync.Mutex
	max int
	// gen counts the drops (forget): an open that started in an earlier
	// generation is not kept.
	gen  uint64
	fds  map[K]*cachedFd
	hand []K
}

type cachedFd struct {
	fd   int
	pins int
	used bool
	// dead is set on a pinned descriptor that was dropped.
	dead bool
}

func newFdCache[K comparable](size int) fdCache[K] {
	return fdCache[K]{max: max(size, 1), fds: make(map[K]*cachedFd)}
}

// get returns the kept descriptor of key, pinned, and the function that
// gives it back; ok is false when there is none, with the generation an
// open for it starts in.
func (c *fdCache[K]) get(key K) (fd int, release func(), gen uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d, hit := c.fds[key]; hit {
		d.pins++
		d.used = true
		return d.fd, func() { c.unpin(d) }, 0, true
	}
	return -1, nil, c.gen, false
}

// put keeps fd, just opened for key in generation gen, and returns the
// descriptor to use and the function that gives it back: another
// caller's for the same key if it was kept meanwhile (fd is closed), or
// fd alone, closed on release, when the cache moved to another
// generation or is full of pinned descriptors.
func (c *fdCache[K]) put(key K, fd int, gen uint64) (int, func()) {
	alone := func() { unix.Close(fd) }
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return fd, alone
	}
	if d, hit := c.fds[key]; hit {
		unix.Close(fd)
		d.pins++
		d.used = true
		return d.fd, func() { c.unpin(d) }
	}
	if len(c.fds) >= c.max && !c.evictLocked() {
		return fd, alone
	}
	d := &cachedFd{fd: fd, pins: 1, used: true}
	c.fds[key] = d
	c.hand = append(c.hand, key)
	return fd, func() { c.unpin(d) }
}

func (c *fdCache[K]) unpin(d *cachedFd) {
	c.mu.Lock()
	d.pins--
	closing := d.dead && d.pins == 0
	c.mu.Unlock()
	if closing {
		unix.Close(d.fd)
	}
}

// evictLocked closes one unpinned descriptor not used since the hand last
// passed it, and reports whether it found one.
func (c *fdCache[K]) evictLocked() bool {
	for range 2 * len(c.hand) {
		key := c.hand[0]
		c.hand = append(c.hand[1:], key)
		d := c.fds[key]
		if d.pins > 0 {
			continue
		}
		if d.used {
			d.used = false
			continue
		}
		unix.Close(d.fd)
		delete(c.fds, key)
		c.hand = c.hand[:len(c.hand)-1]
		return true
	}
	return false
}

// drop forgets every descriptor, starts a new generation and returns the
// keys of those still pinned (their last users close them); closed is
// told of every descriptor it closes, with the close's error.
func (c *fdCache[K]) drop(closed func(K, error)) []K {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	var pinned []K
	for key, d := range c.fds {
		if d.pins > 0 {
			d.dead = true
			pinned = append(pinned, key)
			continue
		}
		err := unix.Close(d.fd)
		if closed != nil {
			closed(key, err)
		}
	}
	c.fds, c.hand = make(map[K]*cachedFd), nil
	return pinned
}

// len is how many descriptors the cache holds.
func (c *fdCache[K]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fds)
}
