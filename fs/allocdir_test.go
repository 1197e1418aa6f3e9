package fs

import (
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
)

// TestAllocDirConformance holds the store-backed implementation to the
// same suite as the on-disk one. Fixtures are written through a real
// mount (AllocDirPath is a mount path); the implementation itself reads
// the store.
func TestAllocDirConformance(t *testing.T) {
	allocdirtest.Run(t, func(t *testing.T) func(string) allocdir.Interface {
		tm := newTestMount(t)
		return func(id string) allocdir.Interface {
			return NewAllocDir(tm.mount.logger, tm.store, tm.mount, tm.dir, id)
		}
	})
}
