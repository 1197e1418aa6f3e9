package fsapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/allocfs/allocfs/allocdir"
)

// logDir is where a task's numbered log files are, inside the allocation.
const logDir = allocdir.SharedAllocName + "/" + allocdir.LogDirName

// streamer sends files of one allocation through one framer.
type streamer struct {
	fs allocdir.FS
	f  *framer
	// following counts the handler's streams waiting at the end of a
	// file for more.
	following *atomic.Int64
}

// fileEnd says why streamFile returned without an error.
type fileEnd int

const (
	endEOF     fileEnd = iota // not following: the end was reached
	endNext                   // following: a newer file appeared and this one was read to its end
	endDeleted                // following: the file was deleted (its frame is sent)
)

// streamFile sends p from offset on: r is p opened at offset, and is
// closed. Without follow it stops at the first end of file. With follow
// it waits at the end for changes: more data is sent, a truncation
// restarts from 0 with a "file truncated" frame, a deletion ends it with a
// "file deleted" frame once what the open file still held is sent; a
// value on next (a newer log file exists) makes it read to the end once
// more and return. It also returns when ctx is done or the client is
// gone; whatever it started to follow the file ends with it.
//
// It returns the offset it reached with how it ended.
func (s *streamer) streamFile(ctx context.Context, p string, r io.ReadCloser, offset int64, follow bool, next <-chan error) (fileEnd, int64, error) {
	defer func() { r.Close() }()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	buf := make([]byte, frameSize)
	var (
		changes  *allocdir.FileChanges
		event    string
		nextSeen bool
	)
	// drain sends what r still has up to its end.
	drain := func() error {
		for {
			n, rerr := r.Read(buf)
			offset += int64(n)
			if n > 0 {
				if err := s.f.send(p, event, buf[:n], offset); err != nil {
					return err
				}
				event = ""
			}
			if rerr != nil {
				if errors.Is(rerr, io.EOF) {
					return nil
				}
				return fmt.Errorf("read %s: %w", p, rerr)
			}
		}
	}
	deleted := func() (fileEnd, int64, error) {
		if err := drain(); err != nil {
			return endEOF, offset, err
		}
		return endDeleted, offset, s.f.send(p, eventDeleted, nil, offset)
	}
	for {
		if err := drain(); err != nil {
			return endEOF, offset, err
		}
		if event != "" {
			// A truncation with nothing written since: the event alone.
			if err := s.f.send(p, event, nil, offset); err != nil {
				return endEOF, offset, err
			}
			event = ""
		}
		switch {
		case !follow:
			return endEOF, offset, nil
		case nextSeen:
			return endNext, offset, nil
		}
		if changes == nil {
			var err error
			changes, err = s.fs.ChangeEvents(ctx, p, offset)
			if errors.Is(err, iofs.ErrNotExist) {
				return deleted()
			}
			if err != nil {
				return endEOF, offset, fmt.Errorf("follow %s: %w", p, err)
			}
			s.following.Add(1)
			defer s.following.Add(-1)
		}
		select {
		case <-ctx.Done():
			return endEOF, offset, ctx.Err()
		case <-changes.Modified:
		case <-changes.Deleted:
			return deleted()
		case <-changes.Truncated:
			reopened, err := s.fs.ReadAt(p, 0)
			if err != nil {
				// Gone, or no longer something that may be read: as
				// far as this follower goes, the file was deleted.
				return deleted()
			}
			r.Close()
			r, offset, event = reopened, 0, eventTruncated
		case err, ok := <-next:
			if ok && err != nil {
				return endEOF, offset, err
			}
			nextSeen = true
			next = nil
		}
	}
}

// logFile is one of a task's numbered log files.
type logFile struct {
	index int64
	size  int64
}

// logName is the path of a log file inside the allocation.
func logName(task, typ string, index int64) string {
	return fmt.Sprintf("%s/%s.%s.%d", logDir, task, typ, index)
}

// listLogs returns the task's log files of that type, lowest index first.
// Only regular files count: names with that prefix whose suffix is not a
// number (an operator's web.stdout.0.gz) are not log files, and a link or
// a directory a task planted under a log file's name is not one either
// (the runner steps over such names too, leaving a gap in the indices).
func listLogs(fsys allocdir.FS, task, typ string) ([]logFile, error) {
	entries, err := fsys.List(logDir)
	if err != nil {
		return nil, err
	}
	prefix := task + "." + typ + "."
	var out []logFile
	for _, e := range entries {
		if e.IsDir || !strings.HasPrefix(e.Name, prefix) || !strings.HasPrefix(e.FileMode, "-") {
			continue
		}
		idx, err := strconv.ParseInt(strings.TrimPrefix(e.Name, prefix), 10, 64)
		if err != nil || idx < 0 {
			continue
		}
		out = append(out, logFile{index: idx, size: e.Size})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].index < out[j].index })
	return out, nil
}

