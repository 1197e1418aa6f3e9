package allocdir

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// FileChanges carries the three kinds of change a follower of a file cares
// about. Each channel has room for one pending notification; notifications
// coalesce while the follower is busy, which is what a reader that reads to
// EOF on every wake-up wants. The channels are never closed: followers stop
// by cancelling the context they passed.
type FileChanges struct {
	// Modified: the file grew, or its modification time changed.
	Modified chan bool
	// Truncated: the file shrank.
	Truncated chan bool
	// Deleted: the file is gone, or the name now names another file
	// (a different device+inode, as after a log rotation). No event
	// follows a Deleted.
	Deleted chan bool
}

// NewFileChanges returns a FileChanges with its channels ready.
func NewFileChanges() *FileChanges {
	return &FileChanges{
		Modified:  make(chan bool, 1),
		Truncated: make(chan bool, 1),
		Deleted:   make(chan bool, 1),
	}
}

func notify(ch chan bool) {
	select {
	case ch <- true:
	default:
	}
}

// NotifyModified signals a modification without blocking.
func (c *FileChanges) NotifyModified() { notify(c.Modified) }

// NotifyTruncated signals a truncation without blocking.
func (c *FileChanges) NotifyTruncated() { notify(c.Truncated) }

// NotifyDeleted signals a deletion without blocking.
func (c *FileChanges) NotifyDeleted() { notify(c.Deleted) }

// PollInterval is how often the polling watchers look at a file, the same
// period as Nomad's.
const PollInterval = 250 * time.Millisecond

// StatFunc stats a path that has already been checked for containment. It
// is called again on every poll so that a path whose components change
// between polls is re-resolved.
type StatFunc func() (os.FileInfo, error)

// PollChanges watches a file by polling stat and reports on the returned
// FileChanges until ctx is done or the file is deleted. lastSize is the
// offset the follower has already read up to. The first stat happens
// synchronously and its error is returned. The goroutine it starts exits
// when ctx is done or after Deleted is sent.
func PollChanges(ctx context.Context, stat StatFunc, lastSize int64) (*FileChanges, error) {
	first, err := stat()
	if err != nil {
		return nil, err
	}
	changes := NewFileChanges()
	go func() {
		ticker := time.NewTicker(PollInterval)
		defer ticker.Stop()
		followChanges(stat, first, lastSize, changes, func() bool {
			select {
			case <-ctx.Done():
				return false
			case <-ticker.C:
				return true
			}
		})
	}()
	return changes, nil
}

// followChanges compares each new stat of a file with the previous one and
// reports the difference, until wait says stop or the file is deleted.
// wait blocks until it is time to look again.
func followChanges(stat StatFunc, first os.FileInfo, lastSize int64, changes *FileChanges, wait func() bool) {
	// The file may already differ from what the follower has read; that
	// is reported at once, not at the first change after it.
	prevSize := first.Size()
	prevMod := first.ModTime()
	switch {
	case prevSize < lastSize:
		changes.NotifyTruncated()
	case prevSize > lastSize:
		changes.NotifyModified()
	}
	for wait() {
		fi, err := stat()
		if err != nil {
			// Unlike Nomad's watcher, a stat failure that is not "gone"
			// does not kill the process: the follower sees the file as
			// deleted and stops.
			changes.NotifyDeleted()
			return
		}
		if !sameInode(first, fi) {
			changes.NotifyDeleted()
			return
		}
		size := fi.Size()
		switch {
		case size < prevSize:
			changes.NotifyTruncated()
		case size > prevSize:
			changes.NotifyModified()
		case !fi.ModTime().Equal(prevMod):
			changes.NotifyModified()
		}
		prevSize = size
		prevMod = fi.ModTime()
	}
}

// PollExists returns a channel that receives nil once stat reports the
// path exists, the stat error if it fails for a reason other than the path
// not existing, or ctx's error on cancellation; the channel is closed after
// that one value. The polling goroutine exits then.
func PollExists(ctx context.Context, stat StatFunc) chan error {
	result := make(chan error, 1)
	go func() {
		defer close(result)
		ticker := time.NewTicker(PollInterval)
		defer ticker.Stop()
		result <- waitExists(ctx, stat, func() bool {
			select {
			case <-ctx.Done():
				return false
			case <-ticker.C:
				return true
			}
		})
	}()
	return result
}

// waitExists stats until the path exists (nil), a stat fails for another
// reason than not existing (that error), or wait says stop (ctx's error).
// wait blocks until it is time to look again.
func waitExists(ctx context.Context, stat StatFunc, wait func() bool) error {
	for {
		_, err := stat()
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, fs.ErrNotExist):
			return err
		}
		if !wait() {
			return ctx.Err()
		}
	}
}

// sameInode reports whether two stat results name the same file by device
// and inode. os.SameFile only understands the os package's own FileInfo.
func sameInode(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	if !ok1 || !ok2 {
		return os.SameFile(a, b)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
