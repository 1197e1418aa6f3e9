//go:build linux

package fusectl

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// MountPoint is where the host mounts fusectl, when it does.
const MountPoint = "/sys/fs/fuse/connections"

// superMagic is fusectl's f_type (FUSE_CTL_SUPER_MAGIC).
const superMagic = 0x65735543

// Dir is an open fusectl root.
type Dir struct {
	fd int
	// detached says the instance is this process's own, not the host's
	// mount at MountPoint.
	detached bool
}

// Open returns the fusectl root: the host's at MountPoint where it is
// mounted, else an instance of this process's own, mounted detached.
func Open() (*Dir, error) {
	if fd, err := unix.Open(MountPoint, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
		var sfs unix.Statfs_t
		if err := unix.Fstatfs(fd, &sfs); err == nil && sfs.Type == superMagic {
			return &Dir{fd: fd}, nil
		}
		unix.Close(fd)
	}
	fd, err := mountDetached()
	if err != nil {
		return nil, fmt.Errorf("fusectl is not mounted at %s, and a private instance could not be made: %w", MountPoint, err)
	}
	return &Dir{fd: fd, detached: true}, nil
}

// mountDetached makes a fusectl instance reachable only through the
// descriptor it returns.
func mountDetached() (int, error) {
	fsfd, err := unix.Fsopen("fusectl", unix.FSOPEN_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return -1, fmt.Errorf("fsopen(fusectl): %w (it needs CAP_SYS_ADMIN in the initial user namespace)", err)
		}
		return -1, fmt.Errorf("fsopen(fusectl): %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("fsconfig(fusectl, FSCONFIG_CMD_CREATE): %w", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount(fusectl): %w", err)
	}
	return fd, nil
}

// Mounted reports whether the host has fusectl at MountPoint.
func Mounted() bool {
	var sfs unix.Statfs_t
	return unix.Statfs(MountPoint, &sfs) == nil && sfs.Type == superMagic
}

// Detached reports whether d is a private instance: the host has no
// fusectl at MountPoint.
func (d *Dir) Detached() bool { return d.detached }

// Where names d for a message.
func (d *Dir) Where() string {
	if d.detached {
		return "a private fusectl instance (none is mounted at " + MountPoint + ")"
	}
	return MountPoint
}

// Close releases d; a private instance goes with it.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// Waiting returns how many requests of connection conn the kernel has
// queued or sent and not had answered.
func (d *Dir) Waiting(conn uint32) (int, error) {
	b, err := d.read(conn, "waiting")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("fusectl: connection %d: waiting holds %q", conn, b)
	}
	return n, nil
}

// Has reports whether connection conn exists.
func (d *Dir) Has(conn uint32) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d.fd, strconv.FormatUint(uint64(conn), 10), &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("fusectl: connection %d: %w", conn, err)
}

// Abort ends connection conn: every request waiting on it fails, and its
// mount answers ENOTCONN from then on (ECONNABORTED where the daemon
// negotiated FUSE_ABORT_ERROR).
func (d *Dir) Abort(conn uint32) error {
	return d.write(conn, "abort", "1")
}

func (d *Dir) path(conn uint32, name string) string {
	return strconv.FormatUint(uint64(conn), 10) + "/" + name
}

func (d *Dir) read(conn uint32, name string) ([]byte, error) {
	fd, err := unix.Openat(d.fd, d.path(conn, name), unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("fusectl: connection %d: %w", conn, err)
	}
	f := os.NewFile(uintptr(fd), d.path(conn, name))
	defer f.Close()
	b := make([]byte, 64)
	n, err := f.Read(b)
	if err != nil {
		return nil, fmt.Errorf("fusectl: connection %d: reading %s: %w", conn, name, err)
	}
	return b[:n], nil
}

func (d *Dir) write(conn uint32, name, value string) error {
	fd, err := unix.Openat(d.fd, d.path(conn, name), unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("fusectl: connection %d: %w", conn, err)
	}
	f := os.NewFile(uintptr(fd), d.path(conn, name))
	_, werr := f.Write([]byte(value))
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("fusectl: connection %d: writing %s: %w", conn, name, werr)
	}
	return nil
}

var shared struct {
	mu  sync.Mutex
	dir *Dir
}

// Shared returns a Dir the process keeps open for its lifetime, opened
// on first use; a failed open is tried again on the next call.
func Shared() (*Dir, error) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.dir != nil {
		return shared.dir, nil
	}
	d, err := Open()
	if err != nil {
		return nil, err
	}
	shared.dir = d
	return d, nil
}

// Conn returns the connection of a FUSE mount from its device as
// /proc/self/mountinfo shows it ("0:52").
func Conn(device string) (uint32, error) {
	_, minor, ok := strings.Cut(device, ":")
	n, err := strconv.ParseUint(minor, 10, 32)
	if !ok || err != nil {
		return 0, fmt.Errorf("fusectl: %q is not a device number", device)
	}
	return uint32(n), nil
}
