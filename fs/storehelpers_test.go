package fs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"
)

// Helpers shared with the store's tests (package store).
var (
	testLogger = allocdirtest.Logger
	must       = storetest.Must
	mustWrite  = storetest.MustWrite
	dirNames   = storetest.DirNames
	tasks      = storetest.Tasks
)

func errOnly[T any](v T, err error) error { return storetest.ErrOnly(v, err) }

func mustState(t *testing.T, s *store.Store, id string) *record.State {
	return storetest.Value[*record.State](t)(s.Get(id))
}

// openTestStore opens the store in dir with opts, and closes it when the
// test ends. With ALLOCFS_TEST_DATA_FS=btrfs (scripts/test-btrfs.sh, which
// puts the temporary directories on a btrfs image), every store has disk
// limits on, so every test of the tree runs over subvolumes and tagged
// inode numbers (the limits themselves are fs/quota_test.go's).
func openTestStore(t *testing.T, dir string, opts store.Options) *store.Store {
	t.Helper()
	onBtrfs := os.Getenv("ALLOCFS_TEST_DATA_FS") == "btrfs"
	if onBtrfs {
		opts.Quotas = true
	}
	s := storetest.Value[*store.Store](t)(store.OpenWith(testLogger(t), dir, opts))
	if onBtrfs && !s.Quota().Enforced() {
		t.Fatalf("ALLOCFS_TEST_DATA_FS=btrfs, and the store in %s enforces no limits: %s", dir, s.Quota().Why)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// layerDirs lists <data-dir>/layers.
func layerDirs(t *testing.T, s *store.Store) []string {
	return dirNames(t, filepath.Join(s.DataDir(), "layers"))
}

func writeFile(t *testing.T, p, content string) { mustWrite(t, p, content, 0o600) }
