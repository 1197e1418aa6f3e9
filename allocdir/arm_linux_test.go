//go:build linux

package allocdir

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// backedDir is a directory as a BackedFS: every name is held by the
// directory itself.
type backedDir struct {
	ReadFS
	root string
}

func (b backedDir) Backing(name string) (string, string, bool) { return b.root, name, true }

// racingSub is a subscription during whose first Arm the next component
// of the way is made, as a task making directories while a follower arms
// would: no event of that creation reaches the subscription.
type racingSub struct {
	arms    []string
	onFirst func()
}

func (s *racingSub) Woken() <-chan struct{} { return nil }
func (s *racingSub) Close()                 {}
func (s *racingSub) Arm(root, rel string) error {
	s.arms = append(s.arms, rel)
	if len(s.arms) == 1 {
		s.onFirst()
	}
	return nil
}

// TestArmFollowsAWayMadeWhileArming: a follower of a/b/c armed while a/b
// is made watches a/b for c, not a for a b that is already there (which
// would wait for ever).
func TestArmFollowsAWayMadeWhileArming(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := ReadSide{AllocID: "x", HostPrefix: dir, Open: func() (ReadFS, func(), error) {
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, err
		}
		return backedDir{NewBeneathFS(fd), dir}, func() { unix.Close(fd) }, nil
	}}
	sub := &racingSub{onFirst: func() {
		if err := os.Mkdir(filepath.Join(dir, "a", "b"), 0o755); err != nil {
			t.Error(err)
		}
	}}
	if !r.arm(sub, "a/b/c") {
		t.Fatal("arm: not armed, want armed")
	}
	if want := []string{"a/b", "a/b/c"}; !slices.Equal(sub.arms, want) {
		t.Errorf("armed at %q, want %q: the last at the way's first missing component", sub.arms, want)
	}
}
