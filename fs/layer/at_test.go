package layer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// deepRel makes a chain of directories under root whose path, relative
// to root, is longer than PATH_MAX, step by step from directory fds (a
// path that long cannot be given to mkdir), and returns it.
func deepRel(t *testing.T, root string, levels int) string {
	t.Helper()
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	var parts []string
	for i := range levels {
		name := strings.Repeat(string(rune('a'+i%26)), 200)
		must(t, unix.Mkdirat(dir, name, 0o755))
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		must(t, err)
		unix.Close(dir)
		dir = next
		parts = append(parts, name)
	}
	unix.Close(dir)
	return strings.Join(parts, "/")
}

// TestLocBeyondPathMax makes, stats, changes and removes entries whose
// path inside the layer is twice PATH_MAX: only the mount's own limit on
// one path a task gives may bound how deep a volume goes.
func TestLocBeyondPathMax(t *testing.T) {
	s := newStack(t)
	s.Cache = NewRootCache(4)
	deep := deepRel(t, s.Roots[0], 45)
	if len(deep) <= 2*unix.PathMax {
		t.Fatalf("test tree is only %d bytes deep", len(deep))
	}
	f := deep + "/f"
	l, err := s.Loc(0, f)
	must(t, err)
	defer l.Close()
	fd, err := l.Open(unix.O_CREAT|unix.O_WRONLY|unix.O_EXCL, 0o640)
	must(t, err)
	_, err = unix.Write(fd, []byte("deep"))
	unix.Close(fd)
	must(t, err)
	must(t, l.Setxattr("user.k", []byte("v"), 0))
	must(t, l.Chmod(0o604))
	var st syscall.Stat_t
	must(t, s.Lstat(0, f, &st))
	if st.Size != 4 || st.Mode&0o7777 != 0o604 {
		t.Errorf("deep file: size %d mode %o, want 4 and 0604", st.Size, st.Mode&0o7777)
	}
	if v, err := GetXattr(l, "user.k"); err != nil || string(v) != "v" {
		t.Errorf("deep file's xattr: %q, %v", v, err)
	}
	dirLoc, err := s.Loc(0, deep)
	must(t, err)
	defer dirLoc.Close()
	entries, err := s.List(deep, []int{0})
	must(t, err)
	if len(entries) != 1 || entries[0].Name != "f" {
		t.Errorf("listing of the deep directory: %v", entries)
	}
	must(t, l.Unlink())
	if err := s.Lstat(0, f, &st); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("lstat after unlink: %v, want ENOENT", err)
	}
}

// TestLocNeverFollowsSymlinks swaps a directory of a layer for a symbolic
// link to a directory outside it, as a task racing an operation could:
// every way into the layer refuses it, and the outside is untouched.
func TestLocNeverFollowsSymlinks(t *testing.T) {
	s := newStack(t)
	s.Cache = NewRootCache(4)
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "x")
	must(t, os.Symlink(outside, filepath.Join(s.Roots[0], "d")))

	// The link is not followed: as the last step it is no directory
	// (ENOTDIR), on the way it is a link (ELOOP).
	refused := func(err error) bool { return errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) }
	if l, err := s.Loc(0, "d/secret"); !refused(err) {
		l.Close()
		t.Errorf("Loc through a symbolic link: %v, want ENOTDIR", err)
	}
	if l, err := s.Loc(0, "d/secret/x"); !errors.Is(err, syscall.ELOOP) {
		l.Close()
		t.Errorf("Loc through a symbolic link on the way: %v, want ELOOP", err)
	}
	if fd, err := s.Open(0, "d/secret", unix.O_RDONLY); !errors.Is(err, syscall.ELOOP) {
		unix.Close(fd)
		t.Errorf("Open through a symbolic link: %v, want ELOOP", err)
	}
	if fd, err := s.Open(0, "d", unix.O_RDONLY|unix.O_DIRECTORY); !refused(err) {
		unix.Close(fd)
		t.Errorf("Open of a symbolic link as a directory: %v, want ENOTDIR", err)
	}
	if err := s.Whiteout("d/new"); err == nil {
		t.Error("a whiteout was made through a symbolic link")
	}
	// The link itself is an entry like any other: it can be named.
	l, err := s.Loc(0, "d")
	must(t, err)
	defer l.Close()
	if target, err := l.Readlink(); err != nil || target != outside {
		t.Errorf("readlink: %q, %v", target, err)
	}
	if err := l.Chmod(0o700); err == nil {
		t.Error("chmod of a symbolic link followed it")
	}
	names, err := os.ReadDir(outside)
	must(t, err)
	if len(names) != 1 || lstat(t, outside).Mode&0o777 == 0o700 {
		t.Errorf("the directory outside the layer changed: %v", names)
	}
}

