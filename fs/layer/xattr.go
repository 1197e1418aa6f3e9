package layer

import (
	"errors"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	ovlXattrPrefix  = "trusted.overlay."
	ovlXattrEscaped = "trusted.overlay.overlay."
)

// StoredXattr is the name under which a task's attribute name is kept on
// the backing file.
func StoredXattr(name string) string {
	if rest, ok := strings.CutPrefix(name, ovlXattrPrefix); ok {
		return ovlXattrEscaped + rest
	}
	return name
}

// ShownXattr is the name a task sees for a stored attribute, and false
// for one of the format's own.
func ShownXattr(stored string) (string, bool) {
	if rest, ok := strings.CutPrefix(stored, ovlXattrEscaped); ok {
		return ovlXattrPrefix + rest, true
	}
	if strings.HasPrefix(stored, ovlXattrPrefix) {
		return "", false
	}
	return stored, true
}

// FormatXattr reports whether a stored attribute is one of the format's
// own, which a copy-up does not carry.
func FormatXattr(stored string) bool {
	_, shown := ShownXattr(stored)
	return !shown
}

// ListShownXattrs answers listxattr(2) for the backing entry l: the names
// a task may see, NUL-terminated, into dest, or the size needed when dest
// is empty; hide, when set, leaves out the names it reports.
func ListShownXattrs(l Loc, dest []byte, hide func(shown string) bool) (uint32, error) {
	names, err := ListXattrs(l)
	if err != nil {
		return 0, err
	}
	var out []byte
	for _, n := range names {
		if shown, ok := ShownXattr(n); ok && (hide == nil || !hide(shown)) {
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

// CopyXattrs gives dst every extended attribute of src but the format's
// own, so that a copy-up keeps what the task set.
func CopyXattrs(src, dst Loc) error {
	names, err := ListXattrs(src)
	return copyXattrs(names, err, func(name string) ([]byte, error) { return GetXattr(src, name) },
		func(name string, val []byte) error { return dst.Setxattr(name, val, 0) })
}

// copyXattrs hands set every attribute of names (with the error that
// listed them) but the format's own, with its value from get.
func copyXattrs(names []string, err error, get func(name string) ([]byte, error), set func(name string, val []byte) error) error {
	if err != nil {
		return err
	}
	for _, name := range names {
		if FormatXattr(name) {
			continue
		}
		val, err := get(name)
		if err != nil {
			return err
		}
		if err := set(name, val); err != nil {
			return err
		}
	}
	return nil
}

// ListXattrs returns the names of l's extended attributes, stored names
// included, without following a symbolic link.
func ListXattrs(l Loc) ([]string, error) {
	buf, err := growing(l.Listxattr)
	return splitNames(buf, err, "listxattr", l.String())
}

// GetXattr returns the value of l's extended attribute name, without
// following a symbolic link.
func GetXattr(l Loc, name string) ([]byte, error) {
	buf, err := growing(func(b []byte) (int, error) { return l.Getxattr(name, b) })
	if err != nil {
		return nil, &os.PathError{Op: "getxattr " + name, Path: l.String(), Err: err}
	}
	return buf, nil
}

// fdXattrs returns the names of the extended attributes of the file open
// at fd.
func fdXattrs(fd int) ([]string, error) {
	buf, err := growing(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	return splitNames(buf, err, "flistxattr", "open file")
}

// fdXattr returns the value of the extended attribute name of the file
// open at fd.
func fdXattr(fd int, name string) ([]byte, error) {
	buf, err := growing(func(b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
	if err != nil {
		return nil, &os.PathError{Op: "fgetxattr " + name, Path: "open file", Err: err}
	}
	return buf, nil
}

// growing calls call with a buffer that doubles until the answer fits
// (ERANGE), and returns what it wrote.
func growing(call func(buf []byte) (int, error)) ([]byte, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := call(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// splitNames turns a listxattr answer into names; a filesystem without
// extended attributes has none.
func splitNames(buf []byte, err error, op, p string) ([]string, error) {
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, &os.PathError{Op: op, Path: p, Err: err}
	}
	var out []string
	for _, name := range strings.Split(string(buf), "\x00") {
		if name != "" {
			out = append(out, name)
		}
	}
	return out, nil
}
