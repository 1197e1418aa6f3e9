//go:build linux

package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// Making one entry beneath its parent's descriptor: a directory, a
// regular file (its body copied with holes kept), a symbolic link.

// fileMode keeps the permission and sticky bits of a header mode and
// drops setuid and setgid (see Extract).
func fileMode(m int64) uint32 { return uint32(m) & (0o777 | unix.S_ISVTX) }

func (x *extractor) dir(name string, comps []string, hdr *tar.Header) error {
	pfd, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	base := comps[len(comps)-1]
	existed := false
	if err := unix.Mkdirat(pfd, base, 0o700); errors.Is(err, unix.EEXIST) {
		existed = true
	} else if err != nil {
		return fsError(name, &fs.PathError{Op: "mkdirat", Path: name, Err: err})
	}
	fd, err := allocdir.OpenBeneath(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if existed {
			// A file or a link of that name came first.
			return refuseDuplicate(name, err)
		}
		return fsError(name, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("failed to stat %q: %w", name, err)
	}
	if _, dup := x.explicit[st.Ino]; dup {
		return refuseDuplicate(name, unix.EEXIST)
	}
	x.explicit[st.Ino] = dirMeta{
		mode:  fileMode(hdr.Mode),
		uid:   uint32(hdr.Uid),
		gid:   uint32(hdr.Gid),
		atime: timespec(hdr.AccessTime),
		mtime: timespec(hdr.ModTime),
	}
	x.stats.Dirs++
	return nil
}

func (x *extractor) file(tr *tar.Reader, name string, comps []string, hdr *tar.Header) error {
	if hdr.Size > x.maxBytes-x.stats.Bytes {
		return refuse(name, "archive holds more than %d bytes of file content", x.maxBytes)
	}
	pfd, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	base := comps[len(comps)-1]
	// Created with its final permissions, which the private root keeps
	// from anyone else until the archive is accepted; a write-protected
	// mode does not stop this fd from writing.
	perm := fileMode(hdr.Mode)
	createMode, exact := x.newFiles.createMode(perm)
	fd, err := allocdir.OpenBeneath(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, createMode)
	if err != nil {
		return fsError(name, err)
	}
	err = x.fillFile(fd, tr, name, hdr, perm, exact)
	if cerr := unix.Close(fd); cerr != nil && err == nil {
		err = fmt.Errorf("failed to write %q: %w", name, cerr)
	}
	if err != nil {
		return err
	}
	x.stats.Files++
	return nil
}

// fillFile writes the body of a file just created as fd, then its owner,
// mode and times, all through fd: nothing is resolved by name again.
func (x *extractor) fillFile(fd int, tr *tar.Reader, name string, hdr *tar.Header, perm uint32, exact bool) error {
	n, err := x.copyBody(fd, tr, name)
	x.stats.Bytes += n
	if err != nil {
		return err
	}
	if x.chown && !x.newFiles.owns(hdr.Uid, hdr.Gid) {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("failed to chown %q: %w", name, err)
		}
		// chown may have dropped bits fchmod is asked to set.
		exact = false
	}
	if !exact {
		if err := unix.Fchmod(fd, perm); err != nil {
			return fmt.Errorf("failed to chmod %q: %w", name, err)
		}
	}
	// Last: every write before it would move the mtime.
	if err := futimens(fd, hdr.AccessTime, hdr.ModTime); err != nil {
		return fmt.Errorf("failed to set times of %q: %w", name, err)
	}
	return nil
}

// copyBody copies the current entry's body into fd, telling a short or
// broken archive (the sender's fault) from a failed write (ours). The fd
// is written directly: an *os.File would cost an fcntl per file.
func (x *extractor) copyBody(fd int, tr *tar.Reader, name string) (int64, error) {
	var written int64
	for {
		n, rerr := tr.Read(x.buf)
		if n > 0 {
			if err := writeAll(fd, x.buf[:n]); err != nil {
				return written, fmt.Errorf("failed to write %q: %w", name, err)
			}
			written += int64(n)
		}
		if rerr == io.EOF {
			return written, nil
		}
		if rerr != nil {
			if errors.Is(rerr, io.ErrUnexpectedEOF) {
				return written, fmt.Errorf("%w: entry %q: archive truncated: body shorter than %d bytes: %w", allocdir.ErrArchive, name, written, rerr)
			}
			return written, fmt.Errorf("failed to read body of entry %q: %w", name, rerr)
		}
	}
}

// writeAll writes b to the blocking fd, retrying short writes and EINTR.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		b = b[n:]
	}
	return nil
}

func (x *extractor) symlink(name string, comps []string, hdr *tar.Header) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return refuse(name, "symbolic link with empty target")
	case len(target) > maxLinkLen:
		return refuse(name, "symbolic link target longer than %d bytes", maxLinkLen)
	case strings.IndexByte(target, 0) >= 0:
		return refuse(name, "symbolic link target contains NUL")
	case path.IsAbs(target):
		return refuse(name, "symbolic link to absolute path %q", target)
	}
	if j := path.Join(path.Dir(name), target); j == ".." || strings.HasPrefix(j, "../") {
		return refuse(name, "symbolic link target %q leads outside the archive root", target)
	}
	pfd, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	base := comps[len(comps)-1]
	if err := unix.Symlinkat(target, pfd, base); err != nil {
		return fsError(name, &fs.PathError{Op: "symlinkat", Path: name, Err: err})
	}
	if x.chown {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("failed to chown %q: %w", name, err)
		}
	}
	if err := setTimes(pfd, base, hdr.AccessTime, hdr.ModTime); err != nil {
		return fmt.Errorf("failed to set times of %q: %w", name, err)
	}
	x.stats.Symlinks++
	return nil
}
