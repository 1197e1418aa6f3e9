package layer

import "syscall"

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

// IsWhiteoutAt reports whether l, whose lstat is st, is a whiteout: a
// character device 0/0 that is not a task's own (RealDeviceXattr).
func IsWhiteoutAt(l Loc, st *syscall.Stat_t) bool {
	if !IsWhiteout(st) {
		return false
	}
	_, err := l.Getxattr(RealDeviceXattr, nil)
	return err != nil
}

// MarkRealDevice records that the character device 0/0 at l is a task's
// own, not a whiteout. Other entries need no mark.
func MarkRealDevice(l Loc) error {
	return l.Setxattr(RealDeviceXattr, []byte("y"), 0)
}

// IsDir reports whether st is a directory.
func IsDir(st *syscall.Stat_t) bool { return st.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// IsOpaque reports whether the directory l hides the lower layers at its
// path.
func IsOpaque(l Loc) bool {
	buf := make([]byte, 1)
	n, err := l.Getxattr(OpaqueXattr, buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// MarkOpaque makes the directory l hide the lower layers at its path.
func MarkOpaque(l Loc) error {
	return l.Setxattr(OpaqueXattr, []byte("y"), 0)
}
