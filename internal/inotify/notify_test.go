//go:build linux

package inotify

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// woken waits for one wake-up of s. The bound is generous: it only decides
// when to give up, and a healthy run is woken in microseconds.
func woken(s *Subscription) bool {
	select {
	case <-s.C:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// quiet reports whether s stays unwoken for a moment.
func quiet(s *Subscription) bool {
	select {
	case <-s.C:
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

func newNotifier(t *testing.T) *Notifier {
	t.Helper()
	n, err := New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return n
}

// TestNotifierFollowsDown checks that a subscription for a path whose
// directories do not exist yet watches the deepest one that does, and is
// woken, level by level, as the rest appear; writes to the target wake it
// too, writes to its neighbours do not.
func TestNotifierFollowsDown(t *testing.T) {
	root := t.TempDir()
	n := newNotifier(t)
	s := n.Subscribe("a1")
	defer s.Close()

	rel := "x/y/file"
	for _, step := range []string{"x", "x/y"} {
		if err := s.Arm(root, rel); err != nil {
			t.Fatalf("Arm: %v", err)
		}
		if err := os.Mkdir(filepath.Join(root, step), 0o755); err != nil {
			t.Fatal(err)
		}
		if !woken(s) {
			t.Fatalf("no wake-up for mkdir %s", step)
		}
	}
	if err := s.Arm(root, rel); err != nil {
		t.Fatalf("Arm: %v", err)
	}
	if err := os.WriteFile(filepath.Join(root, "x/y/neighbour"), []byte("n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !quiet(s) {
		t.Errorf("woken by a neighbour's creation")
	}
	p := filepath.Join(root, rel)
	if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !woken(s) {
		t.Fatalf("no wake-up for the target's creation")
	}
	f, err := os.OpenFile(p, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for len(s.C) > 0 {
		<-s.C
	}
	if _, err := f.WriteString("2"); err != nil {
		t.Fatal(err)
	}
	if !woken(s) {
		t.Fatalf("no wake-up for a write to the open target")
	}
}

// TestNotifierDirectoryGone checks that removing the watched directory
// wakes its follower, which can then re-arm higher up, and that the
// notifier drops the dead watch.
func TestNotifierDirectoryGone(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n := newNotifier(t)
	s := n.Subscribe("a1")
	defer s.Close()
	if err := s.Arm(root, "d/f"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if !woken(s) {
		t.Fatal("no wake-up when the watched directory went away")
	}
	// The kernel drops the watch just after: wait for the IN_IGNORED.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n.mu.Lock()
		left := len(n.watches)
		n.mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d watches left after their directory went away", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Arm(root, "d/f"); err != nil {
		t.Fatalf("re-Arm: %v", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if !woken(s) {
		t.Fatal("no wake-up when the directory came back")
	}
}

// TestNotifierSharesWatches checks one watch per directory, released with
// its last subscription, and Wake by tag.
func TestNotifierSharesWatches(t *testing.T) {
	root := t.TempDir()
	n := newNotifier(t)
	a, b, other := n.Subscribe("a1"), n.Subscribe("a1"), n.Subscribe("a2")
	for _, s := range []*Subscription{a, b, other} {
		if err := s.Arm(root, "f"); err != nil {
			t.Fatal(err)
		}
	}
	n.mu.Lock()
	watches := len(n.watches)
	n.mu.Unlock()
	if watches != 1 {
		t.Errorf("three subscriptions on one directory hold %d watches, want 1", watches)
	}
	n.Wake("a1")
	if !woken(a) || !woken(b) {
		t.Error("Wake(a1) did not wake both a1 subscriptions")
	}
	if !quiet(other) {
		t.Error("Wake(a1) woke an a2 subscription")
	}
	for _, s := range []*Subscription{a, b, other} {
		s.Close()
	}
	n.mu.Lock()
	watches, subs := len(n.watches), len(n.subs)
	n.mu.Unlock()
	if watches != 0 || subs != 0 {
		t.Errorf("after closing every subscription: %d watches, %d subscriptions; want none", watches, subs)
	}
}

// TestNotifierDirectoryRenamed checks that a watched directory renamed
// away and made again at the same path is watched anew: the watch of the
// old one (it follows its inode) must not stand in for the new one.
func TestNotifierDirectoryRenamed(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "logs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	n := newNotifier(t)
	s := n.Subscribe("a1")
	defer s.Close()
	if err := s.Arm(root, "logs/web.stdout.1"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(dir, filepath.Join(root, "logs.old")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if !woken(s) {
		t.Fatal("no wake-up when the watched directory was renamed")
	}
	for len(s.C) > 0 {
		<-s.C
	}
	if err := s.Arm(root, "logs/web.stdout.1"); err != nil {
		t.Fatalf("re-Arm: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "web.stdout.1"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !woken(s) {
		t.Fatal("no wake-up for a file created in the new directory")
	}
}
