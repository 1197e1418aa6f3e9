package fstest

import (
	"fmt"
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
	mnt, err := TryImage(t, kind, sizeMB, opts, mkfsArgs...)
	if err != nil {
		Lacks(t, "%v", err)
	}
	return mnt
}

// TryImage is Image that returns what stops it (no root, no mkfs tool,
// a mount the kernel refuses) instead of skipping the test.
func TryImage(t testing.TB, kind string, sizeMB int, opts string, mkfsArgs ...string) (string, error) {
	t.Helper()
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("a %s image needs root to mount", kind)
	}
	mkfs, err := exec.LookPath("mkfs." + kind)
	if err != nil {
		return "", fmt.Errorf("mkfs.%s is missing (.ci/run installs it): %w", kind, err)
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
		return "", fmt.Errorf("cannot mount a %s image with -o %s on a loop device: %v: %s", kind, strings.Join(margs[1:], ","), err, strings.TrimSpace(string(out)))
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
	return mnt, nil
}

// ProjectQuotaDir returns a new directory on a filesystem that enforces
// project quotas: under ALLOCFS_TEST_PRJQUOTA_DIR when it is set (xfs
// mounted -o prjquota, or ext4 made -O quota,project and mounted -o
// prjquota), or on an xfs image mounted with prjquota. A kernel that
// cannot mount one (Linux 6.18 here is built without CONFIG_XFS_QUOTA
// and CONFIG_QFMT_V2) skips the test, saying so: CI cannot set up what
// the kernel lacks.
func ProjectQuotaDir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("ALLOCFS_TEST_PRJQUOTA_DIR"); dir != "" {
		d, err := os.MkdirTemp(dir, "prjquota-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	mnt, err := TryImage(t, "xfs", 600, "prjquota")
	if err != nil {
		t.Skipf("no filesystem with project quotas here: %v. The project-quota tests run where the kernel has them: "+
			"set ALLOCFS_TEST_PRJQUOTA_DIR to a directory on xfs -o prjquota or on ext4 -O quota,project -o prjquota", err)
	}
	return mnt
}

// WriteUntil writes n bytes to a new file at path (mode, and O_TRUNC of
// one that exists) in writes of 1 MiB, then syncs them, and returns how
// many it wrote and the error that stopped it: what the disk-limit
// tests write past a limit with.
func WriteUntil(path string, mode os.FileMode, n int) (int, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = 'z'
	}
	done := 0
	for done < n {
		w, err := f.Write(buf[:min(len(buf), n-done)])
		done += w
		if err != nil {
			return done, err
		}
	}
	return done, f.Sync()
}
