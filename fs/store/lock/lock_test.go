package lock

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

// TestTakeOnce checks that a second Take of a held data dir fails with
// ErrLocked, that Holder says who holds it and where it serves, and that
// the lock can be taken again once released.
func TestTakeOnce(t *testing.T) {
	dir := t.TempDir()
	l, err := Take(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Describe("/mnt/allocfs"); err != nil {
		t.Fatal(err)
	}
	if _, err := Take(dir); !errors.Is(err, ErrLocked) {
		t.Errorf("a second Take: got %v, want ErrLocked", err)
	}
	if pid, mount, err := Holder(dir); err != nil || pid != os.Getpid() || mount != "/mnt/allocfs" {
		t.Errorf("Holder: pid %d, mount %q, %v; want %d, %q", pid, mount, err, os.Getpid(), "/mnt/allocfs")
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if l.Held() {
		t.Errorf("a released lock is still held")
	}
	l2, err := Take(dir)
	if err != nil {
		t.Fatalf("Take after the release: %v", err)
	}
	if err := l2.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseWhileAChildHoldsTheLock: a child forked by anything in the
// process shares the lock's descriptor until it execs (or for its life,
// if it inherited it): releasing the lock still lets the next Take in at
// once.
func TestReleaseWhileAChildHoldsTheLock(t *testing.T) {
	dir := t.TempDir()
	l, err := Take(dir)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "30")
	child.ExtraFiles = []*os.File{l.f}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Take(dir)
	if err != nil {
		t.Fatalf("Take while a child holds the released lock's descriptor: %v", err)
	}
	if err := l2.Release(); err != nil {
		t.Fatal(err)
	}
}
