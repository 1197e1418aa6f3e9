package logmon

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Streams are the outputs of a task logmon collects, in the order of
// Monitor's files.
var Streams = []string{"stdout", "stderr"}

// FIFOName is the FIFO of a task's stream in alloc/logs:
// .<task>.<stream>.fifo, hidden from a plain ls as in Nomad.
func FIFOName(task, stream string) string { return "." + task + "." + stream + ".fifo" }

// FileBase is the prefix of the log files of a task's stream:
// <task>.<stream>, followed by .<index>.
func FileBase(task, stream string) string { return task + "." + stream }

// drainLimit bounds the final drain of a FIFO that a leftover process of
// the task still writes to: the drain takes what the pipe held when the
// task exited, not a stream without end.
const drainLimit = 16 << 20

// Monitor collects a task's stdout and stderr: it makes a FIFO per
// stream in the log directory, hands their write ends to the task, and
// copies what arrives into a Rotator per stream.
type Monitor struct {
	logger  hclog.Logger
	dir     *Dir
	streams []*stream

	closeOnce sync.Once
	stopOnce  sync.Once
	stopErr   error
	lost      int64 // set by stop
}

// ErrOutputLost is returned by Stop when the log files could not take
// some of the task's output (a full disk, say); the error says how many
// bytes of which stream, and why.
var ErrOutputLost = errors.New("task output lost")

// stream is one FIFO and the Rotator behind it.
type stream struct {
	name     string // stdout or stderr
	fifo     string // the FIFO's name in the log directory
	dev, ino uint64 // the FIFO made, so that only it is removed
	r, w     *os.File
	rot      *Rotator
	done     chan struct{} // closed when pump returns
	err      error         // of reading the FIFO, set before done
	lost     error         // why the first write to the files failed
}

// Start makes (or reuses, after a crash) the FIFOs of task in dir, opens
// both ends of each, and starts copying them into rotating log files.
// The write ends are Stdout and Stderr.
func Start(logger hclog.Logger, dir *Dir, task string, cfg Config) (_ *Monitor, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := validName(task); err != nil {
		return nil, err
	}
	m := &Monitor{logger: logger.Named("logmon").With("task", task), dir: dir}
	defer func() {
		if err != nil {
			m.abort()
		}
	}()
	for _, name := range Streams {
		s, err := m.openFIFO(FIFOName(task, name))
		if err != nil {
			return nil, err
		}
		s.name = name
		m.streams = append(m.streams, s)
	}
	// Files only once both FIFOs are safe: a refused start leaves
	// nothing behind.
	for _, s := range m.streams {
		if s.rot, err = NewRotator(m.logger, dir, FileBase(task, s.name), cfg); err != nil {
			return nil, err
		}
	}
	for _, s := range m.streams {
		go m.pump(s)
	}
	return m, nil
}

// openFIFO makes the FIFO name unless it exists and opens its read end
// (non-blocking, so that no writer is needed yet) then its write end.
// Both opens refuse links; the read end must be a FIFO owned by this
// process, and the write end the same FIFO: a task may swap the path at
// any moment, and each check closes one window.
func (m *Monitor) openFIFO(name string) (_ *stream, err error) {
	path := filepath.Join(m.dir.path, name)
	if err := unix.Mkfifoat(m.dir.fd, name, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("failed to make FIFO %q: %w", path, err)
	}
	s := &stream{fifo: name, done: make(chan struct{})}
	defer func() {
		if err != nil {
			s.closeEnds()
		}
	}()
	rfd, err := allocdir.OpenBeneath(m.dir.fd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to open FIFO %q: %w", path, unsafeErr(err))
	}
	s.r = os.NewFile(uintptr(rfd), path)
	var st unix.Stat_t
	if err := unix.Fstat(rfd, &st); err != nil {
		return nil, fmt.Errorf("failed to stat FIFO %q: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFIFO:
		return nil, fmt.Errorf("refusing FIFO %q: %w: not a FIFO (mode %#o)", path, ErrUnsafePath, st.Mode)
	case int(st.Uid) != os.Geteuid():
		return nil, fmt.Errorf("refusing FIFO %q: %w: owned by uid %d, not by this process", path, ErrUnsafePath, st.Uid)
	}
	s.dev, s.ino = st.Dev, st.Ino
	// A FIFO left by a crash keeps its mode; one just made has the
	// umask's. Either way only the agent may open it.
	if err := unix.Fchmod(rfd, 0o600); err != nil {
		return nil, fmt.Errorf("failed to chmod FIFO %q: %w", path, err)
	}
	// Non-blocking too: if the path now holds another FIFO, nobody
	// reads it and the open fails instead of hanging.
	wfd, err := allocdir.OpenBeneath(m.dir.fd, name, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to open FIFO %q for writing: %w", path, unsafeErr(err))
	}
	s.w = os.NewFile(uintptr(wfd), path)
	if err := unix.Fstat(wfd, &st); err != nil {
		return nil, fmt.Errorf("failed to stat FIFO %q: %w", path, err)
	}
	if st.Dev != s.dev || st.Ino != s.ino {
		return nil, fmt.Errorf("refusing FIFO %q: %w: it was replaced while being opened", path, ErrUnsafePath)
	}
	// The task expects ordinary blocking writes on its stdout.
	if err := unix.SetNonblock(wfd, false); err != nil {
		return nil, fmt.Errorf("failed to set FIFO %q to blocking: %w", path, err)
	}
	return s, nil
}

func (s *stream) closeEnds() {
	if s.r != nil {
		s.r.Close()
	}
	if s.w != nil {
		s.w.Close()
	}
}

// Stdout is the write end of the stdout FIFO, for the task.
func (m *Monitor) Stdout() *os.File { return m.streams[0].w }

// Stderr is the write end of the stderr FIFO, for the task.
func (m *Monitor) Stderr() *os.File { return m.streams[1].w }

// CloseWriters closes the Monitor's own copies of the write ends. Call it
// once the task has started (or failed to): until then a FIFO cannot
// reach its end, since the Monitor itself is a writer.
func (m *Monitor) CloseWriters() {
	m.closeOnce.Do(func() {
		for _, s := range m.streams {
			if s.w != nil {
				s.w.Close()
			}
		}
	})
}

// pump copies a FIFO into its Rotator until every writer has closed it,
// or until Stop's grace ends and the pipe has been drained.
func (m *Monitor) pump(s *stream) {
	defer close(s.done)
	buf := make([]byte, bufferSize)
	var lastErr string
	write := func(p []byte) {
		_, err := s.rot.Write(p)
		if err == nil {
			return
		}
		if s.lost == nil {
			s.lost = err
		}
		if err.Error() != lastErr {
			// Reading goes on: a task blocked on a full pipe would be
			// worse than lost lines, and the disk may recover.
			lastErr = err.Error()
			m.logger.Error("task output lost", "stream", s.name, "bytes", len(p), "error", err)
		}
	}
	for {
		n, err := s.r.Read(buf)
		if n > 0 {
			write(buf[:n])
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF):
			return
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.err = s.drain(buf, write)
			return
		default:
			s.err = fmt.Errorf("failed to read FIFO %q: %w", s.fifo, err)
			return
		}
	}
}

