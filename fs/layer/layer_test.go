package layer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// requireRoot skips a test that makes devices, owners and trusted.*
// attributes, which only root may.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the layer format's marks (trusted.* xattrs, whiteouts, owners) need root")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// newStack makes an empty upper layer over the lower layers that build
// fills, in order (top first).
func newStack(t *testing.T, build ...func(root string)) *Stack {
	t.Helper()
	dir := t.TempDir()
	s := &Stack{Links: &Links{}, Ctimes: &Ctimes{}}
	for i := 0; i <= len(build); i++ {
		root := filepath.Join(dir, string(rune('0'+i)))
		must(t, os.Mkdir(root, 0o755))
		s.Roots = append(s.Roots, root)
		if i > 0 {
			build[i-1](root)
		}
	}
	return s
}

func write(t *testing.T, p, content string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(content), 0o644))
}

func lstat(t *testing.T, p string) syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	must(t, syscall.Lstat(p, &st))
	return st
}

// TestCopyUpKeepsHardLinks checks that copying up one name of a lower
// file with several brings every name the stack still shows up as the
// same upper file, with the link count the names give it, and leaves the
// names a higher layer hides or replaced alone.
func TestCopyUpKeepsHardLinks(t *testing.T) {
	requireRoot(t)
	var lowerIno uint64
	s := newStack(t,
		func(root string) {
			// The middle layer deleted one name and replaced another.
			must(t, os.MkdirAll(filepath.Join(root, "d"), 0o755))
			must(t, syscall.Mknod(filepath.Join(root, "d/gone"), syscall.S_IFCHR, 0))
			write(t, filepath.Join(root, "other"), "not a link")
		},
		func(root string) {
			write(t, filepath.Join(root, "f1"), "shared")
			for _, n := range []string{"h1", "d/h2", "d/gone", "other", "deep/a/b/h3"} {
				must(t, os.MkdirAll(filepath.Dir(filepath.Join(root, n)), 0o755))
				must(t, os.Link(filepath.Join(root, "f1"), filepath.Join(root, n)))
			}
			lowerIno = lstat(t, filepath.Join(root, "f1")).Ino
		})
	lowerBefore := lstat(t, s.Path(2, "f1"))
	must(t, s.CopyUp("f1", 2))

	up := lstat(t, s.Path(0, "f1"))
	if up.Nlink != 4 {
		t.Errorf("upper f1 has %d links, want 4 (f1, h1, d/h2, deep/a/b/h3)", up.Nlink)
	}
	for _, n := range []string{"h1", "d/h2", "deep/a/b/h3"} {
		st := lstat(t, s.Path(0, n))
		if st.Ino != up.Ino {
			t.Errorf("upper %s is inode %d, want the copy of f1 (%d)", n, st.Ino, up.Ino)
		}
		if layers, _, err := s.Resolve(n); err != nil || layers[0] != 0 {
			t.Errorf("%s after the copy-up: layers %v, %v; want shown from the upper layer", n, layers, err)
		}
	}
	for _, n := range []string{"d/gone", "other"} {
		if _, err := os.Lstat(s.Path(0, n)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, hidden or replaced in the middle layer, was linked into the upper one: %v", n, err)
		}
	}
	if o, ok := Origin(PathLoc(s.Path(0, "f1"))); !ok || o != lowerIno {
		t.Errorf("origin of the copy: %d, %v; want %d", o, ok, lowerIno)
	}
	if after := lstat(t, s.Path(2, "f1")); after.Nlink != lowerBefore.Nlink || after.Ctim != lowerBefore.Ctim {
		t.Errorf("the lower file changed under the copy-up: nlink %d ctime %v, was %d %v", after.Nlink, after.Ctim, lowerBefore.Nlink, lowerBefore.Ctim)
	}
	// Copying up another name finds the copy there already.
	must(t, s.CopyUp("h1", 2))
	if st := lstat(t, s.Path(0, "h1")); st.Ino != up.Ino || st.Nlink != 4 {
		t.Errorf("h1 after its own copy-up: inode %d nlink %d, want %d and 4", st.Ino, st.Nlink, up.Ino)
	}
}

