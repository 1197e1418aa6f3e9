//go:build linux

package fstest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/internal/fusectl"
	"golang.org/x/sys/unix"
)

// fusectlChildEnv marks a test binary run by WithFusectl, and says what
// it must make of /sys/fs/fuse/connections: "mounted" or "unmounted".
const fusectlChildEnv = "ALLOCFS_TEST_FUSECTL"

// WithFusectl makes the rest of the calling test run where fusectl is
// mounted at /sys/fs/fuse/connections (mounted) or where nothing is (as
// on a host that never mounted it). Where that already holds, it returns
// false and the test goes on. Otherwise it runs the test again in a
// child process of the test binary, in a private mount namespace where
// the child mounts or unmounts fusectl first, makes the child's result
// the test's, and returns true: the caller returns at once. Code under
// test must not depend on the host's state; a test of that says which
// state it runs in.
func WithFusectl(t *testing.T, mounted bool) bool {
	t.Helper()
	want := map[bool]string{true: "mounted", false: "unmounted"}[mounted]
	if got := os.Getenv(fusectlChildEnv); got != "" {
		if got != want {
			t.Fatalf("%s=%s in a test that wants fusectl %s", fusectlChildEnv, got, want)
		}
		if err := setFusectl(mounted); err != nil {
			t.Fatalf("in the test's own mount namespace: %v", err)
		}
		return false
	}
	if fusectl.Mounted() == mounted {
		return false
	}
	if os.Geteuid() != 0 {
		t.Skipf("a private mount namespace with fusectl %s needs root", want)
	}
	var pattern []string
	for _, part := range strings.Split(t.Name(), "/") {
		pattern = append(pattern, "^"+regexp.QuoteMeta(part)+"$")
	}
	ctx := context.Background()
	args := []string{"-test.run", strings.Join(pattern, "/"), "-test.count", "1", "-test.v"}
	if d, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d.Add(-5*time.Second))
		defer cancel()
		args = append(args, "-test.timeout", time.Until(d).String())
	}
	cmd := exec.CommandContext(ctx, os.Args[0], args...)
	cmd.Env = append(os.Environ(), fusectlChildEnv+"="+want)
	// A copy of the mount table, private from the first mount on: what
	// the child mounts and unmounts is its own.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	t.Logf("the test, run again in a private mount namespace with fusectl %s:\n%s", want, out)
	if err != nil {
		t.Fatalf("in a private mount namespace with fusectl %s: %v", want, err)
	}
	switch {
	case strings.Contains(string(out), "--- SKIP: "+t.Name()):
		t.Skip("skipped in the private mount namespace (see its output above)")
	case !strings.Contains(string(out), "--- PASS: "+t.Name()):
		t.Fatalf("the child ran no test named %s", t.Name())
	}
	return true
}

// setFusectl mounts or unmounts fusectl at its place, in this process's
// mount namespace.
func setFusectl(mounted bool) error {
	for fusectl.Mounted() != mounted {
		if mounted {
			if err := unix.Mount("fusectl", fusectl.MountPoint, "fusectl", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				return fmt.Errorf("mount fusectl at %s: %w", fusectl.MountPoint, err)
			}
			continue
		}
		if err := unix.Unmount(fusectl.MountPoint, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", fusectl.MountPoint, err)
		}
	}
	return nil
}