// TestRootCacheStaysBounded opens more layer roots than the cache holds:
// it never keeps more than its size open, a pinned root is never closed
// under its user, and a root opened while every cached one is pinned is
// the caller's alone.
func TestRootCacheStaysBounded(t *testing.T) {
	c := NewRootCache(2)
	var roots []string
	for range 4 {
		roots = append(roots, t.TempDir())
	}
	fd0, done0, err := c.open(roots[0])
	must(t, err)
	fd1, done1, err := c.open(roots[1])
	must(t, err)
	// Both pinned: a third is opened outside the cache.
	fd2, done2, err := c.open(roots[2])
	must(t, err)
	if c.Len() != 2 {
		t.Errorf("cache holds %d roots, want 2", c.Len())
	}
	done2()
	if _, err := unix.FcntlInt(uintptr(fd2), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Error("a root opened outside the cache stayed open after its use")
	}
	done0()
	// roots[0] is unpinned now and makes room for roots[3].
	fd3, done3, err := c.open(roots[3])
	must(t, err)
	if c.Len() != 2 {
		t.Errorf("cache holds %d roots, want 2", c.Len())
	}
	var st syscall.Stat_t
	must(t, syscall.Fstat(fd1, &st))
	if _, err := unix.FcntlInt(uintptr(fd0), unix.F_GETFD, 0); err == nil && fd0 != fd3 {
		t.Error("the evicted root's descriptor is still open")
	}
	if err := c.Close(); err == nil {
		t.Error("Close with roots in use reported nothing")
	}
	done1()
	done3()
	if c.Len() != 0 {
		t.Errorf("cache holds %d roots after Close", c.Len())
	}
}

// TestCopyUpDeepHardLinks copies up a file whose two names lie deeper
// than PATH_MAX in a lower layer: both names end up one upper file.
func TestCopyUpDeepHardLinks(t *testing.T) {
	requireRoot(t)
	var deep string
	s := newStack(t, func(root string) {
		deep = deepRel(t, root, 25)
		dir, err := openBeneath(mustOpen(t, root), deep, unix.O_PATH|unix.O_DIRECTORY)
		must(t, err)
		defer unix.Close(dir)
		fd, err := unix.Openat(dir, "f1", unix.O_CREAT|unix.O_WRONLY, 0o644)
		must(t, err)
		unix.Close(fd)
		must(t, unix.Linkat(dir, "f1", dir, "f2", 0))
	})
	if len(deep) <= unix.PathMax {
		t.Fatalf("test tree is only %d bytes deep", len(deep))
	}
	must(t, s.EnsureUpperDir(deep))
	must(t, s.CopyUp(deep+"/f1", 1))
	var st1, st2 syscall.Stat_t
	must(t, s.Lstat(0, deep+"/f1", &st1))
	must(t, s.Lstat(0, deep+"/f2", &st2))
	if st1.Ino != st2.Ino || st1.Nlink != 2 {
		t.Errorf("upper names: inodes %d and %d, nlink %d; want one inode with 2 links", st1.Ino, st2.Ino, st1.Nlink)
	}
}

func mustOpen(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// TestMergeDeepTree merges a pair of layers whose trees go deeper than
// PATH_MAX: the merged layer holds the deep files of both.
func TestMergeDeepTree(t *testing.T) {
	dir := t.TempDir()
	upper, lower, dst := filepath.Join(dir, "u"), filepath.Join(dir, "l"), filepath.Join(dir, "m")
	for _, p := range []string{upper, lower, dst} {
		must(t, os.Mkdir(p, 0o755))
	}
	deep := deepRel(t, upper, 25)
	if deepRel(t, lower, 25) != deep || len(deep) <= unix.PathMax {
		t.Fatalf("test trees differ or are only %d bytes deep", len(deep))
	}
	for root, name := range map[string]string{upper: "from-upper", lower: "from-lower"} {
		d, err := openBeneath(mustOpen(t, root), deep, unix.O_PATH|unix.O_DIRECTORY)
		must(t, err)
		fd, err := unix.Openat(d, name, unix.O_CREAT|unix.O_WRONLY, 0o644)
		must(t, err)
		unix.Close(fd)
		unix.Close(d)
	}
	stats, err := Merge(&osDisk{}, dst, upper, lower, false)
	must(t, err)
	if stats.Links != 2 || stats.Dirs != 25 {
		t.Errorf("merge made %+v, want 2 links and 25 directories", stats)
	}
	s := &Stack{Roots: []string{dst}}
	entries, err := s.List(deep, []int{0})
	must(t, err)
	if len(entries) != 2 {
		t.Errorf("deep merged directory holds %v, want both files", entries)
	}
}
