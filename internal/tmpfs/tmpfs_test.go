package tmpfs

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// newOrSkip makes an instance, skipping where this process may not make
// one (not root in the initial user namespace, no new mount API).
func newOrSkip(t *testing.T, opts Options) *FS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a tmpfs needs root (CAP_SYS_ADMIN)")
	}
	f, err := New(opts)
	if err != nil {
		if os.Getenv("ALLOCFS_REQUIRE_FUSE") == "1" {
			t.Fatalf("a detached tmpfs: %v", err)
		}
		t.Skipf("no detached tmpfs here: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestCaps: the instance has the caps asked for, in statfs as df shows
// them, and enforces them: a write past the byte cap and a create past
// the entry cap fail with ENOSPC and leave what was there.
func TestCaps(t *testing.T) {
	f := newOrSkip(t, Options{Bytes: 1 << 20, Inodes: 16, Mode: 0o750, UID: 65534, GID: 65534})
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(f.Fd(), &sfs); err != nil {
		t.Fatal(err)
	}
	if got := int64(sfs.Blocks) * sfs.Bsize; got != 1<<20 {
		t.Errorf("statfs size: %d bytes, want %d", got, 1<<20)
	}
	if sfs.Files != 16 {
		t.Errorf("statfs inodes: %d, want 16", sfs.Files)
	}
	var st unix.Stat_t
	if err := unix.Fstat(f.Fd(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o7777 != 0o750 || st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("root: mode %o, owner %d:%d; want 750, 65534:65534", st.Mode&0o7777, st.Uid, st.Gid)
	}

	big := make([]byte, 2<<20)
	err := os.WriteFile(f.Path()+"/big", big, 0o600)
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("2 MiB into a 1 MiB tmpfs: %v, want ENOSPC", err)
	}
	if fi, err := os.Stat(f.Path() + "/big"); err != nil || fi.Size() > 1<<20 {
		t.Errorf("what the full write left: %v, %v", fi, err)
	}
	os.Remove(f.Path() + "/big")

	made := 0
	for i := range 32 {
		fd, err := unix.Openat(f.Fd(), fmt.Sprintf("f%d", i), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Errorf("create %d: %v, want ENOSPC once the entries are used", i, err)
			}
			break
		}
		unix.Close(fd)
		made++
	}
	// The root takes one entry.
	if made != 15 {
		t.Errorf("made %d files in a tmpfs of 16 entries, want 15", made)
	}
}

// TestDetached: no mount table shows the instance, and its files are
// reached only through its descriptor.
func TestDetached(t *testing.T) {
	f := newOrSkip(t, Options{Bytes: 1 << 20, Inodes: 64, Mode: 0o700})
	marker := "allocfs-detached-" + strings.ReplaceAll(t.Name(), "/", "-")
	if err := os.WriteFile(f.Path()+"/"+marker, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var sfs unix.Statfs_t
	unix.Fstatfs(f.Fd(), &sfs)
	for _, line := range strings.Split(string(mi), "\n") {
		// A detached mount has no line; every tmpfs that has one is
		// someone else's, of another size.
		if strings.Contains(line, " - tmpfs ") && strings.Contains(line, "size=1024k") && strings.Contains(line, "nr_inodes=64") {
			t.Errorf("the detached tmpfs is in the mount table: %s", line)
		}
	}
	t.Logf("noswap: %v", f.NoSwap())
}

// TestLivesWithAnyDescriptor: the files stay while any descriptor of the
// instance is open, whichever closed first; that is what lets a holder
// keep them across the daemon's death.
func TestLivesWithAnyDescriptor(t *testing.T) {
	f := newOrSkip(t, Options{Bytes: 1 << 20, Inodes: 64, Mode: 0o700})
	if err := os.WriteFile(f.Path()+"/token", []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	dup, err := unix.FcntlInt(uintptr(f.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	g, err := Adopt(dup, false)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if b, err := os.ReadFile(g.Path() + "/token"); err != nil || string(b) != "s3cr3t" {
		t.Errorf("the file after its maker's descriptor closed: %q, %v", b, err)
	}
}

// TestAdopt: a descriptor handed over is taken when it is a tmpfs's root,
// refused otherwise, with nothing closed.
func TestAdopt(t *testing.T) {
	f := newOrSkip(t, Options{Bytes: 1 << 20, Inodes: 64, Mode: 0o700})
	dup, err := unix.FcntlInt(uintptr(f.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	g, err := Adopt(dup, f.NoSwap())
	if err != nil {
		t.Fatalf("adopt a tmpfs root: %v", err)
	}
	if err := os.WriteFile(g.Path()+"/shared", []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(f.Path() + "/shared"); err != nil || string(b) != "one" {
		t.Errorf("the two descriptors are not one instance: %q, %v", b, err)
	}
	g.Close()

	if err := unix.Mkdirat(f.Fd(), "sub", 0o700); err != nil {
		t.Fatal(err)
	}
	subfd, err := unix.Openat(f.Fd(), "sub", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(subfd)
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	for what, fd := range map[string]int{"a directory inside a tmpfs": subfd, "the root of another filesystem": root} {
		if _, err := Adopt(fd, false); err == nil {
			t.Errorf("adopt %s: taken, want a refusal", what)
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("a refused adopt of %s closed it: %v", what, err)
		}
	}
}

// TestBadOptions: caps that are not caps are refused before anything is
// made.
func TestBadOptions(t *testing.T) {
	for _, opts := range []Options{
		{Bytes: 0, Inodes: 10},
		{Bytes: 1 << 20, Inodes: 0},
		{Bytes: -1, Inodes: 10},
		{Bytes: 1 << 20, Inodes: 10, Mode: 0o10000},
		{Bytes: 1 << 20, Inodes: 10, UID: -1},
	} {
		if f, err := New(opts); err == nil {
			f.Close()
			t.Errorf("New(%+v): made, want a refusal", opts)
		}
	}
}

// TestFileHandles: a file of the instance has a file handle, and the
// handle opens the file again from the root's descriptor: what a daemon
// taking the mount over needs to find a node the kernel holds.
func TestFileHandles(t *testing.T) {
	f := newOrSkip(t, Options{Bytes: 1 << 20, Inodes: 64, Mode: 0o700})
	if err := os.WriteFile(f.Path()+"/token", []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	h, _, err := unix.NameToHandleAt(f.Fd(), "token", 0)
	if err != nil {
		t.Fatalf("name_to_handle_at on tmpfs: %v", err)
	}
	fd, err := unix.OpenByHandleAt(f.Fd(), h, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		t.Fatalf("open_by_handle_at on tmpfs: %v", err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 16)
	n, _ := unix.Read(fd, buf)
	if string(buf[:n]) != "s3cr3t" {
		t.Errorf("the file the handle opens: %q", buf[:n])
	}
}
