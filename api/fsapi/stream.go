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

	"github.com/allocfs/allocfs/allocdir"
)

// logDir is where a task's numbered log files are, inside the allocation.
const logDir = allocdir.SharedAllocName + "/" + allocdir.LogDirName

// streamer sends files of one allocation through one framer.
type streamer struct {
	fs allocdir.FS
	f  *framer
}

// fileEnd says why streamFile returned without an error.
type fileEnd int

const (
	endEOF     fileEnd = iota // not following: the end was reached
	endNext                   // following: the next file appeared and this one was read to its end
	endDeleted                // following: the file was deleted (the frame is sent)
)

// streamFile sends p from offset on: r is p opened at offset, and is
// closed. Without follow it stops at the first end of file. With follow
// it waits at the end for changes: more data is sent, a truncation
// restarts from 0 with a "file truncated" frame, a deletion ends the
// stream with a "file deleted" frame; a value on next (a newer log file
// exists) makes it read to the end once more and return. It also returns
// when ctx is done or the client is gone.
func (s *streamer) streamFile(ctx context.Context, p string, r io.ReadCloser, offset int64, follow bool, next <-chan error) (fileEnd, error) {
	defer func() { r.Close() }()
	buf := make([]byte, frameSize)
	var (
		changes  *allocdir.FileChanges
		event    string
		nextSeen bool
	)
	for {
		n, rerr := r.Read(buf)
		offset += int64(n)
		if rerr != nil && !errors.Is(rerr, io.EOF) {
			return endEOF, fmt.Errorf("read %s: %w", p, rerr)
		}
		if n > 0 || event != "" {
			if err := s.f.send(p, event, buf[:n], offset); err != nil {
				return endEOF, err
			}
			event = ""
		}
		if rerr == nil {
			continue
		}
		switch {
		case !follow:
			return endEOF, nil
		case nextSeen:
			return endNext, nil
		}
		if changes == nil {
			var err error
			changes, err = s.fs.ChangeEvents(ctx, p, offset)
			if errors.Is(err, iofs.ErrNotExist) {
				return endDeleted, s.f.send(p, eventDeleted, nil, offset)
			}
			if err != nil {
				return endEOF, fmt.Errorf("follow %s: %w", p, err)
			}
		}
		select {
		case <-ctx.Done():
			return endEOF, ctx.Err()
		case <-changes.Modified:
		case <-changes.Deleted:
			return endDeleted, s.f.send(p, eventDeleted, nil, offset)
		case <-changes.Truncated:
			r.Close()
			var err error
			r, err = s.fs.ReadAt(p, 0)
			if errors.Is(err, iofs.ErrNotExist) {
				return endDeleted, s.f.send(p, eventDeleted, nil, 0)
			}
			if err != nil {
				return endEOF, err
			}
			offset = 0
			event = eventTruncated
		case err, ok := <-next:
			if ok && err != nil {
				return endEOF, err
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
// Names with that prefix whose suffix is not a number (an operator's
// web.stdout.0.gz, say) are not log files and are skipped.
func listLogs(fsys allocdir.FS, task, typ string) ([]logFile, error) {
	entries, err := fsys.List(logDir)
	if err != nil {
		return nil, err
	}
	prefix := task + "." + typ + "."
	var out []logFile
	for _, e := range entries {
		if e.IsDir || !strings.HasPrefix(e.Name, prefix) {
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

// logs streams a task's log files from (index, at): without follow up to
// the end of the newest file there was at the start, with follow forever,
// moving to the next index as soon as it exists.
// first is the first file, opened at at.
func (s *streamer) logs(ctx context.Context, task, typ string, first io.ReadCloser, index, at, last int64, follow bool) error {
	for {
		p := logName(task, typ, index)
		end, err := s.logFile(ctx, task, typ, p, first, index, at, follow)
		first = nil
		if err != nil {
			return err
		}
		if !follow && index >= last {
			return nil
		}
		files, err := listLogs(s.fs, task, typ)
		if err != nil {
			return err
		}
		nextIndex := int64(-1)
		for _, f := range files {
			if f.index > index {
				nextIndex = f.index
				break
			}
		}
		if nextIndex < 0 {
			if !follow {
				return nil
			}
			// The file went away with no newer one yet (a task that
			// removes its logs): wait for the next index.
			if end == endDeleted {
				if err := s.waitFor(ctx, logName(task, typ, index+1)); err != nil {
					return err
				}
				nextIndex = index + 1
			} else {
				return nil
			}
		}
		index, at = nextIndex, 0
	}
}

// logFile streams one log file, opened at at unless r already is; a file
// rotated away before it could be opened counts as deleted.
func (s *streamer) logFile(ctx context.Context, task, typ, p string, r io.ReadCloser, index, at int64, follow bool) (fileEnd, error) {
	if r == nil {
		var err error
		r, err = s.fs.ReadAt(p, at)
		if errors.Is(err, iofs.ErrNotExist) {
			return endDeleted, nil
		}
		if err != nil {
			return endEOF, err
		}
	}
	var next <-chan error
	nextCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if follow {
		ch, err := s.fs.BlockUntilExists(nextCtx, logName(task, typ, index+1))
		if err != nil {
			r.Close()
			return endEOF, err
		}
		next = ch
	}
	return s.streamFile(ctx, p, r, at, follow, next)
}

// waitFor waits until p exists.
func (s *streamer) waitFor(ctx context.Context, p string) error {
	ch, err := s.fs.BlockUntilExists(ctx, p)
	if err != nil {
		return err
	}
	if err := <-ch; err != nil {
		return err
	}
	return nil
}
