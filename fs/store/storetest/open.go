package storetest

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/internal/btrfs"
	"golang.org/x/sys/unix"
)

// DataFSEnv names the variable by which a run asks for every store the
// tests open on a filesystem of its choosing. ALLOCFS_TEST_DATA_FS=btrfs
// (make test-btrfs, scripts/test-btrfs.sh, which puts TMPDIR on a btrfs
// image) gives every store disk limits, so that its layers are btrfs
// subvolumes and its records tag their inode numbers: the store's code
// paths of a node started with --enable-quotas.
const DataFSEnv = "ALLOCFS_TEST_DATA_FS"

// Subvolumes reports whether the run asks for every store on btrfs
// subvolumes (DataFSEnv).
func Subvolumes() bool { return os.Getenv(DataFSEnv) == "btrfs" }

// Store is what Open needs of a store: package store's *Store, which
// this package cannot name, since the store's own tests import it.
type Store interface {
	Quota() quota.Report
	DataDir() string
}

// Open opens a test's store by open, which it tells whether to turn disk
// limits on (the store's Options.Quotas): on where the run asks for
// subvolumes, off otherwise, so that a test opens its stores one way
// whatever the run, and the run decides what they are on. open may turn
// them on regardless, for a filesystem of the test's own (the limits'
// tests make images). Where the run asks for subvolumes, a store on the
// run's filesystem (TMPDIR's) that does not make them fails the test:
// the run would not test what it says. The caller closes the store.
func Open[S Store](t testing.TB, open func(limits bool) (S, error)) (S, error) {
	t.Helper()
	s, err := open(Subvolumes())
	if err != nil {
		return s, err
	}
	r := s.Quota()
	if Subvolumes() && r.Mechanism != quota.BtrfsQgroups && sameFilesystem(s.DataDir(), os.TempDir()) {
		t.Fatalf("%s=btrfs, and the store in %s (%s) enforces no btrfs limits, so its layers are no subvolumes: %s", DataFSEnv, s.DataDir(), r.Filesystem, r.Why)
	}
	logOnce(t, s.DataDir(), r)
	return s, nil
}

// OpenPlain opens a store by open with disk limits off whatever the run
// asks: for the tests of what a store without them does or refuses.
func OpenPlain[S Store](t testing.TB, open func(limits bool) (S, error)) (S, error) {
	t.Helper()
	s, err := open(false)
	if err == nil {
		logOnce(t, s.DataDir(), s.Quota())
	}
	return s, err
}

// sameFilesystem reports whether a and b are on one filesystem: a test
// that made an image of its own keeps its stores there.
func sameFilesystem(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}

// logged holds the tests that said what their first store is on: a
// crash test opens hundreds, all alike.
var logged sync.Map

// logOnce says, once per test, what the layers of the stores it opens
// are on: under make test-btrfs, the -v output shows which tests ran on
// subvolumes.
func logOnce(t testing.TB, dataDir string, r quota.Report) {
	if _, done := logged.LoadOrStore(t.Name(), true); done {
		return
	}
	t.Helper()
	what := "plain directories"
	if r.Mechanism == quota.BtrfsQgroups {
		what = "btrfs subvolumes"
	}
	limits := r.Mechanism
	if limits == "" {
		limits = "none"
	}
	t.Logf("store %s: filesystem %s, layers are %s, disk limits: %s", dataDir, r.Filesystem, what, limits)
}

// CopyDataDir copies the data dir src to dst, which must not exist, as
// `cp -a` does, except that a layer that is a btrfs subvolume in src is
// one in dst too: a copy of a store on subvolumes is still one, for the
// tests that restart a store on a copy of its data dir (a crash's).
func CopyDataDir(t testing.TB, src, dst string) {
	t.Helper()
	layers := filepath.Join(src, "layers")
	var subvols []string
	entries, err := os.ReadDir(layers)
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("copy of %s: %v", src, err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		ok, err := btrfs.IsSubvolume(filepath.Join(layers, e.Name()))
		if err != nil {
			t.Fatalf("copy of %s: %v", src, err)
		}
		if ok {
			subvols = append(subvols, e.Name())
		}
	}
	args := []string{"-a", "--", src, dst}
	if len(subvols) > 0 {
		// cp -a copies into directories that exist, giving them the
		// attributes of their sources: made as subvolumes first, they
		// stay subvolumes.
		Must(t, os.MkdirAll(filepath.Join(dst, "layers"), 0o700))
		for _, l := range subvols {
			Must(t, btrfs.CreateSubvolume(filepath.Join(dst, "layers", l)))
		}
		args = []string{"-a", "--", src + "/.", dst}
	}
	if out, err := exec.Command("cp", args...).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s: %v: %s", src, err, out)
	}
}
