//go:build linux

package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// copyBufSize is the chunk size used to move file bodies in and out of a
// snapshot. Nomad copies 1 KiB at a time, which is one of the reasons its
// migrations are slow; a large buffer keeps the syscall count down.
const copyBufSize = 1 << 20

// errorEntryTime is the timestamp Nomad puts on the error entry. It is
// kept identical so that a Nomad receiver sees exactly what it expects.
var errorEntryTime = time.Date(2000, 0, 0, 0, 0, 0, 0, time.UTC)

// errorEntryName is the name of the entry a sender appends when it could
// not complete a snapshot of allocation allocID. The HTTP status has been
// sent by then, so this in-band entry is the only reliable failure signal.
func errorEntryName(allocID string) string {
	return "NOMAD-" + allocID + "-ERROR.log"
}

// snapshotFS is what Write needs of a filesystem: lstat and readlink so
// that symbolic links are archived as themselves, and directory listing.
type snapshotFS interface {
	fs.ReadLinkFS
	fs.ReadDirFS
}

// Write writes Nomad's migration tar (uncompressed) of roots to w.
// Every root is a slash-separated path relative to the allocation
// directory (alloc/data, web/local) and is archived in the order given;
// each archived node, the root itself included, is named by its path
// relative to the allocation directory, without a leading "./" or "/" and
// without a trailing slash on directories.
//
// fsys is the allocation directory and must implement fs.ReadLinkFS and
// fs.ReadDirFS. It decides containment: the walk never follows a symbolic
// link itself, but a path that fsys resolves through a link swapped in
// mid-walk reads wherever fsys lets it. Use an fs that stays beneath the
// allocation directory (allocdir.NewBeneathFS, or os.Root.FS);
// os.DirFS is only fit for trees nobody else is writing. For the same
// reason fsys.Open should not block on a FIFO swapped in for a file.
//
// The walk is lexical and lstat-based: symbolic links are archived with
// their raw target and never descended, entries are sorted by name, and
// hard links are not detected (each name is a full regular file).
// Sockets, FIFOs and device nodes are skipped without error: none has
// content that could be migrated, a FIFO would block the reader and a
// device would stream the host's data, so leaving them out is the only
// deterministic choice. An entry that disappears between listing and
// reading is left out too, as if the snapshot had been taken a moment
// later; a root that does not exist is an error.
//
// A regular file is archived with the size it had when it was stat-ed:
// bytes it gained since are left out so the archive stays consistent,
// and a file that shrank is an error.
//
// If walking or reading fails, a regular entry named
// NOMAD-<allocID>-ERROR.log carrying "Error snapshotting: <err>" is
// appended, the archive is closed and the error is returned: the receiver
// then refuses the archive even though the transfer itself completed. If
// writing to w fails, the error is returned and nothing more is written.
func Write(w io.Writer, allocID string, fsys fs.FS, roots []string) error {
	sfs, ok := fsys.(snapshotFS)
	if !ok {
		return fmt.Errorf("failed to snapshot alloc %q: filesystem %T does not implement fs.ReadLinkFS and fs.ReadDirFS", allocID, fsys)
	}
	if err := allocdir.ValidName(allocID); err != nil {
		return fmt.Errorf("failed to snapshot alloc: %w", err)
	}
	for _, root := range roots {
		if !fs.ValidPath(root) || root == "." {
			return fmt.Errorf("failed to snapshot alloc %q: invalid root %q", allocID, root)
		}
	}

	ew := &errWriter{w: w}
	s := &snapshotter{
		fsys: sfs,
		tw:   tar.NewWriter(ew),
		buf:  make([]byte, copyBufSize),
	}
	for _, root := range roots {
		err := s.walkRoot(root)
		if err == nil {
			continue
		}
		if ew.err != nil {
			return fmt.Errorf("failed to write snapshot of alloc %q: %w", allocID, err)
		}
		err = fmt.Errorf("failed to snapshot alloc %q: %w", allocID, err)
		if werr := s.writeErrorEntry(allocID, err); werr != nil {
			return errors.Join(err, fmt.Errorf("failed to write error entry: %w", werr))
		}
		return err
	}
	if err := s.tw.Close(); err != nil {
		return fmt.Errorf("failed to write snapshot of alloc %q: %w", allocID, err)
	}
	return nil
}

