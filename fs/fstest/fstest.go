// Package fstest holds what tests of allocfs share to work against real
// mounts: the gate that decides whether this machine can mount.
package fstest

import (
	"fmt"
	"os"
	"testing"
)

// RequireFUSE skips the test, with the reason, unless this process can
// mount FUSE filesystems (a /dev/fuse character device, and root, which
// allow_other and passthrough need). With ALLOCFS_REQUIRE_FUSE=1 the
// missing capability is a failure instead, so that CI on a FUSE-capable
// machine cannot silently skip the mount tests.
func RequireFUSE(t testing.TB) {
	t.Helper()
	reason := ""
	if fi, err := os.Stat("/dev/fuse"); err != nil {
		reason = fmt.Sprintf("/dev/fuse is missing (%v): load the fuse module", err)
	} else if fi.Mode().Type() != os.ModeDevice|os.ModeCharDevice {
		reason = "/dev/fuse is not a character device"
	} else if os.Geteuid() != 0 {
		reason = fmt.Sprintf("mount tests run as root (allow_other and passthrough need it), euid is %d", os.Geteuid())
	}
	if reason == "" {
		return
	}
	if os.Getenv("ALLOCFS_REQUIRE_FUSE") == "1" {
		t.Fatalf("ALLOCFS_REQUIRE_FUSE=1 but FUSE is unusable: %s", reason)
	}
	t.Skip(reason)
}

// Lacks skips the test because this machine lacks what it needs (a
// tool, a user, a kernel facility), with the reason; with
// ALLOCFS_REQUIRE_FUSE=1, which CI sets, it fails instead: .ci/run sets
// up everything the tests need on a fresh machine, so a lack there is a
// step missing from it, not a reason to test less.
func Lacks(t testing.TB, format string, args ...any) {
	t.Helper()
	reason := fmt.Sprintf(format, args...)
	if os.Getenv("ALLOCFS_REQUIRE_FUSE") == "1" {
		t.Fatalf("ALLOCFS_REQUIRE_FUSE=1 (CI), and this machine lacks what the test needs: %s", reason)
	}
	t.Skip(reason)
}
