//go:build linux

package fusectl_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/internal/fusectl"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// mountEmpty mounts an empty FUSE filesystem and returns its directory
// and connection.
func mountEmpty(t *testing.T) (string, uint32) {
	t.Helper()
	fstest.RequireFUSE(t)
	dir := t.TempDir()
	server, err := gofs.Mount(dir, &gofs.Inode{}, &gofs.Options{})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	t.Cleanup(func() {
		if err := server.Unmount(); err != nil {
			unix.Unmount(dir, unix.MNT_DETACH)
		}
	})
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	return dir, unix.Minor(st.Dev)
}

// statfsWithin runs statfs(dir), giving up after d: an aborted or hung
// mount must not hang the test.
func statfsWithin(dir string, d time.Duration) error {
	done := make(chan error, 1)
	go func() {
		var sfs unix.Statfs_t
		done <- unix.Statfs(dir, &sfs)
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return errors.New("no answer")
	}
}

// checkConnection: d sees a live connection, with nothing waiting, and
// an abort through d ends it.
func checkConnection(t *testing.T, d *fusectl.Dir) {
	dir, conn := mountEmpty(t)
	if ok, err := d.Has(conn); !ok || err != nil {
		t.Fatalf("Has(%d) of a mounted connection: %v, %v; want true", conn, ok, err)
	}
	// go-fuse opens and closes a file of its new mount once it is up
	// (its poll workaround), and close(2) does not wait for the RELEASE:
	// it may still be waiting a moment after the mount returns.
	n, err := d.Waiting(conn)
	for deadline := time.Now().Add(5 * time.Second); n != 0 && err == nil && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		n, err = d.Waiting(conn)
	}
	if n != 0 || err != nil {
		t.Errorf("Waiting(%d) of an idle connection: %d, %v; want 0", conn, n, err)
	}
	if err := statfsWithin(dir, 10*time.Second); err != nil {
		t.Fatalf("statfs of the live mount: %v", err)
	}
	if err := d.Abort(conn); err != nil {
		t.Fatalf("Abort(%d): %v", conn, err)
	}
	if err := statfsWithin(dir, 10*time.Second); !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED) {
		t.Errorf("statfs after the abort: %v, want ENOTCONN or ECONNABORTED", err)
	}
}

// TestWithoutHostFusectl: where nothing is mounted at
// /sys/fs/fuse/connections, Open makes a private instance that shows in
// no mount table, and it reads and aborts connections.
func TestWithoutHostFusectl(t *testing.T) {
	if fstest.WithFusectl(t, false) {
		return
	}
	fstest.RequireFUSE(t)
	d, err := fusectl.Open()
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer d.Close()
	if !d.Detached() {
		t.Fatalf("Open with nothing at %s: not a private instance", fusectl.MountPoint)
	}
	if fusectl.Mounted() {
		t.Fatalf("the private instance shows at %s", fusectl.MountPoint)
	}
	checkConnection(t, d)
}

// TestWithHostFusectl: where the host mounted fusectl, Open uses it.
func TestWithHostFusectl(t *testing.T) {
	if fstest.WithFusectl(t, true) {
		return
	}
	fstest.RequireFUSE(t)
	d, err := fusectl.Open()
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer d.Close()
	if d.Detached() {
		t.Fatalf("Open with fusectl at %s made a private instance", fusectl.MountPoint)
	}
	checkConnection(t, d)
}

// TestUnknownConnection: a connection that does not exist is reported as
// such by every call, and nothing is written.
func TestUnknownConnection(t *testing.T) {
	fstest.RequireFUSE(t)
	d, err := fusectl.Shared()
	if err != nil {
		t.Fatalf("Shared: %v", err)
	}
	const none = math.MaxUint32
	if ok, err := d.Has(none); ok || err != nil {
		t.Errorf("Has(%d): %v, %v; want false", uint32(none), ok, err)
	}
	if _, err := d.Waiting(none); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Waiting(%d): %v, want ENOENT", uint32(none), err)
	}
	if err := d.Abort(none); !errors.Is(err, unix.ENOENT) {
		t.Errorf("Abort(%d): %v, want ENOENT", uint32(none), err)
	}
	again, err := fusectl.Shared()
	if err != nil || again != d {
		t.Errorf("a second Shared: %p, %v; want the same Dir %p", again, err, d)
	}
}

// TestConn: the connection is the minor of a mount's device.
func TestConn(t *testing.T) {
	for _, c := range []struct {
		device string
		want   uint32
		ok     bool
	}{
		{"0:52", 52, true},
		{"0:1234", 1234, true},
		{"8:1", 1, true},
		{"52", 0, false},
		{"0:", 0, false},
		{"0:x", 0, false},
		{"0:99999999999", 0, false},
	} {
		got, err := fusectl.Conn(c.device)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("Conn(%q) = %d, %v; want %d, ok %v", c.device, got, err, c.want, c.ok)
		}
	}
}