// errWriter remembers the first error of the underlying writer, which is
// how a failure of w is told apart from a failure of the walk: only the
// latter can still be reported in-band.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, err
}

type snapshotter struct {
	fsys snapshotFS
	tw   *tar.Writer
	buf  []byte
	// pending is how much of the current entry's body is still owed to
	// the tar writer, so that a failed copy can be padded out before the
	// error entry is appended.
	pending int64
}

func (s *snapshotter) walkRoot(root string) error {
	info, err := s.fsys.Lstat(root)
	if err != nil {
		return fmt.Errorf("failed to stat root %q: %w", root, err)
	}
	return s.walk(root, info, true)
}

// walk archives name and, for a directory, everything below it. Only a
// root must exist; below it a name that vanished since its directory was
// listed is skipped.
func (s *snapshotter) walk(name string, info fs.FileInfo, isRoot bool) error {
	mode := info.Mode()
	switch {
	case mode.IsDir():
		entries, err := s.fsys.ReadDir(name)
		if err != nil {
			if !isRoot && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if !isRoot && errors.Is(err, syscall.ENOTDIR) {
				return errChanged
			}
			return fmt.Errorf("failed to list %q: %w", name, err)
		}
		if !isRoot {
			// The listing of the parent may be older than this one: the
			// header takes the directory's owner and mode as they are now.
			if fresh, err := s.fsys.Lstat(name); err == nil && fresh.Mode().IsDir() && sameFile(info, fresh) {
				info = fresh
			}
		}
		if err := s.writeHeader(name, info, ""); err != nil {
			return err
		}
		slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
		for _, e := range entries {
			if err := s.walkEntry(name+"/"+e.Name(), e); err != nil {
				return err
			}
		}
		return nil
	case mode&fs.ModeSymlink != 0:
		target, err := s.fsys.ReadLink(name)
		if err != nil {
			if !isRoot && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if !isRoot && errors.Is(err, fs.ErrInvalid) {
				return errChanged
			}
			return fmt.Errorf("failed to read link %q: %w", name, err)
		}
		return s.writeHeader(name, info, target)
	case mode.IsRegular():
		return s.writeFile(name, info, isRoot)
	default:
		return nil
	}
}

// errChanged says that a name no longer holds the kind of file its
// directory's listing said, and nothing was written for it yet.
var errChanged = errors.New("changed since its directory was listed")

// walkEntry archives the directory entry e, named child. Its lstat comes
// from the listing (fs.DirEntry.Info: free when the listing made it, as the
// on-disk one does), which may be older than the walk of the entries before
// it: when the name now holds another kind of file, it is looked at again,
// once.
func (s *snapshotter) walkEntry(child string, e fs.DirEntry) error {
	ci, err := e.Info()
	for attempt := 0; ; attempt++ {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failed to stat %q: %w", child, err)
		}
		err = s.walk(child, ci, false)
		if !errors.Is(err, errChanged) {
			return err
		}
		if attempt == 1 {
			return fmt.Errorf("failed to read %q: replaced while snapshotting", child)
		}
		ci, err = s.fsys.Lstat(child)
	}
}

func (s *snapshotter) writeHeader(name string, info fs.FileInfo, link string) error {
	hdr, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return fmt.Errorf("failed to build header for %q: %w", name, err)
	}
	hdr.Name = name
	if err := s.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("failed to write header for %q: %w", name, err)
	}
	return nil
}

// fdOpener is implemented by a snapshot filesystem that hands out raw
// fds (the on-disk one, allocdir.NewBeneathFS): the walk then reads a file
// without making an *os.File of it, which costs two syscalls per file (an
// fcntl, and an epoll registration that fails for a regular file), a good
// part of what a small file costs.
type fdOpener interface {
	// OpenFd opens name for reading as Open does; the caller closes the
	// fd.
	OpenFd(name string) (int, error)
}

// open opens a file to archive.
func (s *snapshotter) open(name string) (fs.File, error) {
	o, ok := s.fsys.(fdOpener)
	if !ok {
		return s.fsys.Open(name)
	}
	fd, err := o.OpenFd(name)
	if err != nil {
		return nil, err
	}
	return &fdReader{fd: fd, name: name}, nil
}

