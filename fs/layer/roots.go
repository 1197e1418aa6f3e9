package layer

import (
	"errors"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// RootCache keeps O_PATH descriptors of layer roots, the base of every
// fd-relative call, so that an operation does not walk the data dir's
// path to a layer first. It holds at most max descriptors: layers come
// and go with allocations, and a daemon that kept one per layer it ever
// served would run out. A descriptor in use is pinned; one that is not
// may be closed to make room (CLOCK). A layer removed while cached leaves
// a descriptor of a deleted directory, on which every call fails as the
// path would: layer IDs are never reused.
type RootCache struct {
	mu    sync.Mutex
	max   int
	roots map[string]*cachedRoot
	// hand is the CLOCK's order of the cached roots.
	hand []string
}

type cachedRoot struct {
	fd   int
	pins int
	used bool
}

// NewRootCache returns a cache of at most size layer roots (at least 1).
func NewRootCache(size int) *RootCache {
	return &RootCache{max: max(size, 1), roots: make(map[string]*cachedRoot)}
}

// open returns a descriptor of the layer root at path and the function
// that gives it back. With every cached root pinned, the root is opened
// for this caller alone.
func (c *RootCache) open(path string) (int, func(), error) {
	c.mu.Lock()
	if r, ok := c.roots[path]; ok {
		r.pins++
		r.used = true
		c.mu.Unlock()
		return r.fd, func() { c.unpin(r) }, nil
	}
	c.mu.Unlock()
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open layer", Path: path, Err: err}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.roots[path]; ok {
		// Opened by another caller meanwhile.
		unix.Close(fd)
		r.pins++
		r.used = true
		return r.fd, func() { c.unpin(r) }, nil
	}
	if len(c.roots) >= c.max && !c.evictLocked() {
		return fd, func() { unix.Close(fd) }, nil
	}
	r := &cachedRoot{fd: fd, pins: 1, used: true}
	c.roots[path] = r
	c.hand = append(c.hand, path)
	return fd, func() { c.unpin(r) }, nil
}

func (c *RootCache) unpin(r *cachedRoot) {
	c.mu.Lock()
	r.pins--
	c.mu.Unlock()
}

// evictLocked closes one unpinned root not used since the hand last
// passed it, and reports whether it found one.
func (c *RootCache) evictLocked() bool {
	for range 2 * len(c.hand) {
		path := c.hand[0]
		c.hand = append(c.hand[1:], path)
		r := c.roots[path]
		if r.pins > 0 {
			continue
		}
		if r.used {
			r.used = false
			continue
		}
		unix.Close(r.fd)
		delete(c.roots, path)
		c.hand = c.hand[:len(c.hand)-1]
		return true
	}
	return false
}

// Len is how many roots the cache holds open.
func (c *RootCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.roots)
}

// Close closes every cached root. Roots still pinned are an error: an
// operation is running on them.
func (c *RootCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for path, r := range c.roots {
		if r.pins > 0 {
			errs = append(errs, errors.New("layer root "+path+" still in use at close"))
		}
		if err := unix.Close(r.fd); err != nil {
			errs = append(errs, &os.PathError{Op: "close layer", Path: path, Err: err})
		}
	}
	c.roots, c.hand = make(map[string]*cachedRoot), nil
	return errors.Join(errs...)
}