// TestCopyUpKeepsAttributes checks what a copy carries: data with its
// holes, mode with set-id bits, owner, times, the task's xattrs (its own
// trusted.overlay.* ones stay escaped) but not the format's marks.
func TestCopyUpKeepsAttributes(t *testing.T) {
	requireRoot(t)
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	s := newStack(t, func(root string) {
		p := filepath.Join(root, "sparse")
		f, err := os.Create(p)
		must(t, err)
		_, err = f.WriteAt([]byte("data at 4 MiB"), 4<<20)
		must(t, err)
		must(t, f.Truncate(64<<20))
		must(t, f.Close())
		must(t, os.Lchown(p, 1234, 5678))
		must(t, unix.Chmod(p, 0o4750))
		must(t, unix.Lsetxattr(p, "user.tag", []byte("kept"), 0))
		must(t, unix.Lsetxattr(p, StoredXattr("trusted.overlay.task"), []byte("escaped"), 0))
		must(t, unix.Lsetxattr(p, OriginXattr, []byte("1"), 0))
		must(t, os.Chtimes(p, mtime, mtime))
	})
	lower := lstat(t, s.Path(1, "sparse"))
	must(t, s.CopyUp("sparse", 1))
	p := s.Path(0, "sparse")
	up := lstat(t, p)
	if up.Mode != lower.Mode || up.Uid != 1234 || up.Gid != 5678 || up.Size != lower.Size {
		t.Errorf("copy: mode %o owner %d:%d size %d, want %o 1234:5678 %d", up.Mode, up.Uid, up.Gid, up.Size, lower.Mode, lower.Size)
	}
	if up.Mtim != lower.Mtim {
		t.Errorf("copy mtime %v, want %v", up.Mtim, lower.Mtim)
	}
	if up.Blocks*512 > 1<<20 {
		t.Errorf("copy of a 64 MiB file holding 13 bytes allocates %d bytes: holes were filled", up.Blocks*512)
	}
	data := make([]byte, 13)
	f, err := os.Open(p)
	must(t, err)
	_, err = f.ReadAt(data, 4<<20)
	f.Close()
	must(t, err)
	if string(data) != "data at 4 MiB" {
		t.Errorf("copy reads %q at 4 MiB", data)
	}
	names, err := ListXattrs(PathLoc(p))
	must(t, err)
	slices.Sort(names)
	want := []string{OriginXattr, StoredXattr("trusted.overlay.task"), "user.tag"}
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("copy's xattrs %v, want %v (the lower's origin mark replaced by the copy's own)", names, want)
	}
	if o, ok := Origin(PathLoc(p)); !ok || o != lower.Ino {
		t.Errorf("origin %d, %v; want the lower inode %d, not the lower's own origin", o, ok, lower.Ino)
	}
}

// TestTaskDeviceIsNoWhiteout checks that a character device 0/0 marked as
// a task's own shows, is listed, and survives a copy-up as a device, while
// an unmarked one stays a whiteout.
func TestTaskDeviceIsNoWhiteout(t *testing.T) {
	requireRoot(t)
	s := newStack(t, func(root string) {
		write(t, filepath.Join(root, "hidden"), "below")
		write(t, filepath.Join(root, "dev"), "below")
		must(t, syscall.Mknod(filepath.Join(root, "lowerdev"), syscall.S_IFCHR, 0))
		must(t, MarkRealDevice(PathLoc(filepath.Join(root, "lowerdev"))))
	})
	must(t, s.Whiteout("hidden"))
	must(t, syscall.Mknod(s.Path(0, "dev"), syscall.S_IFCHR, 0))
	must(t, MarkRealDevice(PathLoc(s.Path(0, "dev"))))
	if _, _, err := s.Visible("hidden", s.All()); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("a whited-out name: %v, want ENOENT", err)
	}
	layers, st, err := s.Visible("dev", s.All())
	if err != nil || layers[0] != 0 || !IsWhiteout(&st) {
		t.Errorf("the task's device 0/0: layers %v type %o, %v; want it shown from the upper layer", layers, st.Mode&syscall.S_IFMT, err)
	}
	entries, err := s.List("", s.All())
	must(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"dev", "lowerdev"}) {
		t.Errorf("listing %v, want [dev lowerdev]", names)
	}
	must(t, s.CopyUp("lowerdev", 1))
	if layers, _, err := s.Visible("lowerdev", s.All()); err != nil || layers[0] != 0 {
		t.Errorf("the task's device after its copy-up: %v, %v; want it shown from the upper layer, not taken for a whiteout", layers, err)
	}
}

