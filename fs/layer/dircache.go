package layer

import (
	"errors"
	"os"
	"path/filepath"

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
	c fdCache[dirKey]
}

type dirKey struct{ root, rel string }

// NewDirCache returns a cache of at most size directories (at least 1).
func NewDirCache(size int) *DirCache {
	return &DirCache{c: newFdCache[dirKey](size)}
}

// open returns a descriptor of the directory rel (relative, cleaned,
// not "") beneath root, the layer root whose path is rootPath, and the
// function that gives it back.
func (c *DirCache) open(rootPath string, root int, rel string) (int, func(), error) {
	key := dirKey{rootPath, rel}
	fd, release, gen, ok := c.c.get(key)
	if ok {
		return fd, release, nil
	}
	fd, err := openBeneath(root, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open directory", Path: filepath.Join(rootPath, rel), Err: err}
	}
	fd, release = c.c.put(key, fd, gen)
	return fd, release, nil
}

// Forget drops every cached directory: a directory of some layer moved or
// went away. Those in use are closed when their users are done.
func (c *DirCache) Forget() { c.c.drop(nil) }

// Len is how many directories the cache holds open.
func (c *DirCache) Len() int { return c.c.len() }

// Close closes every cached directory. Directories still pinned are an
// error: an operation is running in them; each is closed when it is given
// back.
func (c *DirCache) Close() error {
	var errs []error
	pinned := c.c.drop(func(key dirKey, err error) {
		if err != nil {
			errs = append(errs, &os.PathError{Op: "close directory", Path: filepath.Join(key.root, key.rel), Err: err})
		}
	})
	for _, key := range pinned {
		errs = append(errs, errors.New("directory "+filepath.Join(key.root, key.rel)+" still in use at close"))
	}
	return errors.Join(errs...)
}
