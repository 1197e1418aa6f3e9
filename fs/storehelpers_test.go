package fs

import (
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"
	"github.com/hashicorp/go-hclog"
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

// openTestStore opens the store in dir with opts through storetest.Open,
// as every store test does: with ALLOCFS_TEST_DATA_FS=btrfs
// (scripts/test-btrfs.sh, which puts the temporary directories on a btrfs
// image) every store has disk limits on, so every test of the tree runs
// over subvolumes and tagged inode numbers (the limits themselves are
// fs/quota_test.go's). It closes the store when the test ends.
func openTestStore(t *testing.T, dir string, opts store.Options) *store.Store {
	t.Helper()
	s := storetest.Value[*store.Store](t)(openStore(t, testLogger(t), dir, opts))
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// openStore is openTestStore for a test that closes the store itself.
func openStore(t testing.TB, logger hclog.Logger, dir string, opts store.Options) (*store.Store, error) {
	t.Helper()
	return storetest.Open(t, func(limits bool) (*store.Store, error) {
		opts.Quotas = opts.Quotas || limits
		return store.OpenWith(logger, dir, opts)
	})
}

// layerDirs lists <data-dir>/layers.
func layerDirs(t *testing.T, s *store.Store) []string {
	return dirNames(t, filepath.Join(s.DataDir(), "layers"))
}

func writeFile(t *testing.T, p, content string) { mustWrite(t, p, content, 0o600) }