// TestCtimesHideCopyUp checks that a copy shows its lower entry's ctime,
// the directory it lands in keeps its times, and a task's own change
// after the copy-up shows.
func TestCtimesHideCopyUp(t *testing.T) {
	requireRoot(t)
	s := newStack(t, func(root string) {
		write(t, filepath.Join(root, "d/f"), "x")
	})
	must(t, s.EnsureUpperDir("d"))
	lowerDir := lstat(t, s.Path(1, "d"))
	upDir := lstat(t, s.Path(0, "d"))
	if got := s.Ctimes.Shown(&upDir); got != lowerDir.Ctim {
		t.Errorf("copied-up directory shows ctime %v, want the lower's %v", got, lowerDir.Ctim)
	}
	must(t, s.CopyUp("d/f", 1))
	lowerFile := lstat(t, s.Path(1, "d/f"))
	upFile := lstat(t, s.Path(0, "d/f"))
	if got := s.Ctimes.Shown(&upFile); got != lowerFile.Ctim {
		t.Errorf("copied-up file shows ctime %v, want the lower's %v", got, lowerFile.Ctim)
	}
	upDir = lstat(t, s.Path(0, "d"))
	if got := s.Ctimes.Shown(&upDir); got != lowerDir.Ctim || upDir.Mtim != lowerDir.Mtim {
		t.Errorf("directory after a copy-up into it: ctime %v mtime %v, want %v and %v", got, upDir.Mtim, lowerDir.Ctim, lowerDir.Mtim)
	}
	must(t, os.Chmod(s.Path(0, "d/f"), 0o600))
	upFile = lstat(t, s.Path(0, "d/f"))
	if got := s.Ctimes.Shown(&upFile); got != upFile.Ctim || got == lowerFile.Ctim {
		t.Errorf("after a task's chmod the copy shows ctime %v, want its own %v", got, upFile.Ctim)
	}
}

// TestCopyUpRefusesBadStacks checks that a copy-up whose upper directory
// is missing fails and makes nothing, and that a symbolic link planted on
// the way to a lower file is never followed.
func TestCopyUpRefusesBadStacks(t *testing.T) {
	requireRoot(t)
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "outside the layer")
	s := newStack(t, func(root string) {
		write(t, filepath.Join(root, "d/f"), "x")
		must(t, os.Symlink(outside, filepath.Join(root, "link")))
	})
	if err := s.CopyUp("d/f", 1); err == nil {
		t.Error("copy-up into an upper directory that is not there succeeded")
	}
	if entries, _ := os.ReadDir(s.Roots[0]); len(entries) != 0 {
		t.Errorf("a failed copy-up left %v in the upper layer", entries)
	}
	if fd, err := s.Open(1, "link/secret", unix.O_RDONLY); err == nil {
		unix.Close(fd)
		t.Error("Stack.Open followed a symbolic link out of the layer")
	}
	if err := s.CopyUp("link/secret", 1); err == nil {
		t.Error("copy-up through a symbolic link succeeded")
	}
	if _, err := os.Lstat(s.Path(0, "link")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("copy-up through a symbolic link made %v", err)
	}
}

// TestCopyUpLinkGroupOfAThousand checks that a lower file with a thousand
// names copies up once, with all of them linked to the copy.
func TestCopyUpLinkGroupOfAThousand(t *testing.T) {
	requireRoot(t)
	const names = 1000
	s := newStack(t, func(root string) {
		write(t, filepath.Join(root, "f"), "many names")
		for i := range names - 1 {
			dir := filepath.Join(root, fmt.Sprintf("d%02d", i%50))
			must(t, os.MkdirAll(dir, 0o755))
			must(t, os.Link(filepath.Join(root, "f"), filepath.Join(dir, fmt.Sprintf("h%03d", i))))
		}
	})
	must(t, s.EnsureUpperDir("d07"))
	must(t, s.CopyUp("d07/h007", 1))
	up := lstat(t, s.Path(0, "f"))
	if up.Nlink != names {
		t.Errorf("the copy has %d links, want %d", up.Nlink, names)
	}
	if st := lstat(t, s.Path(0, "d48/h998")); st.Ino != up.Ino {
		t.Errorf("d48/h998 is inode %d, want the copy %d", st.Ino, up.Ino)
	}
}

