package layer

import (
	"errors"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// DirCache keeps O_PATH descriptors of directories inside layers, by
// layer root and path, so that an operation on an entry of a
// subdirectory (every lookup, create, getattr or getxattr below a volume's
// top) does not open and close its directory around one call: that pair
// was two of the three system calls of a cold lookup.
//
// A descriptor names the directory that was at its path when it was
// opened. What moves or removes a directory of a layer therefore calls
// Forget: a rename or an rmdir through the mount, and any change of an
// allocation's layers. An open that started before a Forget is not
// cached (each Forget starts a new generation): it may have found the
// directory that has just moved. Lower layers never change while in use,
// so their directories stay until evicted.
//
// The cache holds at most max descriptors. One in use is pinned; one
// that is not may be closed to make room (CLOCK), and a Forget closes
// the pinned ones once their users are done with them.
type DirCache struct {
	mu   sync.Mutex
	max  int
	gen  uint64
	dirs map[dirKey]*cachedDir
	// hand is the CLOCK's order of the cached directories.
	hand []dirKey
}

type dirKey struct{ root, rel string }

type cachedDir struct {
	fd   int
	pins int
	used bool
	// dead is set by Forget on a pinned directory: its last user closes
	// it.
	dead bool
}

// NewDirCache returns a cache of at most size directories (at least 1).
func NewDirCache(size int) *DirCache {
	return &DirCache{max: max(size, 1), dirs: make(map[dirKey]*cachedDir)}
}

// open returns a descriptor of the directory rel (relative, cleaned,
// not "") beneath root, the layer root whose path is rootPath, and the
// function that gives it back.
func (c *DirCache) open(rootPath string, root int, rel string) (int, func(), error) {
	key := dirKey{rootPath, rel}
	c.mu.Lock()
	if d, ok := c.dirs[key]; ok {
		d.pins++
		d.used = true
		c.mu.Unlock()
		return d.fd, func() { c.unpin(d) }, nil
	}
	gen := c.gen
	c.mu.Unlock()
	fd, err := openBeneath(root, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open directory", Path: filepath.Join(rootPath, rel), Err: err}
	}
	alone := func() { unix.Close(fd) }
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return fd, alone, nil
	}
	if d, ok := c.dirs[key]; ok {
		// Opened by another caller meanwhile.
		unix.Close(fd)
		d.pins++
		d.used = true
		return d.fd, func() { c.unpin(d) }, nil
	}
	if len(c.dirs) >= c.max && !c.evictLocked() {
		return fd, alone, nil
	}
	d := &cachedDir{fd: fd, pins: 1, used: true}
	c.dirs[key] = d
	c.hand = append(c.hand, key)
	return fd, func() { c.unpin(d) }, nil
}

func (c *DirCache) unpin(d *cachedDir) {
	c.mu.Lock()
	d.pins--
	closing := d.dead && d.pins == 0
	c.mu.Unlock()
	if closing {
		unix.Close(d.fd)
	}
}

// evictLocked closes one unpinned directory not used since the hand last
// passed it, and reports whether it found one.
func (c *DirCache) evictLocked() bool {
	for range 2 * len(c.hand) {
		key := c.hand[0]
		c.hand = append(c.hand[1:], key)
		d := c.dirs[key]
		if d.pins > 0 {
			continue
		}
		if d.used {
			d.used = false
			continue
		}
		unix.Close(d.fd)
		delete(c.dirs, key)
		c.hand = c.hand[:len(c.hand)-1]
		return true
	}
	return false
}

// Forget drops every cached directory: a directory of some layer moved or
// went away. Those in use are closed when their users are done.
func (c *DirCache) Forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.dropLocked()
}

func (c *DirCache) dropLocked() {
	for _, d := range c.dirs {
		if d.pins > 0 {
			d.dead = true
			continue
		}
		unix.Close(d.fd)
	}
	c.dirs, c.hand = make(map[dirKey]*cachedDir), nil
}

// Len is how many directories the cache holds open.
func (c *DirCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.dirs)
}

// Close closes every cached directory. Directories still pinned are an
// error: an operation is running in them.
func (c *DirCache) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for key, d := range c.dirs {
		if d.pins > 0 {
			errs = append(errs, errors.New("directory "+filepath.Join(key.root, key.rel)+" still in use at close"))
		}
	}
	c.gen++
	c.dropLocked()
	return errors.Join(errs...)
}
