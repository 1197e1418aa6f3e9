package logmon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
)

const (
	// bufferSize is how much output is held before a write to the
	// file: a task printing one short line at a time would otherwise
	// cost a FUSE write per line.
	bufferSize = 64 << 10
	// flushInterval bounds how stale a log file may be behind the task.
	flushInterval = 100 * time.Millisecond
	// lineLookahead is how far past the size limit a file may grow to
	// end the line it holds: lines up to this long are never split.
	lineLookahead = 32 << 10
	// maxSkips bounds how many unusable files (full, or planted by the
	// task) one rotation steps over before giving up.
	maxSkips = 64
)

// ErrClosed is returned by a Rotator's Write after Close.
var ErrClosed = errors.New("log rotator is closed")

// Rotator writes one stream of a task (its stdout, say) to the files
// base.0, base.1, ... of a Dir, rotating and pruning them by its Config.
// It is an io.WriteCloser, safe for concurrent use.
type Rotator struct {
	logger   hclog.Logger
	dir      *Dir
	base     string
	maxFiles int
	maxBytes int64

	mu      sync.Mutex
	buf     []byte
	f       *os.File
	idx     int
	size    int64
	midLine bool // the file's last byte is not a newline
	closed  bool
	lost    int64 // bytes given to Write that no file took

	stop chan struct{}
	done chan struct{}
}

// NewRotator starts writing the stream base ("web.stdout") in dir. It
// appends to the highest-numbered existing file unless that one is full,
// so a restarted task continues where it stopped and indices only grow.
func NewRotator(logger hclog.Logger, dir *Dir, base string, cfg Config) (*Rotator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := validName(base); err != nil {
		return nil, err
	}
	r := &Rotator{
		logger:   logger.Named("rotator").With("file", base),
		dir:      dir,
		base:     base,
		maxFiles: cfg.MaxFiles,
		maxBytes: cfg.fileBytes(),
		buf:      make([]byte, 0, bufferSize),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	existing, err := dir.indices(base)
	if err != nil {
		return nil, err
	}
	start := 0
	for _, e := range existing {
		if e.regular {
			start = e.index
		}
	}
	if err := r.openFrom(start); err != nil {
		return nil, err
	}
	if r.idx != start {
		// Stepping over a full file is a rotation too.
		r.prune()
	}
	go r.flushLoop()
	return r, nil
}

// name is the file of index i.
func (r *Rotator) name(i int) string { return r.base + "." + strconv.Itoa(i) }

// Index is the index of the file being written.
func (r *Rotator) Index() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.idx
}

// openFrom makes the first usable file at index i or above the current
// one. A full file is stepped over silently; one that is not a plain
// file is stepped over with a warning, so that a task cannot stop its own
// logging (and never redirect it) by planting something in the way.
//
// Past something planted it goes on after the highest index in the
// directory, so that planting a run of names stops nobody: stepping over
// one name at a time, a task could outlast any bound on the steps.
func (r *Rotator) openFrom(i int) error {
	for skips := 0; ; skips, i = skips+1, i+1 {
		if i > maxIndex {
			return fmt.Errorf("%w: log index %d is past the highest the runner uses (%d)", ErrUnsafePath, i, maxIndex)
		}
		f, size, err := r.dir.openLog(r.name(i))
		if err != nil {
			if errors.Is(err, ErrUnsafePath) && skips < maxSkips {
				r.logger.Warn("skipping a log file that is not a plain file", "index", i, "error", err)
				if existing, lerr := r.dir.indices(r.base); lerr == nil && len(existing) > 0 {
					i = max(i, existing[len(existing)-1].index)
				}
				continue
			}
			return err
		}
		if size >= r.maxBytes && skips < maxSkips {
			f.Close()
			continue
		}
		r.f, r.idx, r.size, r.midLine = f, i, size, false
		return nil
	}
}

// rotate closes the current file, opens the next and prunes old ones.
func (r *Rotator) rotate() error {
	// r.f is nil when the previous attempt to rotate failed.
	if r.f != nil {
		if err := r.f.Close(); err != nil {
			r.logger.Warn("failed to close a rotated log file", "index", r.idx, "error", err)
		}
		r.f = nil
	}
	if err := r.openFrom(r.idx + 1); err != nil {
		return err
	}
	r.prune()
	return nil
}