// startOfLogs finds where a logs request starts: origin "start" walks
// offset bytes forward from the first file, "end" walks them backward
// from the end of the last, across files in both cases, clamped to the
// logs there are.
func startOfLogs(files []logFile, origin string, offset int64) (index, at int64) {
	if origin == originEnd {
		for i := len(files) - 1; i >= 0; i-- {
			if offset <= files[i].size {
				return files[i].index, files[i].size - offset
			}
			offset -= files[i].size
		}
		return files[0].index, 0
	}
	for i, f := range files {
		if offset < f.size || i == len(files)-1 {
			return f.index, min(offset, f.size)
		}
		offset -= f.size
	}
	return files[0].index, 0
}

// find returns the file with that index, if listed.
func find(files []logFile, index int64) (logFile, bool) {
	for _, f := range files {
		if f.index == index {
			return f, true
		}
	}
	return logFile{}, false
}

// newer returns the lowest index above index, or -1.
func newer(files []logFile, index int64) int64 {
	for _, f := range files {
		if f.index > index {
			return f.index
		}
	}
	return -1
}

// logs streams a task's log files from (index, at): without follow up to
// the end of the newest file there was at the start (last), with follow
// until the client goes, moving to a newer index as soon as one exists.
// first is the first file, opened at at.
func (s *streamer) logs(ctx context.Context, task, typ string, first io.ReadCloser, index, at, last int64, follow bool) error {
	r := first
	for {
		end, reached, err := s.logFile(ctx, task, typ, r, index, at, follow)
		r = nil
		if err != nil {
			return err
		}
		if !follow && index >= last {
			return nil
		}
		if end == endDeleted {
			// The name may be back as another file (a task that replaced
			// its log): go on with that one where it fits.
			if rr, resumeAt, ok := s.reopenReplaced(task, typ, index, reached); ok {
				r, at = rr, resumeAt
				continue
			}
		}
		for {
			files, err := listLogs(s.fs, task, typ)
			if err != nil {
				return err
			}
			if n := newer(files, index); n >= 0 {
				index, at = n, 0
				break
			}
			if !follow {
				return nil
			}
			if err := s.waitForNewer(ctx, task, typ, index); err != nil {
				return err
			}
		}
	}
}

// reopenReplaced opens the log file index again if its name is back: at
// the offset reached if the new file is that long, else from its start.
func (s *streamer) reopenReplaced(task, typ string, index, at int64) (io.ReadCloser, int64, bool) {
	files, err := listLogs(s.fs, task, typ)
	if err != nil {
		return nil, 0, false
	}
	f, ok := find(files, index)
	if !ok {
		return nil, 0, false
	}
	if f.size < at {
		at = 0
	}
	r, err := s.fs.ReadAt(logName(task, typ, index), at)
	if err != nil {
		return nil, 0, false
	}
	return r, at, true
}

// logFile streams one log file, opened at at unless r already is, and
// returns how it ended and the offset it reached. A file that cannot be
// opened (rotated away, or replaced by something that may not be read)
// counts as deleted.
func (s *streamer) logFile(ctx context.Context, task, typ string, r io.ReadCloser, index, at int64, follow bool) (fileEnd, int64, error) {
	p := logName(task, typ, index)
	if r == nil {
		var err error
		r, err = s.fs.ReadAt(p, at)
		if err != nil {
			if ctx.Err() != nil {
				return endEOF, at, ctx.Err()
			}
			return endDeleted, at, nil
		}
	}
	var next <-chan error
	nextCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if follow {
		next = s.newerSignal(nextCtx, task, typ, index)
	}
	return s.streamFile(ctx, p, r, at, follow, next)
}

// newerSignal returns a channel that receives nil once a log file with an
// index above index exists, or an error if the logs directory cannot be
// followed; nothing is sent if ctx ends first.
func (s *streamer) newerSignal(ctx context.Context, task, typ string, index int64) <-chan error {
	ch := make(chan error, 1)
	go func() {
		ch <- s.waitForNewer(ctx, task, typ, index)
	}()
	return ch
}

// waitForNewer waits until a log file with an index above index exists.
// It follows the logs directory itself: its modification time changes
// with every name created, removed or renamed in it, and nothing else
// does, so the writes to the files in it wake no one.
func (s *streamer) waitForNewer(ctx context.Context, task, typ string, index int64) error {
	dir, err := s.fs.ChangeEvents(ctx, logDir, 0)
	if err != nil {
		return fmt.Errorf("follow %s: %w", logDir, err)
	}
	for {
		files, err := listLogs(s.fs, task, typ)
		if err != nil {
			return err
		}
		if newer(files, index) >= 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-dir.Modified:
		case <-dir.Truncated:
		case <-dir.Deleted:
			return fmt.Errorf("follow %s: the directory was replaced", logDir)
		}
	}
}