// TestCopyUpOutOfSpace checks that a copy-up that runs out of space in
// the upper layer leaves no entry there, partial or whole, and the lower
// file as it was.
func TestCopyUpOutOfSpace(t *testing.T) {
	requireRoot(t)
	s := newStack(t, func(root string) {
		f, err := os.Create(filepath.Join(root, "big"))
		must(t, err)
		must(t, f.Truncate(4<<20))
		_, err = f.WriteAt(bytes.Repeat([]byte("x"), 4<<20), 0)
		must(t, err)
		must(t, f.Close())
	})
	// A 1 MiB tmpfs as the upper layer.
	if err := unix.Mount("tmpfs", s.Roots[0], "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a small tmpfs for the upper layer: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(s.Roots[0], unix.MNT_DETACH) })
	before := lstat(t, s.Path(1, "big"))
	err := s.CopyUp("big", 1)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("copy-up of 4 MiB into 1 MiB: %v, want ENOSPC", err)
	}
	if entries, _ := os.ReadDir(s.Roots[0]); len(entries) != 0 {
		t.Errorf("a failed copy-up left %v in the upper layer", entries)
	}
	var sfs unix.Statfs_t
	must(t, unix.Statfs(s.Roots[0], &sfs))
	if used := (sfs.Blocks - sfs.Bfree) * uint64(sfs.Bsize); used != 0 {
		t.Errorf("the upper layer still holds %d bytes after the failed copy-up", used)
	}
	if after := lstat(t, s.Path(1, "big")); after.Size != before.Size || after.Ctim != before.Ctim || after.Nlink != before.Nlink {
		t.Errorf("the lower file changed under a failed copy-up")
	}
}

// copyUpRecord is a CopyUpObserver that keeps what it was told.
type copyUpRecord struct {
	modes []uint32
	bytes int64
	took  time.Duration
}

func (r *copyUpRecord) CopiedUp(mode uint32, bytes int64, d time.Duration) {
	r.modes = append(r.modes, mode)
	r.bytes += bytes
	r.took += d
}

// TestCopyUpTellsTheObserver: a copy-up of a file in a lower directory
// is two copies, the directory (no bytes) and the file (its size); a
// second copy-up of the same file copies nothing and says nothing, and
// the anonymous copy of an open file counts too.
func TestCopyUpTellsTheObserver(t *testing.T) {
	requireRoot(t)
	s := newStack(t, func(root string) { write(t, filepath.Join(root, "d/f"), "twelve bytes") })
	rec := &copyUpRecord{}
	s.CopyUps = rec
	must(t, s.EnsureUpperDir("d"))
	must(t, s.CopyUp("d/f", 1))
	must(t, s.CopyUp("d/f", 1))
	if want := []uint32{syscall.S_IFDIR, syscall.S_IFREG}; !slices.Equal(rec.modes, want) {
		t.Errorf("copied-up types %o, want %o", rec.modes, want)
	}
	if rec.bytes != 12 {
		t.Errorf("copied-up bytes %d, want 12", rec.bytes)
	}
	if rec.took <= 0 {
		t.Errorf("the copy-ups took no time at all: the observer is given no duration")
	}
	fd, err := unix.Open(filepath.Join(s.Roots[1], "d/f"), unix.O_RDONLY, 0)
	must(t, err)
	defer unix.Close(fd)
	copyFd, err := s.CopyAnonymous(fd)
	must(t, err)
	unix.Close(copyFd)
	if len(rec.modes) != 3 || rec.bytes != 24 {
		t.Errorf("after an anonymous copy: %d copies of %d bytes, want 3 of 24", len(rec.modes), rec.bytes)
	}
}
