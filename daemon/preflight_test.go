//go:build linux

package daemon

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
)

// testLogger writes to the test's log; see allocdirtest.Logger.
var testLogger = allocdirtest.Logger

// TestCheckLayout: a mount point that would hide the store, or a socket
// inside the mount, is refused before anything is touched.
func TestCheckLayout(t *testing.T) {
	cases := []struct {
		name   string
		cfg    Config
		refuse bool
	}{
		{"default", Config{DataDir: "/d", MountDir: "/d/mnt", Socket: "/d/allocfs.sock"}, false},
		{"elsewhere", Config{DataDir: "/d", MountDir: "/m", Socket: "/run/a.sock"}, false},
		{"prefix is not a parent", Config{DataDir: "/d", MountDir: "/dx", Socket: "/d/s"}, false},
		{"mount is the data dir", Config{DataDir: "/d", MountDir: "/d", Socket: "/s"}, true},
		{"mount above the data dir", Config{DataDir: "/var/lib/d", MountDir: "/var", Socket: "/s"}, true},
		{"mount at /", Config{DataDir: "/d", MountDir: "/", Socket: "/s"}, true},
		{"mount in layers", Config{DataDir: "/d", MountDir: "/d/layers/x", Socket: "/s"}, true},
		{"mount is state", Config{DataDir: "/d", MountDir: "/d/state", Socket: "/s"}, true},
		{"socket in mount", Config{DataDir: "/d", MountDir: "/m", Socket: "/m/a.sock"}, true},
	}
	for _, c := range cases {
		err := checkLayout(c.cfg)
		if (err != nil) != c.refuse {
			t.Errorf("%s: got %v, want refused=%t", c.name, err, c.refuse)
		}
	}
}

// TestPrepareMountPoint: a missing mount point is created, a file is
// refused, a live allocfs mount in the mount table is refused, and a
// directory with files in it is refused unless --allow-non-empty.
func TestPrepareMountPoint(t *testing.T) {
	root := t.TempDir()
	logger := testLogger(t)
	emptyInfo := filepath.Join(root, "mountinfo")
	if err := os.WriteFile(emptyInfo, []byte("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	missing := filepath.Join(root, "a", "b", "mnt")
	if err := prepareMountPoint(logger, missing, emptyInfo, false); err != nil {
		t.Fatalf("missing mount point: %v", err)
	}
	if fi, err := os.Stat(missing); err != nil || !fi.IsDir() {
		t.Errorf("mount point not created: %v", err)
	}

	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := prepareMountPoint(logger, file, emptyInfo, false)
	if err == nil || !strings.Contains(err.Error(), "is not a directory (a regular file)") {
		t.Errorf("file as mount point: got %v, want 'is not a directory'", err)
	}

	live := filepath.Join(root, "live")
	if err := os.Mkdir(live, 0o755); err != nil {
		t.Fatal(err)
	}
	liveInfo := filepath.Join(root, "mountinfo-live")
	line := "40 22 0:50 / " + strings.ReplaceAll(live, " ", `\040`) + " rw - fuse.allocfs allocfs:/x rw\n"
	if err := os.WriteFile(liveInfo, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	err = prepareMountPoint(logger, live, liveInfo, false)
	if want := "another allocfs is serving " + live + "; stop it first"; err == nil || err.Error() != want {
		t.Errorf("live allocfs mount: got %v, want %q", err, want)
	}

	// A directory with files in it would hide them: refused, and left
	// as it was, unless asked.
	full := filepath.Join(root, "full")
	if err := os.MkdirAll(filepath.Join(full, "kept"), 0o755); err != nil {
		t.Fatal(err)
	}
	err = prepareMountPoint(logger, full, emptyInfo, false)
	if err == nil || !strings.Contains(err.Error(), "is not empty (kept)") || !strings.Contains(err.Error(), "--allow-non-empty") {
		t.Errorf("non-empty mount point: got %v, want a refusal naming kept and --allow-non-empty", err)
	}
	if _, err := os.Stat(filepath.Join(full, "kept")); err != nil {
		t.Errorf("the refused mount point's entry: %v", err)
	}
	if err := prepareMountPoint(logger, full, emptyInfo, true); err != nil {
		t.Errorf("non-empty mount point with --allow-non-empty: %v", err)
	}
}

// TestListenSocket: the socket is 0600, a stale one is replaced, a live
// one or a non-socket file is refused.
func TestListenSocket(t *testing.T) {
	logger := testLogger(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "sub", "allocfs.sock")

	ln, err := listenSocket(logger, sock)
	if err != nil {
		t.Fatalf("listenSocket: %v", err)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode: got %v, want a socket with 0600", fi.Mode())
	}
	if _, err := listenSocket(logger, sock); err == nil || !strings.Contains(err.Error(), "another allocfs is listening") {
		t.Errorf("second listener on a live Socket: got %v, want refusal", err)
	}

	// A socket file nobody listens on any more is stale.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	ln, err = listenSocket(logger, sock)
	if err != nil {
		t.Fatalf("listenSocket over a stale Socket: %v", err)
	}
	ln.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := listenSocket(logger, file); err == nil {
		t.Errorf("listenSocket over a regular file: got no error")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Errorf("regular file touched: %q, %v", b, err)
	}

	if _, err := listenSocket(logger, "/"+strings.Repeat("x", 120)); err == nil {
		t.Errorf("a socket path over 107 bytes: got no error")
	}
}
