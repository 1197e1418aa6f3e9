package allocdir

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"path"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"
)

// maxSymlinks bounds link following, as Linux's own resolver does (40).
const maxSymlinks = 40

// LinkReader reports whether the already-resolved, symlink-free path p
// (relative to the allocation root, "" for the root) is a symbolic link,
// and its raw target if it is. Errors such as not-exist are returned as
// is.
type LinkReader func(p string) (target string, isLink bool, err error)

// Resolver resolves request paths beneath an allocation root. It is the
// single place where containment is decided: every operation of every
// implementation resolves through it.
type Resolver struct {
	// Readlink inspects one path component at a time.
	Readlink LinkReader
	// HostPrefix, when set, is the absolute host path of the allocation
	// directory. An absolute symlink target under it is followed as the
	// same path relative to the root; any other absolute target escapes.
	HostPrefix string
}

// SplitRequest turns a request path into clean components relative to the
// allocation root. A leading "/" means the root. A ".." that would climb
// above the root is an escape, whatever lies on the way, as in Nomad's
// lexical check.
func SplitRequest(p string) ([]string, error) {
	var out []string
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "", ".":
		case "..":
			if len(out) == 0 {
				return nil, &PathError{Op: "resolve", Path: p, Err: ErrEscapes}
			}
			out = out[:len(out)-1]
		default:
			out = append(out, c)
		}
	}
	return out, nil
}

// Resolve returns the path, relative to the root and free of symbolic
// links, that the request path p names. Symbolic links on the way are
// followed only while they stay inside the root; the final component is
// followed only when followFinal is set. A link out of the root, or a ".."
// above it, fails with ErrEscapes. A missing component fails with the
// reader's error (not-exist), wrapped with the path.
func (r Resolver) Resolve(p string, followFinal bool) (string, error) {
	// Lexical check first, exactly as a path with no links would resolve.
	if _, err := SplitRequest(p); err != nil {
		return "", err
	}
	pending := strings.Split(p, "/")
	var resolved []string
	links := 0
	for len(pending) > 0 {
		c := pending[0]
		pending = pending[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(resolved) == 0 {
				return "", &PathError{Op: "resolve", Path: p, Err: ErrEscapes}
			}
			resolved = resolved[:len(resolved)-1]
			continue
		}
		candidate := append(resolved, c)
		if !followFinal && isLast(pending) {
			resolved = candidate
			break
		}
		target, isLink, err := r.Readlink(strings.Join(candidate, "/"))
		if err != nil {
			// The reader's own PathError names the same path again;
			// its cause is what the caller needs.
			var pe *iofs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return "", &PathError{Op: "resolve", Path: p, Resolved: strings.Join(candidate, "/"), Err: err}
		}
		if !isLink {
			resolved = candidate
			continue
		}
		links++
		if links > maxSymlinks {
			return "", &PathError{Op: "resolve", Path: p, Err: syscall.ELOOP}
		}
		if path.IsAbs(target) {
			rel, ok := r.underHost(target)
			if !ok {
				return "", &PathError{Op: "resolve", Path: p, Resolved: target, Err: ErrEscapes}
			}
			resolved = resolved[:0]
			target = rel
		}
		pending = append(strings.Split(target, "/"), pending...)
	}
	return strings.Join(resolved, "/"), nil
}

// isLast reports whether nothing but empty or "." components remain.
func isLast(pending []string) bool {
	for _, c := range pending {
		if c != "" && c != "." {
			return false
		}
	}
	return true
}

func (r Resolver) underHost(target string) (string, bool) {
	if r.HostPrefix == "" {
		return "", false
	}
	prefix := path.Clean(r.HostPrefix)
	t := path.Clean(target)
	if t == prefix {
		return "", true
	}
	if strings.HasPrefix(t, prefix+"/") {
		return strings.TrimPrefix(t, prefix+"/"), true
	}
	return "", false
}

// CheckReadable refuses content reads of a resolved path under a task's
// secrets/ or private/ directory. The comparison ignores case, so that a
// case-insensitive backing filesystem cannot be used to slip past it.
func CheckReadable(resolved string) error {
	parts := strings.SplitN(resolved, "/", 3)
	if len(parts) < 2 || parts[0] == SharedAllocName {
		return nil
	}
	switch {
	case strings.EqualFold(parts[1], TaskSecrets):
		return &PathError{Op: "read", Path: resolved, Err: ErrSecret}
	case strings.EqualFold(parts[1], TaskPrivate):
		return &PathError{Op: "read", Path: resolved, Err: ErrPrivate}
	}
	return nil
}

// ValidName checks that name can be used as one path component. It is the
// rule for layer IDs and names inside an allocation; allocation IDs and
// task names use the stricter ValidID and ValidTaskName.
func ValidName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("%w: %q contains '/' or NUL", ErrInvalidName, name)
	case len(name) > 255:
		return fmt.Errorf("%w: %q is longer than 255 bytes", ErrInvalidName, name)
	}
	return nil
}

// ValidID checks an allocation ID: one path component (ValidName) made
// only of printable characters. IDs are printed as they are, in listings
// and logs, so a newline or an escape sequence in one would forge output;
// Nomad's own IDs are UUIDs, well inside this set.
func ValidID(id string) error {
	if err := ValidName(id); err != nil {
		return err
	}
	return printable(id)
}

// ValidTaskName checks a task name as ValidID does an ID: one path
// component of printable characters (Nomad itself refuses only '/' and
// NUL), and not the shared directory's name.
func ValidTaskName(name string) error {
	if err := ValidID(name); err != nil {
		return err
	}
	if name == SharedAllocName {
		return fmt.Errorf("%w: %q is reserved for the shared directory", ErrInvalidName, name)
	}
	return nil
}

// printable refuses invalid UTF-8 and every rune unicode.IsPrint refuses:
// control characters (C0, DEL, C1), format characters such as zero-width
// spaces, line and paragraph separators, spaces other than U+0020,
// private-use and unassigned code points.
func printable(name string) error {
	if !utf8.ValidString(name) {
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrInvalidName, name)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%w: %q contains the non-printable character %U", ErrInvalidName, name, r)
		}
	}
	return nil
}

// joinHost joins host path elements.
func joinHost(elem ...string) string { return path.Join(elem...) }
