package layer

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// fdOpen reports whether fd is an open descriptor of this process.
func fdOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

// TestDirCacheKeepsDirectories checks that entries of one directory are
// named through one kept descriptor, that the cache stays within its
// size, and that a directory in use when the cache is full is opened for
// its user alone.
func TestDirCacheKeepsDirectories(t *testing.T) {
	s := newStack(t)
	s.Cache, s.Dirs = NewRootCache(4), NewDirCache(2)
	for _, d := range []string{"a", "b", "c"} {
		must(t, os.Mkdir(filepath.Join(s.Roots[0], d), 0o755))
	}
	l1, err := s.Loc(0, "a/x")
	must(t, err)
	kept := l1.Dir
	l1.Close()
	l2, err := s.Loc(0, "a/y")
	must(t, err)
	if l2.Dir != kept {
		t.Errorf("a/y was named through descriptor %d, a/x through %d: want the same kept one", l2.Dir, kept)
	}
	l2.Close()
	if !fdOpen(kept) {
		t.Error("the kept descriptor of a was closed with its last user")
	}

	// Both slots pinned: a third directory is its user's alone.
	la, err := s.Loc(0, "a/x")
	must(t, err)
	lb, err := s.Loc(0, "b/x")
	must(t, err)
	lc, err := s.Loc(0, "c/x")
	must(t, err)
	if n := s.Dirs.Len(); n != 2 {
		t.Errorf("the cache holds %d directories, want its size, 2", n)
	}
	cfd := lc.Dir
	lc.Close()
	if fdOpen(cfd) && cfd != la.Dir && cfd != lb.Dir {
		t.Error("a directory opened for one user alone stayed open after it")
	}
	la.Close()
	lb.Close()

	// Unpinned and not used since: c takes a slot.
	lc, err = s.Loc(0, "c/x")
	must(t, err)
	lc.Close()
	if n := s.Dirs.Len(); n != 2 {
		t.Errorf("the cache holds %d directories, want 2", n)
	}
	must(t, s.Dirs.Close())
	if n := s.Dirs.Len(); n != 0 {
		t.Errorf("the cache holds %d directories after Close, want none", n)
	}
}

// TestDirCacheForgetsMovedDirectories checks what a rename through the
// mount relies on: after a directory moved and another took its name,
// Forget makes a new operation on the name reach the new directory, and a
// user holding the old descriptor keeps it until it is done.
func TestDirCacheForgetsMovedDirectories(t *testing.T) {
	s := newStack(t)
	s.Cache, s.Dirs = NewRootCache(4), NewDirCache(8)
	root := s.Roots[0]
	must(t, os.Mkdir(filepath.Join(root, "d"), 0o755))
	held, err := s.Loc(0, "d/old")
	must(t, err)
	must(t, os.Rename(filepath.Join(root, "d"), filepath.Join(root, "moved")))
	must(t, os.Mkdir(filepath.Join(root, "d"), 0o755))

	// Without Forget the name still leads to the moved directory: the
	// cache relies on being told.
	stale, err := s.Loc(0, "d/f")
	must(t, err)
	if stale.Dir != held.Dir {
		t.Fatalf("a second lookup of d opened it again: the cache kept nothing")
	}
	stale.Close()

	s.Dirs.Forget()
	if !fdOpen(held.Dir) {
		t.Fatal("Forget closed a descriptor still in use")
	}
	l, err := s.Loc(0, "d/f")
	must(t, err)
	fd, err := l.Open(unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o644)
	must(t, err)
	unix.Close(fd)
	l.Close()
	if _, err := os.Stat(filepath.Join(root, "d", "f")); err != nil {
		t.Errorf("a create after Forget missed the new d: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "moved", "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a create after Forget went into the moved directory (stat: %v)", err)
	}
	old := held.Dir
	held.Close()
	if fdOpen(old) {
		t.Error("a forgotten descriptor stayed open after its last user")
	}

	// A removed directory: the next lookup fails as the path would.
	l, err = s.Loc(0, "d/f")
	must(t, err)
	l.Close()
	must(t, os.Remove(filepath.Join(root, "d", "f")))
	must(t, os.Remove(filepath.Join(root, "d")))
	s.Dirs.Forget()
	if _, err := s.Loc(0, "d/f"); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("a lookup in a removed directory after Forget: %v, want ENOENT", err)
	}
	if n := s.Dirs.Len(); n != 0 {
		t.Errorf("a failed open was cached: %d directories held", n)
	}
}

// TestDirCacheSkipsHeldRoots checks that a directory under a root reached
// by descriptor only (a memory volume's) is never cached: its root's
// name is not a path, and two such roots may share it.
func TestDirCacheSkipsHeldRoots(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	s := &Stack{Roots: []string{"memory:x"}, Held: heldFd(fd), Dirs: NewDirCache(4)}
	l, err := s.Loc(0, "d/f")
	must(t, err)
	l.Close()
	if n := s.Dirs.Len(); n != 0 {
		t.Errorf("a held root's directory was cached (%d held)", n)
	}
}

// heldFd is a HeldRoot of a descriptor the test owns.
type heldFd int

func (h heldFd) Root() (int, func(), error) { return int(h), func() {}, nil }
