package fstest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Image makes a filesystem of kind ("btrfs", "xfs", "ext4") in a sparse
// file of sizeMB under the test's temporary directory, mounts it on a
// loop device with the mount options opts, and returns the mount point.
// The test's cleanup unmounts it (lazily if something still holds it)
// and the loop device goes with the file. A machine without the mkfs
// tool or loop devices lacks what the test needs (Lacks).
func Image(t testing.TB, kind string, sizeMB int, opts string, mkfsArgs ...string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		Lacks(t, "a %s image needs root to mount", kind)
	}
	mkfs, err := exec.LookPath("mkfs." + kind)
	if err != nil {
		Lacks(t, "mkfs.%s is missing (.ci/run installs it): %v", kind, err)
	}
	dir := t.TempDir()
	img := filepath.Join(dir, kind+".img")
	f, err := os.Create(img)
	if err == nil {
		err = f.Truncate(int64(sizeMB) << 20)
		f.Close()
	}
	if err != nil {
		t.Fatalf("image file: %v", err)
	}
	args := append(append([]string{}, mkfsArgs...), img)
	if kind == "btrfs" || kind == "xfs" {
		args = append([]string{"-f", "-q"}, args...)
	} else {
		args = append([]string{"-F", "-q"}, args...)
	}
	if out, err := exec.Command(mkfs, args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.%s %s: %v\n%s", kind, strings.Join(args, " "), err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	margs := []string{"-o", "loop"}
	if opts != "" {
		margs = []string{"-o", "loop," + opts}
	}
	if out, err := exec.Command("mount", append(margs, img, mnt)...).CombinedOutput(); err != nil {
		Lacks(t, "cannot mount a %s image on a loop device: %v: %s", kind, err, out)
	}
	t.Cleanup(func() {
		for i := 0; ; i++ {
			err := unix.Unmount(mnt, 0)
			if err == nil || err == unix.EINVAL {
				return
			}
			if i == 50 {
				t.Errorf("unmount %s: %v; detaching it", mnt, err)
				unix.Unmount(mnt, unix.MNT_DETACH)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return mnt
}