// prune deletes the oldest files so that MaxFiles remain. Failures are
// logged, not returned: too many old files must not stop the logging.
func (r *Rotator) prune() {
	entries, err := r.dir.indices(r.base)
	if err != nil {
		r.logger.Warn("cannot list log files to prune", "error", err)
		return
	}
	// Only this stream's files count: regular files up to the current
	// one. Entries a task planted, or put ahead of the current file,
	// must not push the real logs out.
	var existing []int
	for _, e := range entries {
		if e.regular && e.index <= r.idx {
			existing = append(existing, e.index)
		}
	}
	if len(existing) <= r.maxFiles {
		return
	}
	for _, i := range existing[:len(existing)-r.maxFiles] {
		if i == r.idx {
			continue
		}
		if err := r.dir.remove(r.name(i)); err != nil {
			r.logger.Warn("cannot prune an old log file", "index", i, "error", err)
		}
	}
}

// Write buffers p; it reaches the file within flushInterval, or at once
// when the buffer fills. On error, what Write did not take is lost and
// counted by Lost; what it buffered earlier is kept for the next flush.
func (r *Rotator) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, err := r.writeLocked(p)
	if err != nil {
		r.lost += int64(len(p) - n)
	}
	return n, err
}

func (r *Rotator) writeLocked(p []byte) (int, error) {
	if r.closed {
		return 0, ErrClosed
	}
	if len(r.buf)+len(p) > bufferSize {
		if err := r.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= bufferSize {
		return r.writeOut(p)
	}
	r.buf = append(r.buf, p...)
	return len(p), nil
}

// Flush writes what is buffered to the file.
func (r *Rotator) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	return r.flushLocked()
}

func (r *Rotator) flushLocked() error {
	n, err := r.writeOut(r.buf)
	// What did not make it stays for the next attempt, in order.
	r.buf = r.buf[:copy(r.buf, r.buf[n:])]
	return err
}

// writeOut writes p through the files, rotating as they fill, and
// returns how much of p is on disk. A file is full at maxBytes if it
// ends a line there; otherwise it takes up to lineLookahead more bytes to
// end the line, so that a line is split only if it is longer than that.
// The check is made on what the file holds, not on p, so a line that
// reaches the file in several writes is kept whole too.
func (r *Rotator) writeOut(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if r.size >= r.maxBytes && (!r.midLine || r.size >= r.maxBytes+lineLookahead) {
			if err := r.rotate(); err != nil {
				return written, fmt.Errorf("failed to rotate %s: %w", r.base, err)
			}
		}
		var n int
		if room := r.maxBytes - r.size; room > 0 {
			n = int(min(room, int64(len(p))))
		} else {
			n = int(min(r.maxBytes+lineLookahead-r.size, int64(len(p))))
			if nl := bytes.IndexByte(p[:n], '\n'); nl >= 0 {
				n = nl + 1
			}
		}
		m, err := r.f.Write(p[:n])
		written += m
		r.size += int64(m)
		if m > 0 {
			r.midLine = p[m-1] != '\n'
		}
		if err != nil {
			return written, fmt.Errorf("failed to write %s: %w", r.name(r.idx), err)
		}
		p = p[n:]
	}
	return written, nil
}

// flushLoop flushes every flushInterval until Close.
func (r *Rotator) flushLoop() {
	defer close(r.done)
	t := time.NewTicker(flushInterval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		err := r.Flush()
		// One line per distinct failure: a full disk would otherwise
		// log ten lines a second.
		switch {
		case err == nil:
			lastErr = ""
		case errors.Is(err, ErrClosed):
			return
		case err.Error() != lastErr:
			lastErr = err.Error()
			r.logger.Error("failed to flush task output", "error", err)
		}
	}
}

// Close flushes what is buffered and closes the file.
func (r *Rotator) Close() error {
	return errors.Join(r.close())
}

// close is Close with its two failures apart: a failed flush, whose
// bytes Lost counts, and a failed close of the file.
func (r *Rotator) close() (flushErr, closeErr error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, nil
	}
	flushErr = r.flushLocked()
	r.lost += int64(len(r.buf))
	r.buf = nil
	r.closed = true
	if r.f != nil { // nil after a failed rotation
		if err := r.f.Close(); err != nil {
			closeErr = fmt.Errorf("failed to close %s: %w", r.name(r.idx), err)
		}
	}
	r.mu.Unlock()
	close(r.stop)
	<-r.done
	return flushErr, closeErr
}

// Lost is how many bytes given to Write never reached a file: those
// refused by a failed write and, once closed, those still buffered when
// the last flush failed.
func (r *Rotator) Lost() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}

// validName refuses a name that is not one plain path component.
func validName(name string) error {
	switch {
	case name == "", name == ".", name == "..":
	case bytes.ContainsAny([]byte(name), "/\x00"):
	default:
		return nil
	}
	return fmt.Errorf("%w: %q is not a file name", ErrInvalidConfig, name)
}
