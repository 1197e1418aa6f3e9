package allocdir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"syscall"
)

// ReadFS is what the shared read side needs of an implementation: an
// fs.FS rooted at the allocation directory ("." is the root) that lists
// directories with lstat information, stats and reads links without
// following them, and opens files without following a symbolic link in
// any component (the paths it is given have already been resolved, so a
// link found at open time was planted since and must fail the open).
type ReadFS interface {
	fs.ReadDirFS
	fs.ReadLinkFS
}

// ReadSide implements [FS]'s List, Stat, ReadAt, BlockUntilExists and
// ChangeEvents once, for every implementation, on top of a ReadFS. All
// containment and secrets decisions of the read side are made here.
type ReadSide struct {
	// AllocID names the root in Stat("/").
	AllocID string
	// HostPrefix is the allocation's absolute host path; absolute links
	// under it are followed as paths inside the allocation.
	HostPrefix string
	// Open returns the allocation's ReadFS and a func releasing it. It is
	// called once per operation, so an implementation can hand out fds
	// that live only as long as the operation.
	Open func() (ReadFS, func(), error)
}

// fsPath turns a resolved path into an fs.FS name.
func fsPath(resolved string) string {
	if resolved == "" {
		return "."
	}
	return resolved
}

// resolve runs the resolver against fsys.
func (r ReadSide) resolve(fsys ReadFS, p string, followFinal bool) (string, error) {
	res := Resolver{
		Readlink: func(q string) (string, bool, error) {
			fi, err := fsys.Lstat(fsPath(q))
			if err != nil {
				return "", false, err
			}
			if fi.Mode()&fs.ModeSymlink == 0 {
				return "", false, nil
			}
			target, err := fsys.ReadLink(fsPath(q))
			return target, err == nil, err
		},
		HostPrefix: r.HostPrefix,
	}
	return res.Resolve(p, followFinal)
}

// open opens the allocation's ReadFS and resolves p in it, following
// links; release must be called once the operation is done.
func (r ReadSide) open(p string) (ReadFS, string, func(), error) {
	fsys, release, err := r.Open()
	if err != nil {
		return nil, "", nil, err
	}
	resolved, err := r.resolve(fsys, p, true)
	if err != nil {
		release()
		return nil, "", nil, err
	}
	return fsys, resolved, release, nil
}

// List implements FS.List.
func (r ReadSide) List(p string) ([]*FileInfo, error) {
	fsys, resolved, release, err := r.open(p)
	if err != nil {
		return nil, err
	}
	defer release()
	entries, err := fsys.ReadDir(fsPath(resolved))
	if err != nil {
		return nil, err
	}
	out := make([]*FileInfo, 0, len(entries))
	for _, e := range entries {
		fi, err := e.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, NewFileInfo(fi))
	}
	return out, nil
}

// Stat implements FS.Stat.
func (r ReadSide) Stat(p string) (*FileInfo, error) {
	fsys, resolved, release, err := r.open(p)
	if err != nil {
		return nil, err
	}
	defer release()
	fi, err := fsys.Lstat(fsPath(resolved))
	if err != nil {
		return nil, err
	}
	info := NewFileInfo(fi)
	info.Name = path.Base(path.Clean("/" + p))
	if info.Name == "/" {
		info.Name = r.AllocID
	}
	var head []byte
	// Content under secrets/ and private/ is not sniffed: even its type
	// is not for the read side to learn.
	if fi.Mode().IsRegular() && CheckReadable(resolved) == nil {
		head = readHead(fsys, fsPath(resolved))
	}
	info.ContentType = DetectContentType(p, info.IsDir, head)
	return info, nil
}

// readHead returns up to sniffLen bytes of a file, or nil.
func readHead(fsys ReadFS, name string) []byte {
	f, err := fsys.Open(name)
	if err != nil {
		return nil
	}
	defer f.Close()
	buf := make([]byte, sniffLen)
	n, _ := io.ReadFull(f, buf)
	if n == 0 {
		return nil
	}
	return buf[:n]
}

// ReadAt implements FS.ReadAt.
func (r ReadSide) ReadAt(p string, offset int64) (io.ReadCloser, error) {
	fsys, resolved, release, err := r.open(p)
	if err != nil {
		return nil, err
	}
	defer release()
	if err := CheckReadable(resolved); err != nil {
		return nil, err
	}
	fi, err := fsys.Lstat(fsPath(resolved))
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, &fs.PathError{Op: "read", Path: p, Err: syscall.EISDIR}
	}
	if !fi.Mode().IsRegular() {
		// A FIFO would block the reader forever; nothing else has bytes.
		return nil, &fs.PathError{Op: "read", Path: p, Err: fmt.Errorf("not a regular file (%s)", fi.Mode().Type())}
	}
	f, err := fsys.Open(fsPath(resolved))
	if err != nil {
		return nil, err
	}
	if offset == 0 {
		return f, nil
	}
	if s, ok := f.(io.Seeker); ok {
		if _, err := s.Seek(offset, io.SeekStart); err != nil {
			f.Close()
			return nil, fmt.Errorf("can't seek to offset %d of %q: %w", offset, p, err)
		}
		return f, nil
	}
	if _, err := io.CopyN(io.Discard, f, offset); err != nil && !errors.Is(err, io.EOF) {
		f.Close()
		return nil, fmt.Errorf("can't seek to offset %d of %q: %w", offset, p, err)
	}
	return f, nil
}

// statResolved resolves p, following links, and stats the result.
func (r ReadSide) statResolved(p string) (os.FileInfo, error) {
	fsys, resolved, release, err := r.open(p)
	if err != nil {
		return nil, err
	}
	defer release()
	return fsys.Lstat(fsPath(resolved))
}

// BlockUntilExists implements FS.BlockUntilExists by polling.
func (r ReadSide) BlockUntilExists(ctx context.Context, p string) (chan error, error) {
	if _, err := SplitRequest(p); err != nil {
		return nil, err
	}
	if _, err := r.statResolved(p); errors.Is(err, ErrEscapes) {
		return nil, err
	}
	return PollExists(ctx, func() (os.FileInfo, error) { return r.statResolved(p) }), nil
}

// ChangeEvents implements FS.ChangeEvents by polling.
func (r ReadSide) ChangeEvents(ctx context.Context, p string, curOffset int64) (*FileChanges, error) {
	return PollChanges(ctx, func() (os.FileInfo, error) { return r.statResolved(p) }, curOffset)
}
