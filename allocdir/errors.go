package allocdir

import (
	"errors"
	"fmt"
)

// Sentinel errors of the contract. Implementations wrap them with context;
// callers test them with errors.Is. The API layer maps them to Nomad's
// wording and status codes.
var (
	// ErrEscapes: the path, or a symbolic link on it, leads outside the
	// allocation directory.
	ErrEscapes = errors.New("path escapes the alloc directory")
	// ErrSecret: a read of content under a task's secrets/ directory.
	ErrSecret = errors.New("reading secret file prohibited")
	// ErrPrivate: a read of content under a task's private/ directory.
	ErrPrivate = errors.New("reading private file prohibited")
	// ErrNotBuilt: an operation that needs Build was called before it.
	ErrNotBuilt = errors.New("alloc dir is not built")
	// ErrUnknownAlloc: no allocation with that ID exists here.
	ErrUnknownAlloc = errors.New("unknown allocation")
	// ErrGone: the allocation existed but has been garbage collected.
	ErrGone = errors.New("allocation has been garbage collected")
	// ErrArchive: a snapshot archive was refused (malicious, corrupt,
	// truncated, over a limit, or carrying the sender's error entry).
	ErrArchive = errors.New("snapshot archive refused")
	// ErrInvalidName: a task or allocation name that cannot be a single
	// path component.
	ErrInvalidName = errors.New("invalid name")
	// ErrNotRegular: a content read of something that has no content to
	// read: a FIFO (which would block the reader), a socket or a device.
	ErrNotRegular = errors.New("not a regular file")
)

// PathError records the request path and the resolved path of a refused
// operation. It unwraps to the sentinel that says why.
type PathError struct {
	Op       string
	Path     string
	Resolved string
	Err      error
}

func (e *PathError) Error() string {
	if e.Resolved != "" && e.Resolved != e.Path {
		return fmt.Sprintf("%s %q (resolves to %q): %v", e.Op, e.Path, e.Resolved, e.Err)
	}
	return fmt.Sprintf("%s %q: %v", e.Op, e.Path, e.Err)
}

func (e *PathError) Unwrap() error { return e.Err }
