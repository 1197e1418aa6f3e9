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

// ListShownXattrs answers listxattr(2) for the backing entry p: the names
// a task may see, NUL-terminated, into dest, or the size needed when dest
// is empty.
func ListShownXattrs(p string, dest []byte) (uint32, error) {
	names, err := ListXattrs(p)
	if err != nil {
		return 0, err
	}
	var out []byte
	for _, n := range names {
		if shown, ok := ShownXattr(n); ok {
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
func CopyXattrs(src, dst string) error {
	return copyXattrs(src, func(name string, val []byte) error {
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return &os.PathError{Op: "setxattr " + name, Path: dst, Err: err}
		}
		return nil
	})
}

// copyXattrs hands set every extended attribute of src but the format's
// own.
func copyXattrs(src string, set func(name string, val []byte) error) error {
	names, err := ListXattrs(src)
	if err != nil {
		return err
	}
	for _, name := range names {
		if FormatXattr(name) {
			continue
		}
		val, err := GetXattr(src, name)
		if err != nil {
			return err
		}
		if err := set(name, val); err != nil {
			return err
		}
	}
	return nil
}

// ListXattrs returns the names of p's extended attributes, stored names
// included, without following a symbolic link.
func ListXattrs(p string) ([]string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Llistxattr(p, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, &os.PathError{Op: "listxattr", Path: p, Err: err}
		}
		var out []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				out = append(out, name)
			}
		}
		return out, nil
	}
}

// GetXattr returns the value of p's extended attribute name, without
// following a symbolic link.
func GetXattr(p, name string) ([]byte, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "getxattr " + name, Path: p, Err: err}
		}
		return buf[:n], nil
	}
}
