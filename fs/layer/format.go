package layer

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// OpaqueXattr marks an upper directory that hides the lower layers at its
// path; its value is "y".
const OpaqueXattr = "trusted.overlay.opaque"

// IsWhiteout reports whether st is a whiteout: a character device 0/0.
func IsWhiteout(st *syscall.Stat_t) bool {
	return st.Mode&syscall.S_IFMT == syscall.S_IFCHR && st.Rdev == 0
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
