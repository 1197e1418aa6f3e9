package fs

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// TestMountNeverFollowsPlantedSymlink swaps a directory of a volume's
// backing layer for a symbolic link to a directory outside the data dir,
// behind the kernel's back (its cached dentries still say directory), as
// a process racing an operation could. Nothing outside ever changes.
// While the mount still holds the directory's descriptor (layer.DirCache)
// an operation acts on the directory the kernel's node stands for, now
// moved; once the mount forgot it (as it does after any rename or rmdir)
// every operation under the name fails.
func TestMountNeverFollowsPlantedSymlink(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(tm.dir, "a", "alloc", "data", "d")
	st, err := tm.store.Get("a")
	must(t, err)
	backing := filepath.Join(tm.store.LayerPath(st.Volumes["alloc/data"].Upper), "d")
	outside := t.TempDir()
	must(t, os.Mkdir(filepath.Join(outside, "sub"), 0o755))
	must(t, os.WriteFile(filepath.Join(outside, "f"), []byte("outside"), 0o600))
	before := treeOf(t, outside)

	for _, forgotten := range []bool{false, true} {
		must(t, os.MkdirAll(filepath.Join(d, "sub"), 0o755))
		must(t, os.WriteFile(filepath.Join(d, "f"), []byte("inside"), 0o644))
		// The kernel now holds nodes for d, d/sub and d/f.
		for _, p := range []string{d, filepath.Join(d, "sub"), filepath.Join(d, "f")} {
			if _, err := os.Lstat(p); err != nil {
				t.Fatal(err)
			}
		}
		moved := backing + ".moved"
		must(t, os.Rename(backing, moved))
		must(t, os.Symlink(outside, backing))
		if forgotten {
			tm.mount.dirs.Forget()
		}

		// Changes of d/f's attributes may still reach the real file
		// through a handle whose release the kernel has not sent yet
		// (the way an unlinked open file is changed); what they may
		// never do is reach the outside.
		attrOnly := map[string]bool{"chmod": true, "truncate": true, "setxattr": true}
		for _, op := range []struct {
			name string
			do   func() error
		}{
			{"create", func() error { return os.WriteFile(filepath.Join(d, "new"), []byte("x"), 0o644) }},
			{"mkdir", func() error { return os.Mkdir(filepath.Join(d, "newdir"), 0o755) }},
			{"mkdir below", func() error { return os.Mkdir(filepath.Join(d, "sub", "newdir"), 0o755) }},
			{"open", func() error { _, err := os.ReadFile(filepath.Join(d, "f")); return err }},
			{"chmod", func() error { return os.Chmod(filepath.Join(d, "f"), 0o777) }},
			{"truncate", func() error { return os.Truncate(filepath.Join(d, "f"), 0) }},
			{"setxattr", func() error { return unix.Setxattr(filepath.Join(d, "f"), "user.x", []byte("y"), 0) }},
			{"symlink", func() error { return os.Symlink("t", filepath.Join(d, "link")) }},
			{"rename", func() error { return os.Rename(filepath.Join(d, "f"), filepath.Join(d, "g")) }},
			{"unlink", func() error { return os.Remove(filepath.Join(d, "f")) }},
			{"rmdir", func() error { return syscall.Rmdir(filepath.Join(d, "sub")) }},
		} {
			if err := op.do(); err == nil && forgotten && !attrOnly[op.name] {
				t.Errorf("%s under a directory swapped for a symbolic link succeeded", op.name)
			}
		}
		if after := treeOf(t, outside); after != before {
			t.Fatalf("the directory outside the data dir changed (forgotten: %v):\nbefore:\n%s\nafter:\n%s", forgotten, before, after)
		}
		must(t, os.Remove(backing))
		must(t, os.RemoveAll(moved))
		tm.mount.dirs.Forget()
		// The kernel forgets d, which is gone from the layer.
		if err := os.Remove(d); err == nil || !errors.Is(err, os.ErrNotExist) {
			t.Logf("removing d after the round: %v", err)
		}
	}
}

// TestMountTmpfileLink makes a file with O_TMPFILE and gives it a name
// with linkat, the atomic way to publish a file, on a plain volume and on
// one with a lower layer: the name shows the data, and it is the same
// file as the descriptor.
func TestMountTmpfileLink(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(string) {})
	for kind, dir := range map[string]string{"plain": filepath.Join(tm.dir, "new/alloc/logs"), "snapshot": data} {
		t.Run(kind, func(t *testing.T) {
			fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR, 0o640)
			if err != nil {
				t.Fatalf("O_TMPFILE: %v", err)
			}
			defer unix.Close(fd)
			if _, err := unix.Write(fd, []byte("published")); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "published")
			if err := unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW); err != nil {
				t.Fatalf("linkat of the unnamed file: %v", err)
			}
			got, err := os.ReadFile(p)
			if err != nil || string(got) != "published" {
				t.Errorf("the linked name reads %q, %v", got, err)
			}
			var byFd, byName unix.Stat_t
			must(t, unix.Fstat(fd, &byFd))
			must(t, unix.Lstat(p, &byName))
			if byFd.Ino != byName.Ino || byName.Nlink != 1 || byName.Mode&0o777 != 0o640 {
				t.Errorf("name: ino %d nlink %d mode %o; descriptor: ino %d", byName.Ino, byName.Nlink, byName.Mode&0o777, byFd.Ino)
			}
		})
	}
}

