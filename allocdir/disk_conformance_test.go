package allocdir_test

import (
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/hashicorp/go-hclog"
)

// TestDiskConformance runs the conformance suite against the on-disk
// implementation, one store directory per case.
func TestDiskConformance(t *testing.T) {
	allocdirtest.Run(t, func(t *testing.T) func(string) allocdir.Interface {
		root := t.TempDir()
		return func(id string) allocdir.Interface {
			d, err := allocdir.NewDisk(hclog.NewNullLogger(), root, id)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	})
}
