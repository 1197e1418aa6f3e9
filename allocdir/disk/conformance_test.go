//go:build linux

package disk_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/allocdir/disk"
	"github.com/hashicorp/go-hclog"
)

// TestDiskConformance runs the conformance suite against the on-disk
// implementation, one store directory per case.
func TestDiskConformance(t *testing.T) {
	allocdirtest.Run(t, func(t *testing.T) func(string) allocdir.Interface {
		root := t.TempDir()
		return func(id string) allocdir.Interface {
			d, err := disk.New(hclog.NewNullLogger(), root, id)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
	})
}

// TestDiskConformanceAsNobody runs the same suite again in a child
// process as the user nobody, so that the paths an agent without root
// takes (plain secrets directories, no chown, removing trees a task left
// read-only) are exercised on every run, including CI's, which is root.
func TestDiskConformanceAsNobody(t *testing.T) {
	if os.Getenv("ALLOCFS_SUITE_AS_NOBODY") == "1" {
		t.Skip("already the non-root child")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as nobody (this run is already non-root)")
	}
	nobody := allocdir.Nobody()
	if nobody == nil {
		t.Skip("this system has no user nobody")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary sits in a directory only root can enter; give the
	// child a copy it can execute and a temporary directory it owns.
	dir, err := os.MkdirTemp("", "allocfs-nobody-*")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "disk.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, tmp} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(tmp, nobody.UID, nobody.GID); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run", "^TestDiskConformance$", "-test.count", "1")
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "ALLOCFS_SUITE_AS_NOBODY=1", "TMPDIR="+tmp, "HOME="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(nobody.UID), Gid: uint32(nobody.GID)}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the suite as nobody (uid %d) failed: %v\n%s", nobody.UID, err, out)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("the suite as nobody ran nothing:\n%s", out)
	}
}
