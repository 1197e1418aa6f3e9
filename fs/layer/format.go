package layer

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpaqueXattr marks an upper directory that hides the lower layers at its
// path; its value is "y".
const OpaqueXattr = "trusted.overlay.opaque"

// IsWhiteout reports whether st has a whiteout's type: a character
// device 0/0. It may be a task's own device (see IsWhiteoutAt).
func IsWhiteout(st *syscall.Stat_t) bool {
	return st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == 0
}

// RealDeviceXattr marks a character device 0/0 that a task made (mknod,
// or rename with RENAME_WHITEOUT, which any user may do): it is the task's
// file, shown like any device, not a whiteout. The kernel's overlayfs
// would take it for a whiteout; allocfs never does.
const RealDeviceXattr = "trusted.overlay.allocfs.device"

// IsWhiteoutAt reports whether p, whose lstat is st, is a whiteout: a
// character device 0/0 that is not a task's own (RealDeviceXattr).
func IsWhiteoutAt(p string, st *syscall.Stat_t) bool {
	if !IsWhiteout(st) {
		return false
	}
	_, err := unix.Lgetxattr(p, RealDeviceXattr, nil)
	return err != nil
}

// MarkRealDevice records that the character device 0/0 at p is a task's
// own, not a whiteout. Other entries need no mark.
func MarkRealDevice(p string) error {
	if err := unix.Lsetxattr(p, RealDeviceXattr, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "setxattr " + RealDeviceXattr, Path: p, Err: err}
	}
	return nil
}

// IsDir reports whether st is a directory.
func IsDir(st *syscall.Stat_t) bool { return st.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// IsOpaque reports whether the directory p hides the lower layers at its
// path.
func IsOpaque(p string) bool {
	buf := make([]byte, 1)
	n, err := unix.Lgetxattr(p, OpaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// MarkOpaque makes the directory p hide the lower layers at its path.
func MarkOpaque(p string) error {
	if err := unix.Lsetxattr(p, OpaqueXattr, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "setxattr " + OpaqueXattr, Path: p, Err: err}
	}
	return nil
}
