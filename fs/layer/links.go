package layer

import (
	"io/fs"
	"path/filepath"
	"sync"
	"syscall"
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
// root with more than one link to its names.
func walkLinks(root string) (map[uint64][]string, error) {
	names := make(map[uint64][]string)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Nlink < 2 {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		names[st.Ino] = append(names[st.Ino], rel)
		return nil
	})
	return names, err
}
