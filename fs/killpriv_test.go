package fs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// setidSides returns a volume of a mounted allocation and a directory of
// the backing filesystem beside it, both owned by nobody with mode 0777,
// for tests that do the same thing on each and compare.
func setidSides(t *testing.T) (tm *testMount, vol, native string) {
	t.Helper()
	return setidSidesTuned(t, nil)
}

// setidSidesTuned is setidSides with the mount's options changed by tune,
// when it is not nil.
func setidSidesTuned(t *testing.T, tune func(*MountOptions)) (tm *testMount, vol, native string) {
	t.Helper()
	tm = newTestMountTuned(t, store.Options{}, tune)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vol = filepath.Join(tm.dir, "a", "alloc", "data")
	native = filepath.Join(filepath.Dir(tm.store.DataDir()), "native")
	must(t, os.Mkdir(native, 0o777))
	must(t, os.Chmod(native, 0o777))
	if nobody := allocdir.Nobody(); nobody != nil {
		must(t, os.Lchown(native, nobody.UID, nobody.GID))
	}
	// Let other users reach both.
	for _, d := range []string{tm.dir, native} {
		for p := filepath.Dir(d); p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
			if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
				must(t, os.Chmod(p, fi.Mode().Perm()|0o001))
			}
		}
	}
	return tm, vol, native
}

func modeOf(t *testing.T, p string) string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return "error: " + err.Error()
	}
	return fmt.Sprintf("type %o mode %04o", st.Mode&unix.S_IFMT, st.Mode&0o7777)
}

// TestSetidBitsOnCreate checks that create, mkdir and mknod keep the
// set-id and sticky bits the caller asked for, as the backing filesystem
// does for the same calls: go-fuse's loopback drops them.
func TestSetidBitsOnCreate(t *testing.T) {
	_, vol, native := setidSides(t)
	old := unix.Umask(0)
	defer unix.Umask(old)
	for _, mode := range []uint32{0o4755, 0o2755, 0o6755, 0o1777, 0o2644, 0o7777, 0o0000} {
		for _, kind := range []string{"file", "dir", "fifo"} {
			name := fmt.Sprintf("%s-%04o", kind, mode)
			for _, dir := range []string{vol, native} {
				p := filepath.Join(dir, name)
				var err error
				switch kind {
				case "file":
					var fd int
					fd, err = unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, mode)
					if err == nil {
						unix.Close(fd)
					}
				case "dir":
					err = unix.Mkdir(p, mode)
				case "fifo":
					err = unix.Mknod(p, unix.S_IFIFO|mode, 0)
				}
				if err != nil {
					t.Fatalf("%s %s: %v", kind, p, err)
				}
			}
			if got, want := modeOf(t, filepath.Join(vol, name)), modeOf(t, filepath.Join(native, name)); got != want {
				t.Errorf("%s with mode %04o: %s through the mount, %s on the backing filesystem", kind, mode, got, want)
			}
		}
	}
	// In a set-gid directory: new directories inherit the bit, files keep
	// what they asked for.
	for _, dir := range []string{vol, native} {
		must(t, os.Mkdir(filepath.Join(dir, "g"), 0o777))
		must(t, unix.Chmod(filepath.Join(dir, "g"), 0o2777))
		must(t, unix.Mkdir(filepath.Join(dir, "g", "sub"), 0o1755))
		fd, err := unix.Open(filepath.Join(dir, "g", "f"), unix.O_CREAT|unix.O_WRONLY, 0o6711)
		must(t, err)
		unix.Close(fd)
	}
	for _, name := range []string{"g/sub", "g/f"} {
		if got, want := modeOf(t, filepath.Join(vol, name)), modeOf(t, filepath.Join(native, name)); got != want {
			t.Errorf("%s in a set-gid directory: %s through the mount, %s on the backing filesystem", name, got, want)
		}
	}
}

