package layer

import (
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// Links finds every name of a lower layer's file that has more than one,
// for the copy-up that must keep them one file. A lower layer never
// changes, so each is walked once, by the first copy-up of a file with
// links in it, and only files with more than one link are remembered.
// One Links serves every stack of a mount.
type Links struct {
	mu     sync.Mutex
	layers map[string]*layerLinks
}

type layerLinks struct {
	once  sync.Once
	names map[uint64][]string
	err   error
}

// Names returns the paths, relative to the layer root, of the file with
// inode number ino in the layer at root.
func (l *Links) Names(root string, ino uint64) ([]string, error) {
	l.mu.Lock()
	if l.layers == nil {
		l.layers = make(map[string]*layerLinks)
	}
	ll, ok := l.layers[root]
	if !ok {
		ll = &layerLinks{}
		l.layers[root] = ll
	}
	l.mu.Unlock()
	ll.once.Do(func() { ll.names, ll.err = walkLinks(root) })
	if ll.err != nil {
		return nil, ll.err
	}
	return ll.names[ino], nil
}

// walkLinks maps the inode number of every regular file of the tree at
// root with more than one link to its names. It walks from directory
// descriptors, so a tree deeper than PATH_MAX is walked whole.
func walkLinks(root string) (map[uint64][]string, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	names := make(map[uint64][]string)
	err = walkLinksAt(os.NewFile(uintptr(fd), root), "", names)
	return names, err
}

// walkLinksAt adds the hard-linked files under dir, at rel in the layer,
// to names, and closes dir.
func walkLinksAt(dir *os.File, rel string, names map[uint64][]string) error {
	defer dir.Close()
	entries, err := dir.ReadDir(-1)
	if err != nil {
		return err
	}
	dfd := int(dir.Fd())
	for _, e := range entries {
		child := filepath.Join(rel, e.Name())
		switch {
		case e.Type().IsRegular():
			var st unix.Stat_t
			if err := unix.Fstatat(dfd, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return &os.PathError{Op: "lstat", Path: filepath.Join(dir.Name(), e.Name()), Err: err}
			}
			if st.Nlink >= 2 {
				names[st.Ino] = append(names[st.Ino], child)
			}
		case e.IsDir():
			fd, err := unix.Openat(dfd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != nil {
				return &os.PathError{Op: "open", Path: filepath.Join(dir.Name(), e.Name()), Err: err}
			}
			if err := walkLinksAt(os.NewFile(uintptr(fd), filepath.Join(dir.Name(), e.Name())), child, names); err != nil {
				return err
			}
		}
	}
	return nil
}
