package readside

import (
	"path/filepath"

	"github.com/allocfs/allocfs/allocdir"
)

var _ allocdir.BackedFS = (*FS)(nil)

// Backing implements allocdir.BackedFS: a volume path lives in its upper
// layer, where every write to it lands (a lower layer's file is copied up
// first, which shows as a creation there).
func (f *FS) Backing(name string) (root, rel string, ok bool) {
	w, err := f.locate(name)
	if err != nil || w.upperRoot == "" {
		return "", "", false
	}
	return w.upperRoot, filepath.Clean(w.rest), true
}
