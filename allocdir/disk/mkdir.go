//go:build linux

package disk

import (
	"errors"
	"io/fs"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
)

// unixPerm converts the permission, setuid, setgid and sticky bits of an
// fs.FileMode to st_mode bits.
func unixPerm(m fs.FileMode) uint32 {
	bits := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		bits |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		bits |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		bits |= syscall.S_ISVTX
	}
	return bits
}

// ensureDir creates the directory name under parentFd if it is missing,
// forces its mode (so the umask never matters) and owner, and returns an
// open fd of it. An existing symbolic link in its place is refused, never
// followed: a task that replaced one of the layout's directories with a
// link must not get the agent to chmod or chown the link's target.
func ensureDir(parentFd int, name string, mode fs.FileMode, o *allocdir.Owner) (int, error) {
	if err := unix.Mkdirat(parentFd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, &fs.PathError{Op: "mkdir", Path: name, Err: err}
	}
	fd, err := allocdir.OpenBeneath(parentFd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.Fchmod(fd, unixPerm(mode)); err != nil {
		unix.Close(fd)
		return -1, &fs.PathError{Op: "chmod", Path: name, Err: err}
	}
	if o != nil {
		if err := unix.Fchown(fd, o.UID, o.GID); err != nil {
			unix.Close(fd)
			return -1, &fs.PathError{Op: "chown", Path: name, Err: err}
		}
	}
	return fd, nil
}
