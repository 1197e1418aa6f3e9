//go:build linux

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
	"time"
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
	// Notifier, when set, makes BlockUntilExists and ChangeEvents wait for
	// kernel events about the host directories that back the paths they
	// follow (the ReadFS must be a BackedFS) instead of polling. Their
	// subscriptions are tagged with AllocID.
	Notifier Notifier
}

// Notifier wakes followers when a host directory changes (inotify, in the
// implementations).
type Notifier interface {
	// Subscribe returns a new subscription tagged tag: the implementation
	// wakes every subscription of a tag at once when what it stands for
	// (an allocation's records) changes.
	Subscribe(tag string) Subscription
}

// Subscription is one follower's interest in one name.
type Subscription interface {
	// Woken receives a value (coalesced) whenever the follower should
	// look again.
	Woken() <-chan struct{}
	// Arm points the subscription at the entry rel of the host directory
	// root, replacing what it watched before.
	Arm(root, rel string) error
	// Close ends the subscription.
	Close()
}

// BackedFS is a ReadFS that can say which host directory holds a name, so
// that followers can be woken by inotify.
type BackedFS interface {
	ReadFS
	// Backing returns the host directory root and the path rel under it
	// that hold name (which need not exist yet). ok is false for names no
	// host directory holds: synthesised or memory-only ones.
	Backing(name string) (root, rel string, ok bool)
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
	if err := checkRegular(p, fi); err != nil {
		return nil, err
	}
	f, err := fsys.Open(fsPath(resolved))
	if err != nil {
		return nil, err
	}
	// What was opened is checked again: a FIFO swapped in since the
	// lstat must not reach a reader (the open itself does not block).
	opened, err := f.Stat()
	if err == nil {
		err = checkRegular(p, opened)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	if offset == 0 {
		return f, nil
	}
	if s, ok := f.(io.Seeker); ok {
		if _, err := s.Seek(offset, io.SeekStart); err != nil {
			if offset >= opened.Size() && errors.Is(err, syscall.EINVAL) {
				// Past the largest file the backing filesystem can
				// hold: no byte will ever be there, so, as for any
				// offset past the end, the read is empty.
				return atEOF{f}, nil
			}
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

// checkRegular refuses a content read of anything but a regular file.
func checkRegular(p string, fi fs.FileInfo) error {
	mode := fi.Mode()
	if mode.IsRegular() {
		return nil
	}
	what := "special file"
	switch {
	case mode&fs.ModeNamedPipe != 0:
		what = "FIFO"
	case mode&fs.ModeSocket != 0:
		what = "socket"
	case mode&fs.ModeDevice != 0:
		what = "device"
	case mode.IsDir():
		what = "directory"
	case mode&fs.ModeSymlink != 0:
		what = "symbolic link"
	}
	return &PathError{Op: "read", Path: p, Err: fmt.Errorf("%w: a %s", ErrNotRegular, what)}
}

// atEOF is an open file read as if positioned past its end.
type atEOF struct{ io.ReadCloser }

func (atEOF) Read([]byte) (int, error) { return 0, io.EOF }

// statResolved resolves p, following links, and stats the result.
func (r ReadSide) statResolved(p string) (os.FileInfo, error) {
	fsys, resolved, release, err := r.open(p)
	if err != nil {
		return nil, err
	}
	defer release()
	return fsys.Lstat(fsPath(resolved))
}

// BlockUntilExists implements FS.BlockUntilExists: by inotify when the
// ReadSide has a Notifier, else by polling.
func (r ReadSide) BlockUntilExists(ctx context.Context, p string) (chan error, error) {
	if _, err := SplitRequest(p); err != nil {
		return nil, err
	}
	stat := func() (os.FileInfo, error) { return r.statResolved(p) }
	if r.Notifier == nil {
		if _, err := stat(); errors.Is(err, ErrEscapes) {
			return nil, err
		}
		return PollExists(ctx, stat), nil
	}
	sub := r.Notifier.Subscribe(r.AllocID)
	armed := r.arm(sub, p)
	if _, err := stat(); errors.Is(err, ErrEscapes) {
		sub.Close()
		return nil, err
	}
	result := make(chan error, 1)
	go func() {
		defer close(result)
		defer sub.Close()
		result <- waitExists(ctx, stat, r.waiter(ctx, sub, p, armed))
	}()
	return result, nil
}

// ChangeEvents implements FS.ChangeEvents: by inotify when the ReadSide
// has a Notifier, else by polling.
func (r ReadSide) ChangeEvents(ctx context.Context, p string, curOffset int64) (*FileChanges, error) {
	stat := func() (os.FileInfo, error) { return r.statResolved(p) }
	if r.Notifier == nil {
		return PollChanges(ctx, stat, curOffset)
	}
	sub := r.Notifier.Subscribe(r.AllocID)
	// Armed before the first stat, so that no change between the two is
	// missed.
	armed := r.arm(sub, p)
	first, err := stat()
	if err != nil {
		sub.Close()
		return nil, err
	}
	changes := NewFileChanges()
	go func() {
		defer sub.Close()
		followChanges(stat, first, curOffset, changes, r.waiter(ctx, sub, p, armed))
	}()
	return changes, nil
}

// waiter returns the wait function of a follower of p: it blocks until the
// subscription is woken, then re-arms it (what p resolves to may have
// changed). While the subscription cannot be armed (the inotify watch
// limit, say) the follower polls as well, so it never waits forever.
func (r ReadSide) waiter(ctx context.Context, sub Subscription, p string, armed bool) func() bool {
	return func() bool {
		var tick <-chan time.Time
		if !armed {
			t := time.NewTimer(PollInterval)
			defer t.Stop()
			tick = t.C
		}
		select {
		case <-ctx.Done():
			return false
		case <-sub.Woken():
		case <-tick:
		}
		armed = r.arm(sub, p)
		return true
	}
}

// arm points sub at the host directory that holds what p resolves to now,
// or at the nearest one on its way while it does not exist yet. It
// reports false when p has no host directory and the caller must poll;
// names that are memory-only or synthesised count as armed, since only
// the store's own changes (Wake) can change them.
func (r ReadSide) arm(sub Subscription, p string) bool {
	fsys, release, err := r.Open()
	if err != nil {
		// The allocation is gone or not built: the store wakes its
		// followers when that changes.
		return true
	}
	defer release()
	b, ok := fsys.(BackedFS)
	if !ok {
		return false
	}
	// While the way stops short of p, a component made between the
	// resolution and the watch raised an event nobody saw, and the name
	// watched for is there already: once armed, the way is resolved
	// again, and followed as far as it goes now. Each step goes one
	// component deeper; a way that keeps growing past armSteps is polled.
	// A way that reaches p needs no second look: the caller stats p after
	// arming.
	armedAt := ""
	for range armSteps {
		resolved, whole, ok := r.waitPoint(fsys, p)
		if !ok {
			return false
		}
		if resolved == armedAt {
			return true
		}
		root, rel, ok := b.Backing(fsPath(resolved))
		if !ok {
			return true
		}
		if sub.Arm(root, rel) != nil {
			return false
		}
		if whole {
			return true
		}
		armedAt = resolved
	}
	return false
}

// armSteps bounds how many times arm follows a way that grows while it
// arms.
const armSteps = 64

// waitPoint returns what p resolves to in fsys now (whole), or, while it
// does not exist, its first missing component; ok is false for a way that
// cannot be followed now (a file where a directory should be, a link
// out), which has no directory to watch.
func (r ReadSide) waitPoint(fsys ReadFS, p string) (resolved string, whole, ok bool) {
	resolved, err := r.resolve(fsys, p, true)
	var pe *PathError
	switch {
	case err == nil:
		return resolved, true, true
	case errors.As(err, &pe) && pe.Resolved != "" && errors.Is(err, fs.ErrNotExist):
		return pe.Resolved, false, true
	}
	return "", false, false
}