// drain reads what the pipe holds now, without waiting for more.
func (s *stream) drain(buf []byte, write func([]byte)) error {
	if err := s.r.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("failed to drain FIFO %q: %w", s.fifo, err)
	}
	rc, err := s.r.SyscallConn()
	if err != nil {
		return fmt.Errorf("failed to drain FIFO %q: %w", s.fifo, err)
	}
	var readErr error
	err = rc.Read(func(fd uintptr) bool {
		for total := 0; total < drainLimit; {
			n, err := unix.Read(int(fd), buf)
			switch {
			case n > 0:
				write(buf[:n])
				total += n
			case err == unix.EINTR:
			case err == nil, err == unix.EAGAIN:
				return true
			default:
				readErr = err
				return true
			}
		}
		return true
	})
	if err = errors.Join(err, readErr); err != nil {
		return fmt.Errorf("failed to drain FIFO %q: %w", s.fifo, err)
	}
	return nil
}

// Stop waits for the task's output to end, at most grace once the task
// has exited (a process it left behind may hold the FIFOs open), then
// drains the FIFOs, flushes and closes the log files and removes the
// FIFOs. Call it after the task has exited; calling it again returns the
// first result.
func (m *Monitor) Stop(grace time.Duration) error {
	m.stopOnce.Do(func() { m.stopErr = m.stop(grace) })
	return m.stopErr
}

func (m *Monitor) stop(grace time.Duration) error {
	m.CloseWriters()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	expired := false
	for _, s := range m.streams {
		select {
		case <-s.done:
			continue
		case <-timer.C:
			expired = true
		}
		break
	}
	if expired {
		m.logger.Warn("a process the task left behind still holds its output open: taking what is buffered, dropping the rest")
		for _, s := range m.streams {
			s.r.SetReadDeadline(time.Now())
		}
	}
	var errs []error
	for _, s := range m.streams {
		<-s.done
		flushErr, closeErr := s.rot.close()
		if n := s.rot.Lost(); n > 0 {
			m.lost += n
			cause := s.lost
			if cause == nil { // only the last flush failed
				cause = flushErr
			}
			errs = append(errs, fmt.Errorf("%w: %d bytes of %s: %w", ErrOutputLost, n, s.name, cause))
		}
		errs = append(errs, s.err, closeErr, s.r.Close(), m.removeFIFO(s))
	}
	return errors.Join(errs...)
}

// Lost is how many bytes of the task's output, over both streams, the
// log files could not take. It is known once Stop has returned; output
// dropped because a leftover process still held a FIFO at the end of
// the grace is not counted, having never been read.
func (m *Monitor) Lost() int64 { return m.lost }

// abort undoes a Start that failed half-way; no pump is running.
func (m *Monitor) abort() {
	for _, s := range m.streams {
		if s.rot != nil {
			s.rot.Close()
		}
		s.closeEnds()
		m.removeFIFO(s)
	}
}

// removeFIFO removes the stream's FIFO if the path still holds the one
// that was opened: whatever a task put in its place is left alone.
func (m *Monitor) removeFIFO(s *stream) error {
	var st unix.Stat_t
	if err := unix.Fstatat(m.dir.fd, s.fifo, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("failed to stat FIFO %q: %w", s.fifo, err)
	}
	if st.Dev != s.dev || st.Ino != s.ino {
		m.logger.Warn("the FIFO was replaced; leaving what is there", "fifo", s.fifo)
		return nil
	}
	return m.dir.remove(s.fifo)
}
