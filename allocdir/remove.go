package allocdir

import (
	"io/fs"
	"os"
	"path/filepath"
)

// RemoveAll removes a tree that a task (or an extraction) may have left
// read-only (a Go module cache in local/ is 0555 throughout): without
// root, entries of a read-only directory cannot be unlinked until the
// directory is made writable again. The walk is lstat-based and never
// follows a link.
func RemoveAll(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || os.Geteuid() == 0 {
		return err
	}
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, werr error) error {
		if werr == nil && e.IsDir() {
			_ = os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}
