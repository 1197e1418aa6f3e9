package nomadreplay

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Logmon is Nomad's log collector for one task: two FIFOs the task
// writes, read into rotating files in alloc/logs. It lives outside the
// agent, so an agent (or allocfs) restart leaves it running.
type Logmon struct {
	// Stdout and Stderr are the task's ends of the FIFOs.
	Stdout, Stderr *os.File
	streams        []*logStream
}

type logStream struct {
	dir, base        string // alloc/logs, "<task>.stdout"
	maxBytes         int64
	maxFiles         int
	fifo             *os.File
	mu               sync.Mutex
	idx              int
	cur              *os.File
	size             int64
	err              error
	done             chan struct{}
	written, rotated int64
}

// Logmon starts the collector of task: each file holds at most maxBytes,
// and the maxFiles newest are kept. A collector started again after a
// restart goes on at the highest index there.
func (c *Client) Logmon(id, task string, maxBytes int64, maxFiles int) (*Logmon, error) {
	dir := filepath.Join(c.Dir(id), "alloc/logs")
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("logmon: open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	l := &Logmon{}
	for _, stream := range []string{"stdout", "stderr"} {
		fifo := fmt.Sprintf(".%s.%s.fifo", task, stream)
		if err := unix.Mkfifoat(dfd, fifo, 0o600); err != nil && !errors.Is(err, unix.EEXIST) {
			l.Close()
			return nil, fmt.Errorf("logmon: mkfifo %s/%s: %w", dir, fifo, err)
		}
		// The reader opens first and without blocking; it sees the end
		// of its input only when the task's end closes.
		r, err := os.OpenFile(filepath.Join(dir, fifo), os.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("logmon: open %s for reading: %w", fifo, err)
		}
		w, err := os.OpenFile(filepath.Join(dir, fifo), os.O_WRONLY, 0)
		if err != nil {
			r.Close()
			l.Close()
			return nil, fmt.Errorf("logmon: open %s for writing: %w", fifo, err)
		}
		s := &logStream{dir: dir, base: task + "." + stream, maxBytes: maxBytes, maxFiles: maxFiles, fifo: r, done: make(chan struct{})}
		if err := s.openLast(); err != nil {
			r.Close()
			w.Close()
			l.Close()
			return nil, err
		}
		go s.run()
		l.streams = append(l.streams, s)
		if stream == "stdout" {
			l.Stdout = w
		} else {
			l.Stderr = w
		}
	}
	return l, nil
}

// indices are the indices of the files of s there are, ascending.
func (s *logStream) indices() ([]int, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, err
	}
	var idx []int
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), s.base+".")
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(rest); err == nil {
			idx = append(idx, n)
		}
	}
	sort.Ints(idx)
	return idx, nil
}

func (s *logStream) openLast() error {
	idx, err := s.indices()
	if err != nil {
		return fmt.Errorf("logmon: %w", err)
	}
	if len(idx) > 0 {
		s.idx = idx[len(idx)-1]
	}
	return s.open()
}

func (s *logStream) open() error {
	f, err := os.OpenFile(filepath.Join(s.dir, fmt.Sprintf("%s.%d", s.base, s.idx)), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o666)
	if err != nil {
		return fmt.Errorf("logmon: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("logmon: %w", err)
	}
	s.cur, s.size = f, fi.Size()
	return nil
}

// write appends p, rotating to the next index where the current file is
// full and removing the files past the newest maxFiles.
func (s *logStream) write(p []byte) error {
	for len(p) > 0 {
		if s.size >= s.maxBytes {
			if err := s.cur.Close(); err != nil {
				return fmt.Errorf("logmon: %w", err)
			}
			s.idx++
			if err := s.open(); err != nil {
				return err
			}
			idx, err := s.indices()
			if err != nil {
				return fmt.Errorf("logmon: %w", err)
			}
			for _, n := range idx {
				if n <= s.idx-s.maxFiles {
					if err := os.Remove(filepath.Join(s.dir, fmt.Sprintf("%s.%d", s.base, n))); err != nil {
						return fmt.Errorf("logmon: %w", err)
					}
				}
			}
			s.rotated++
		}
		chunk := p[:min(int64(len(p)), s.maxBytes-s.size)]
		n, err := s.cur.Write(chunk)
		s.size += int64(n)
		s.written += int64(n)
		if err != nil {
			return fmt.Errorf("logmon: %w", err)
		}
		p = p[n:]
	}
	return nil
}

func (s *logStream) run() {
	defer close(s.done)
	buf := make([]byte, 32<<10)
	for {
		n, err := s.fifo.Read(buf)
		if n > 0 {
			s.mu.Lock()
			werr := s.write(buf[:n])
			if werr != nil && s.err == nil {
				s.err = werr
			}
			s.mu.Unlock()
		}
		if err == io.EOF {
			return
		}
		if err != nil {
			s.mu.Lock()
			if s.err == nil {
				s.err = fmt.Errorf("logmon: read: %w", err)
			}
			s.mu.Unlock()
			return
		}
	}
}

// Rotations is how many times the collector rotated a file, over both
// streams.
func (l *Logmon) Rotations() int64 {
	var n int64
	for _, s := range l.streams {
		s.mu.Lock()
		n += s.rotated
		s.mu.Unlock()
	}
	return n
}

// Close closes the task's ends, waits until everything written is in
// the files, and returns the first error the collector had.
func (l *Logmon) Close() error {
	var errs []error
	for _, w := range []*os.File{l.Stdout, l.Stderr} {
		if w != nil {
			errs = append(errs, w.Close())
		}
	}
	for _, s := range l.streams {
		<-s.done
		errs = append(errs, s.fifo.Close(), s.cur.Close(), s.err)
	}
	return errors.Join(errs...)
}

// Socket is a listening unix socket that answers every connection with
// the word it was given and a newline.
type Socket struct {
	l    net.Listener
	done chan struct{}
}

// Listen binds a unix socket at path, as Consul's proxies in alloc/tmp
// or the task API in secrets/ are.
func Listen(path, word string) (*Socket, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	s := &Socket{l: l, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(word + "\n"))
			c.Close()
		}
	}()
	return s, nil
}

// Close stops listening and removes the socket file.
func (s *Socket) Close() error {
	err := s.l.Close()
	<-s.done
	return err
}

// Template is consul-template's render of content to rel in task's
// directory: a temp file beside the target, renamed over it, given to
// nobody.
func (c *Client) Template(id, task, rel, content string) error {
	target := filepath.Join(c.Dir(id), task, rel)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp")
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), target); err != nil {
		return err
	}
	return os.Chown(target, Nobody, Nobody)
}

// Artifact unpacks a tar stream into rel below task's local/, as the
// artifact hook's getter does.
func (c *Client) Artifact(id, task, rel string, r io.Reader) error {
	root := filepath.Join(c.Dir(id), task, "local", rel)
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("artifact: %w", err)
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode).Perm()); err != nil {
				return fmt.Errorf("artifact: %w", err)
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return fmt.Errorf("artifact: %w", err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return fmt.Errorf("artifact: %w", err)
			}
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				return fmt.Errorf("artifact: %w", err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("artifact: %w", err)
			}
		}
	}
}
