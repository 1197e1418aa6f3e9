package logmon

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// ErrUnsafePath is returned when a FIFO or a log file is not what logmon
// made: a symbolic link, a file of the wrong type or owner, or one that
// changed while being opened. A task that can write to alloc/logs can
// plant any of these to aim the agent at a host file (HCSEC-2026-14), so
// logmon refuses them rather than following or reusing them.
var ErrUnsafePath = errors.New("unsafe log path")

// Dir is an open log directory (alloc/logs). Every FIFO and log file is
// opened relative to its fd, so a link planted anywhere on the way cannot
// redirect an open once the Dir exists. It is safe for concurrent use.
type Dir struct {
	fd   int
	path string // for messages only: the fd is what is trusted
}

// OpenDir opens the log directory rel beneath root. root is trusted (the
// allocation's directory the daemon reported); rel is resolved without
// following any symbolic link, since tasks can write below root.
func OpenDir(root, rel string) (*Dir, error) {
	rootFd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to open %q: %w", root, &fs.PathError{Op: "open", Path: root, Err: err})
	}
	defer unix.Close(rootFd)
	full := filepath.Join(root, rel)
	// No O_NOFOLLOW: with O_DIRECTORY it turns a final link into ENOTDIR,
	// while RESOLVE_NO_SYMLINKS refuses it with ELOOP, which says why.
	fd, err := allocdir.OpenBeneath(rootFd, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to open log directory %q: %w", full, unsafeErr(err))
	}
	return &Dir{fd: fd, path: full}, nil
}

// Path is the directory's path, as given to OpenDir.
func (d *Dir) Path() string { return d.path }

// Close closes the directory; the Rotators and Monitors using it must be
// closed first.
func (d *Dir) Close() error {
	if err := unix.Close(d.fd); err != nil {
		return fmt.Errorf("failed to close log directory %q: %w", d.path, err)
	}
	return nil
}

// unsafeErr marks the errors openat2 gives for a refused link (ELOOP for
// the final component with O_NOFOLLOW, ELOOP or EXDEV on the way) as
// ErrUnsafePath, keeping the errno for errors.Is.
func unsafeErr(err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		return fmt.Errorf("%w: a symbolic link is in the way (a task may have planted it): %w", ErrUnsafePath, err)
	}
	return err
}

// maxIndex is the highest index the runner ever uses or believes: a name
// with a larger one was planted (nothing rotates 2^40 times), and taking
// it as the newest file would send the next index past what an int holds.
const maxIndex = 1 << 40

// logEntry is a name of the directory that has a log file's form.
type logEntry struct {
	index int
	// regular is set for a regular file: anything else was planted, and
	// neither counts as a log file nor may be removed as one.
	regular bool
}

// indices lists the entries named base.N, N a plain decimal no larger
// than maxIndex, lowest index first, telling regular files from the rest
// without following links.
func (d *Dir) indices(base string) ([]logEntry, error) {
	fd, err := allocdir.OpenBeneath(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to list log directory %q: %w", d.path, err)
	}
	f := os.NewFile(uintptr(fd), d.path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("failed to list log directory %q: %w", d.path, err)
	}
	var out []logEntry
	for _, name := range names {
		rest, ok := strings.CutPrefix(name, base+".")
		if !ok {
			continue
		}
		i, err := strconv.Atoi(rest)
		if err != nil || i < 0 || i > maxIndex || strconv.Itoa(i) != rest {
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // gone since the listing
		}
		out = append(out, logEntry{index: i, regular: st.Mode&unix.S_IFMT == unix.S_IFREG})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].index < out[b].index })
	return out, nil
}

// openLog opens the log file name for appending, creating it with mode
// 0644 if it is missing, and returns it with its size. Anything but a
// regular file with a single name is refused with ErrUnsafePath: a FIFO
// could block or feed the task's output to a reader it chose, and a
// second name could be a host file hard-linked in.
func (d *Dir) openLog(name string) (*os.File, int64, error) {
	// O_NONBLOCK: opening a planted FIFO without a reader must fail
	// (ENXIO), not hang the agent.
	const flags = unix.O_WRONLY | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NONBLOCK
	created := true
	fd, err := allocdir.OpenBeneath(d.fd, name, flags|unix.O_CREAT|unix.O_EXCL, 0o644)
	if errors.Is(err, unix.EEXIST) {
		created = false
		fd, err = allocdir.OpenBeneath(d.fd, name, flags, 0)
	}
	if err != nil {
		if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.EISDIR) {
			err = fmt.Errorf("%w: not a regular file: %w", ErrUnsafePath, err)
		}
		return nil, 0, fmt.Errorf("failed to open log file %q in %q: %w", name, d.path, unsafeErr(err))
	}
	fail := func(err error) (*os.File, int64, error) {
		unix.Close(fd)
		return nil, 0, fmt.Errorf("failed to open log file %q in %q: %w", name, d.path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fail(fmt.Errorf("%w: not a regular file (mode %#o)", ErrUnsafePath, st.Mode))
	case st.Nlink > 1:
		return fail(fmt.Errorf("%w: the file has %d names", ErrUnsafePath, st.Nlink))
	}
	if created {
		// The umask must not decide who may read the logs.
		if err := unix.Fchmod(fd, 0o644); err != nil {
			return fail(err)
		}
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		return fail(err)
	}
	return os.NewFile(uintptr(fd), filepath.Join(d.path, name)), st.Size, nil
}

// remove deletes name from the directory. unlinkat never follows a link,
// so a planted one is removed, not its target.
func (d *Dir) remove(name string) error {
	if err := unix.Unlinkat(d.fd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("failed to remove %q from %q: %w", name, d.path, err)
	}
	return nil
}
