package fs

import (
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Extended attributes in a volume.
//
// The layer format keeps its own marks in trusted.overlay.* (the opaque
// mark of a directory): they are never listed or readable through the
// mount. A task's own trusted.overlay.* attributes (root may set them) are
// stored escaped, as trusted.overlay.overlay.*, the way overlayfs stores
// the attributes of a nested overlay: they round-trip as the task set
// them, and a task can never forge a mark of the format, in this volume or
// in one that stacks it later.
const (
	ovlXattrPrefix  = "trusted.overlay."
	ovlXattrEscaped = "trusted.overlay.overlay."
)

// storedXattr is the name under which the task's attribute name is kept
// on the backing file.
func storedXattr(name string) string {
	if rest, ok := strings.CutPrefix(name, ovlXattrPrefix); ok {
		return ovlXattrEscaped + rest
	}
	return name
}

// shownXattr is the name the task sees for a stored attribute, and false
// for one of the format's own.
func shownXattr(stored string) (string, bool) {
	if rest, ok := strings.CutPrefix(stored, ovlXattrEscaped); ok {
		return ovlXattrPrefix + rest, true
	}
	if strings.HasPrefix(stored, ovlXattrPrefix) {
		return "", false
	}
	return stored, true
}

// formatXattr reports whether a stored attribute is one of the format's
// own, which a copy-up does not carry.
func formatXattr(stored string) bool {
	_, shown := shownXattr(stored)
	return !shown
}

// listShownXattrs answers listxattr(2) for the backing entry p: the names
// the task may see, NUL-terminated, into dest, or the size needed when
// dest is empty.
func listShownXattrs(p string, dest []byte) (uint32, error) {
	names, err := listXattrs(p)
	if err != nil {
		return 0, err
	}
	var out []byte
	for _, n := range names {
		if shown, ok := shownXattr(n); ok {
			out = append(append(out, shown...), 0)
		}
	}
	if len(dest) == 0 {
		return uint32(len(out)), nil
	}
	if len(dest) < len(out) {
		return 0, syscall.ERANGE
	}
	return uint32(copy(dest, out)), nil
}

// copyXattrs gives dst every extended attribute of src but the format's
// own, so that a copy-up keeps what the task set.
func copyXattrs(src, dst string) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if formatXattr(name) {
			continue
		}
		val, err := getXattr(src, name)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return pathErr("setxattr "+name, dst, err)
		}
	}
	return nil
}