// fdReader is a read-only fs.File over a raw blocking-read fd.
type fdReader struct {
	fd   int
	name string
}

func (r *fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return 0, &fs.PathError{Op: "read", Path: r.name, Err: err}
		case n == 0 && len(p) > 0:
			return 0, io.EOF
		}
		return n, nil
	}
}

func (r *fdReader) Stat() (fs.FileInfo, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(r.fd, &st); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: r.name, Err: err}
	}
	return allocdir.NewStatInfo(path.Base(r.name), &st), nil
}

func (r *fdReader) Close() error {
	if err := unix.Close(r.fd); err != nil {
		return &fs.PathError{Op: "close", Path: r.name, Err: err}
	}
	return nil
}

func (s *snapshotter) writeFile(name string, info fs.FileInfo, isRoot bool) error {
	f, err := s.open(name)
	if err != nil {
		if !isRoot && errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !isRoot && errors.Is(err, syscall.ELOOP) {
			// A link now sits there (opens never follow one).
			return errChanged
		}
		return fmt.Errorf("failed to open %q: %w", name, err)
	}
	defer f.Close()
	// The name was lstat-ed before it was opened; if something else now
	// sits there (a link swapped in, say), its content is not what the
	// header describes and must not go out under this name.
	opened, err := f.Stat()
	if err != nil {
		return fmt.Errorf("failed to stat %q: %w", name, err)
	}
	if !opened.Mode().IsRegular() {
		if !isRoot {
			return errChanged
		}
		return fmt.Errorf("failed to read %q: replaced while snapshotting", name)
	}
	if !sameFile(info, opened) {
		// info may come from a listing made a while ago: another file
		// may hold the name now, or (where Open follows links) a link to
		// one. An lstat now, while the opened file is held, must name
		// the opened file.
		if info, err = s.fsys.Lstat(name); err != nil {
			return fmt.Errorf("failed to stat %q: %w", name, err)
		}
		if !info.Mode().IsRegular() || !sameFile(info, opened) {
			if !isRoot {
				return errChanged
			}
			return fmt.Errorf("failed to read %q: replaced while snapshotting", name)
		}
	}
	// The header describes the file whose bytes follow: the opened one,
	// as it is now. The listing's view of the name may be older: a new
	// file that got a deleted one's inode, or a chmod since, would
	// otherwise go out with another file's owner and mode.
	if err := s.writeHeader(name, opened, ""); err != nil {
		return err
	}
	size := opened.Size()
	s.pending = size
	n, err := io.CopyBuffer(s.tw, io.LimitReader(f, size), s.buf)
	s.pending -= n
	if err != nil {
		return fmt.Errorf("failed to copy %q: %w", name, err)
	}
	if s.pending > 0 {
		return fmt.Errorf("failed to copy %q: file shrank from %d to %d bytes while snapshotting", name, size, n)
	}
	return nil
}

// sameFile compares device and inode when both infos carry them; an fs
// that does not expose them is trusted to have opened what it stat-ed.
func sameFile(a, b fs.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	if !ok1 || !ok2 {
		return true
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// writeErrorEntry appends the error entry and the trailer. The entry cut
// short by the failure is first padded with zeros: the tar writer will not
// start a new header before the declared size was written, and the
// receiver discards everything anyway once it meets the error entry.
func (s *snapshotter) writeErrorEntry(allocID string, cause error) error {
	for s.pending > 0 {
		chunk := min(s.pending, int64(len(s.buf)))
		clear(s.buf[:chunk])
		n, err := s.tw.Write(s.buf[:chunk])
		s.pending -= int64(n)
		if err != nil {
			return err
		}
	}
	body := []byte("Error snapshotting: " + cause.Error())
	hdr := &tar.Header{
		Typeflag:   tar.TypeReg,
		Name:       errorEntryName(allocID),
		Mode:       0o666,
		Size:       int64(len(body)),
		ModTime:    errorEntryTime,
		AccessTime: errorEntryTime,
		ChangeTime: errorEntryTime,
	}
	if err := s.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := s.tw.Write(body); err != nil {
		return err
	}
	return s.tw.Close()
}
