//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// listenSocket binds the control socket with mode 0600 (the API can
// destroy allocations). A socket left by a daemon that died is removed; one
// that still answers belongs to a live daemon, and anything that is not a
// socket is left alone.
//
// The umask is set to 0177 around bind(2) so the socket never exists with
// a wider mode, then chmod makes sure of it. This must happen before
// fs.NewMount: the FUSE server, which runs with umask 0, must not see it
// change while it creates files.
func listenSocket(logger hclog.Logger, path string) (net.Listener, error) {
	// sun_path holds 108 bytes including the terminating NUL.
	if len(path) > 107 {
		return nil, fmt.Errorf("socket path %q is %d bytes, more than a unix socket allows (107): pass a shorter --socket", path, len(path))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("failed to create the socket's directory: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() == os.ModeSocket:
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			conn.Close()
			return nil, fmt.Errorf("another allocfs is listening on %s; stop it first", path)
		}
		logger.Info("removing stale socket", "socket", path)
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("failed to remove stale socket %q: %w", path, err)
		}
	case err == nil:
		return nil, fmt.Errorf("%q exists and is not a socket (%s): move it away or pass another --socket", path, fi.Mode().Type())
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("failed to inspect socket path %q: %w", path, err)
	}

	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %q: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("failed to restrict socket %q to its owner: %w", path, err)
	}
	return ln, nil
}
