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
// descriptors, so a tree deeper than PATH_MAX is walked whole, and holds
// two of them at most, however deep the tree: a lower layer never
// changes, so ".." of a directory is the one the walk came from.
func walkLinks(root string) (map[uint64][]string, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: root, Err: err}
	}
	names := make(map[uint64][]string)
	up, err := walkLinksAt(fd, root, "", names)
	if up >= 0 {
		unix.Close(up)
	}
	return names, err
}

// walkLinksAt adds the hard-linked files under the directory dir (at rel
// in the layer, shown in errors as shown) to names. It owns dir, and
// returns in its place a descriptor of dir's parent, opened through
// "..", for the caller to go on with (-1 on error).
func walkLinksAt(dir int, shown, rel string, names map[uint64][]string) (int, error) {
	f := os.NewFile(uintptr(dir), shown)
	entries, err := f.ReadDir(-1)
	var subdirs []string
	for _, e := range entries {
		if err != nil {
			break
		}
		switch {
		case e.Type().IsRegular():
			var st unix.Stat_t
			if err = unix.Fstatat(dir, e.Name(), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				err = &os.PathError{Op: "lstat", Path: filepath.Join(shown, e.Name()), Err: err}
			} else if st.Nlink >= 2 {
				names[st.Ino] = append(names[st.Ino], filepath.Join(rel, e.Name()))
			}
		case e.IsDir():
			subdirs = append(subdirs, e.Name())
		}
	}
	for _, sub := range subdirs {
		if err != nil {
			break
		}
		child, oerr := unix.Openat(dir, sub, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if oerr != nil {
			err = &os.PathError{Op: "open", Path: filepath.Join(shown, sub), Err: oerr}
			break
		}
		// Only the child stays open while it is walked; the walk
		// comes back to this directory through its "..".
		f.Close()
		dir, err = walkLinksAt(child, filepath.Join(shown, sub), filepath.Join(rel, sub), names)
		if err != nil {
			return -1, err
		}
		f = os.NewFile(uintptr(dir), shown)
	}
	if err != nil {
		f.Close()
		return -1, err
	}
	up, oerr := unix.Openat(dir, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	f.Close()
	if oerr != nil {
		return -1, &os.PathError{Op: "open", Path: filepath.Join(shown, ".."), Err: oerr}
	}
	return up, nil
}
