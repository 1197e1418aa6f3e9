package layer

import (
	"errors"
	"os"

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
	c fdCache[string]
}

// NewRootCache returns a cache of at most size layer roots (at least 1).
func NewRootCache(size int) *RootCache {
	return &RootCache{c: newFdCache[string](size)}
}

// open returns a descriptor of the layer root at path and the function
// that gives it back. With every cached root pinned, the root is opened
// for this caller alone.
func (c *RootCache) open(path string) (int, func(), error) {
	fd, release, gen, ok := c.c.get(path)
	if ok {
		return fd, release, nil
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open layer", Path: path, Err: err}
	}
	fd, release = c.c.put(path, fd, gen)
	return fd, release, nil
}

// Len is how many roots the cache holds open.
func (c *RootCache) Len() int { return c.c.len() }

// Close closes every cached root. Roots still pinned are an error: an
// operation is running on them; each is closed when it is given back.
func (c *RootCache) Close() error {
	var errs []error
	pinned := c.c.drop(func(path string, err error) {
		if err != nil {
			errs = append(errs, &os.PathError{Op: "close layer", Path: path, Err: err})
		}
	})
	for _, path := range pinned {
		errs = append(errs, errors.New("layer root "+path+" still in use at close"))
	}
	return errors.Join(errs...)
}