// TestReadSideBeyondPathMax makes a tree deeper than PATH_MAX through the
// mount and reads it back through the allocdir contract: Stat of the
// deep file, and the snapshot a migration streams, which carries it.
func TestReadSideBeyondPathMax(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir, err := unix.Open(filepath.Join(tm.dir, "a", "alloc", "data"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	var parts []string
	for i := range 25 {
		name := fmt.Sprintf("%02d", i) + strings.Repeat("d", 198)
		must(t, unix.Mkdirat(dir, name, 0o755))
		next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		must(t, err)
		unix.Close(dir)
		dir, parts = next, append(parts, name)
	}
	fd, err := unix.Openat(dir, "f", unix.O_CREAT|unix.O_WRONLY, 0o644)
	must(t, err)
	_, err = unix.Write(fd, []byte("deep"))
	unix.Close(fd)
	unix.Close(dir)
	must(t, err)
	deep := "alloc/data/" + strings.Join(parts, "/") + "/f"
	if len(deep) <= pathMax {
		t.Fatalf("test path is only %d bytes", len(deep))
	}

	ad := NewAllocDir(tm.mount.logger, tm.store, tm.mount, tm.dir, "a")
	fi, err := ad.Stat(deep)
	if err != nil || fi.Size != 4 {
		t.Fatalf("Stat of a %d-byte path: %+v, %v", len(deep), fi, err)
	}
	var buf bytes.Buffer
	must(t, ad.Snapshot(&buf))
	snap := buf.Bytes()
	tr := tar.NewReader(bytes.NewReader(snap))
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("the snapshot has no %d-byte entry for the deep file: %v", len(deep), err)
		}
		if h.Name == deep {
			body, err := io.ReadAll(tr)
			if err != nil || string(body) != "deep" {
				t.Errorf("the deep file in the snapshot reads %q, %v", body, err)
			}
			break
		}
	}

	// The receiving node of a remote migration takes it whole.
	dest := filepath.Join(t.TempDir(), "received")
	if _, err := snapshot.Extract(bytes.NewReader(snap), dest, snapshot.ExtractOptions{}); err != nil {
		t.Fatalf("extracting a snapshot with a %d-byte entry: %v", len(deep), err)
	}
	root, err := unix.Open(dest, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(root)
	fd, err = allocdir.OpenBeneath(root, deep, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("the extracted deep file: %v", err)
	}
	f := os.NewFile(uintptr(fd), deep)
	defer f.Close()
	if body, err := io.ReadAll(f); err != nil || string(body) != "deep" {
		t.Errorf("the extracted deep file reads %q, %v", body, err)
	}
}

// openFds counts this process's open descriptors.
func openFds(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	must(t, err)
	return len(entries)
}

// TestMountCreateBehindStaleNegativeEntry makes a name through one view
// of a volume while the other view still caches its absence, then opens
// it with O_CREAT through the other view. The kernel sends CREATE, for
// which it checks no permission on an existing file: the open must still
// get the errors an open of that existing entry gets (EISDIR for a
// directory, EACCES for a 0600 file of another user), and leave no
// descriptor behind in the daemon.
func TestMountCreateBehindStaleNegativeEntry(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	viewA := filepath.Join(tm.dir, "a", "alloc", "data")
	viewB := filepath.Join(tm.dir, "a", "web", "alloc", "data")

	if _, err := os.Lstat(filepath.Join(viewB, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lstat before: %v", err)
	}
	must(t, os.Mkdir(filepath.Join(viewA, "x"), 0o755))
	fds := openFds(t)
	fd, err := unix.Open(filepath.Join(viewB, "x"), unix.O_CREAT|unix.O_RDONLY, 0o644)
	if err == nil {
		unix.Close(fd)
	}
	if !errors.Is(err, syscall.EISDIR) {
		t.Errorf("open(O_CREAT) of a directory behind a stale negative entry: %v, want EISDIR", err)
	}
	if got := openFds(t); got != fds {
		t.Errorf("the daemon holds %d descriptors after the refused open, %d before", got, fds)
	}

	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no user nobody to open as")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		fstest.Lacks(t, "setpriv (util-linux) is needed to open as nobody")
	}
	secret := filepath.Join(viewB, "secret")
	if _, err := os.Lstat(secret); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("lstat before: %v", err)
	}
	must(t, os.WriteFile(filepath.Join(viewA, "secret"), []byte("top secret"), 0o600))
	cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(nobody.UID), "--regid="+strconv.Itoa(nobody.GID),
		"--clear-groups", "sh", "-c", `exec 3<>"$1" && cat <&3`, "sh", secret)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "Permission denied") {
		t.Errorf("nobody's open(O_CREAT|O_RDWR) of root's 0600 file behind a stale negative entry: %v: %q, want Permission denied", err, out)
	}
	if got, err := os.ReadFile(filepath.Join(viewA, "secret")); err != nil || string(got) != "top secret" {
		t.Errorf("the file after the refused open: %q, %v", got, err)
	}
}

// TestMountTmpfileInSetgidDirectory checks that a file made with O_TMPFILE
// in a setgid directory gets the directory's group, as one made by name
// does.
func TestMountTmpfileInSetgidDirectory(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	sg := filepath.Join(tm.dir, "a", "alloc", "data", "sg")
	must(t, os.Mkdir(sg, 0o775))
	must(t, os.Chown(sg, -1, 1234))
	must(t, unix.Chmod(sg, 0o2775))
	fd, err := unix.Open(sg, unix.O_TMPFILE|unix.O_RDWR, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	must(t, unix.Fstat(fd, &st))
	byName := filepath.Join(sg, "named")
	must(t, os.WriteFile(byName, nil, 0o640))
	if st.Gid != 1234 || lstatT(t, byName).Gid != 1234 {
		t.Errorf("groups in a setgid directory of group 1234: O_TMPFILE file %d, named file %d", st.Gid, lstatT(t, byName).Gid)
	}
}