// TestKillprivAsOwner checks, as an unprivileged owner, that writing,
// appending, truncating (by truncate(2) and by O_TRUNC) and fallocating a
// set-id file clears its set-id bits exactly as the backing filesystem
// does, through the mount and on the backing file: passthrough writes land
// as root, which would keep them.
func TestKillprivAsOwner(t *testing.T) {
	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no user nobody to write as")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		fstest.Lacks(t, "setpriv (util-linux) is needed to run a writer as nobody")
	}
	tm, vol, native := setidSides(t)
	old := unix.Umask(0)
	defer unix.Umask(old)
	actions := map[string]string{
		"write":     `printf x >> "$1"`,
		"overwrite": `printf x 1<> "$1"`,
		"truncate":  `truncate -s 1 "$1"`,
		"o_trunc":   `: > "$1"`,
		"fallocate": `fallocate -l 8192 "$1"`,
	}
	for action, script := range actions {
		for _, mode := range []uint32{0o4755, 0o2755, 0o6755, 0o2745, 0o6644, 0o0755} {
			name := fmt.Sprintf("%s-%04o", action, mode)
			for _, dir := range []string{vol, native} {
				p := filepath.Join(dir, name)
				must(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o600))
				must(t, os.Lchown(p, nobody.UID, nobody.GID))
				must(t, unix.Chmod(p, mode))
				cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(nobody.UID), "--regid="+strconv.Itoa(nobody.GID),
					"--clear-groups", "sh", "-c", script, "sh", p)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s of %s as nobody: %v: %s", action, p, err, out)
				}
			}
			want := modeOf(t, filepath.Join(native, name))
			if got := modeOf(t, filepath.Join(vol, name)); got != want {
				t.Errorf("%s of a %04o file as its owner: %s through the mount, %s on the backing filesystem", action, mode, got, want)
			}
			st, err := tm.store.Get("a")
			must(t, err)
			backing := filepath.Join(tm.store.LayerPath(st.Volumes["alloc/data"].Upper), name)
			if got := modeOf(t, backing); got != want {
				t.Errorf("%s of a %04o file as its owner: the layer holds %s, want %s", action, mode, got, want)
			}
		}
	}
	// The rule is the kernel's, not ours: check that the reference did
	// clear something, so that the comparison above means something.
	if got := modeOf(t, filepath.Join(native, "write-6755")); got != "type 100000 mode 0755" {
		t.Fatalf("the backing filesystem kept set-id bits on an unprivileged write (%s): the test's premise is wrong", got)
	}
}

// TestNoopChownStampsCtime checks that chown(f, -1, -1), which changes
// neither owner nor group, still updates the change time, as the backing
// filesystem does.
func TestNoopChownStampsCtime(t *testing.T) {
	_, vol, native := setidSides(t)
	for _, dir := range []string{vol, native} {
		must(t, os.WriteFile(filepath.Join(dir, "f"), nil, 0o644))
	}
	var before [2]unix.Stat_t
	for i, dir := range []string{vol, native} {
		must(t, unix.Lstat(filepath.Join(dir, "f"), &before[i]))
	}
	// The clock must move on for a new ctime to differ.
	for {
		var now unix.Timespec
		must(t, unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &now))
		if now.Nano() > before[0].Ctim.Nano() && now.Nano() > before[1].Ctim.Nano() {
			break
		}
	}
	for i, dir := range []string{vol, native} {
		p := filepath.Join(dir, "f")
		must(t, unix.Lchown(p, -1, -1))
		var after unix.Stat_t
		must(t, unix.Lstat(p, &after))
		changed := after.Ctim != before[i].Ctim
		if dir == native && !changed {
			t.Fatalf("the backing filesystem kept the ctime on chown -1:-1: the test's premise is wrong")
		}
		if dir == vol && !changed {
			t.Errorf("chown -1:-1 through the mount left ctime at %v", after.Ctim)
		}
	}
}

// TestOpensOfAFileWhoseSetidBitsChange opens and closes one file from
// several goroutines while another sets and clears its set-id bits, so
// that each open chooses between the kernel (passthrough) and the daemon
// (a set-id file) while handles of the other kind are being opened and
// released. The kernel fails with EIO an open whose kind differs from the
// inode's open handles: the choice and its count are one step, and a
// release is finished before an open of its inode starts.
func TestOpensOfAFileWhoseSetidBitsChange(t *testing.T) {
	_, vol, _ := setidSides(t)
	p := filepath.Join(vol, "toggled")
	must(t, os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755))
	const rounds = 4000
	stop := make(chan struct{})
	toggled := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				toggled <- nil
				return
			default:
			}
			mode := uint32(0o755)
			if i%2 == 0 {
				mode = 0o4755
			}
			if err := unix.Chmod(p, mode); err != nil {
				toggled <- err
				return
			}
		}
	}()
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range rounds {
				fd, err := unix.Open(p, unix.O_RDONLY, 0)
				if err != nil {
					errs <- err
					return
				}
				unix.Close(fd)
			}
			errs <- nil
		}()
	}
	var failed error
	for range 4 {
		if err := <-errs; err != nil && failed == nil {
			failed = err
		}
	}
	close(stop)
	if err := <-toggled; err != nil {
		t.Fatalf("chmod: %v", err)
	}
	if failed != nil {
		t.Fatalf("open of a file whose set-id bits change: %v", failed)
	}
}
