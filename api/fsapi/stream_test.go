//go:build linux

package fsapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
)

// storeServer serves the API over a store with one allocation, a1 with
// task web, and no mount: the tests write the backing files directly,
// which is where the mount's writes land too. wrap, if set, stands
// between the handler and the allocation's read side.
type storeServer struct {
	url  string
	logs string // the host directory behind alloc/logs
	fsys allocdir.FS
	h    *Handler
}

func newStoreServer(t *testing.T, wrap func(allocdir.FS) allocdir.FS) *storeServer {
	t.Helper()
	url, store, st, fsys, h := serveA1(t, hclog.NewNullLogger(), wrap)
	return &storeServer{url: url, logs: store.LayerPath(st.Volumes["alloc/logs"].Upper), fsys: fsys, h: h}
}

// serveA1 serves allocation a1 (task web) of a fresh store, without a
// mount, through a handler that logs to logger; wrap, if set, stands
// between the handler and the allocation's read side.
func serveA1(t *testing.T, logger hclog.Logger, wrap func(allocdir.FS) allocdir.FS) (string, *store.Store, *record.State, allocdir.FS, *Handler) {
	t.Helper()
	s, err := store.Open(hclog.NewNullLogger(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	st, err := s.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fsys := allocdir.FS(fs.NewAllocDir(hclog.NewNullLogger(), s, nil, "/mnt", "a1"))
	if wrap != nil {
		fsys = wrap(fsys)
	}
	h := NewHandler(logger, func(id string) (allocdir.FS, error) {
		if id != "a1" {
			return nil, allocdir.ErrUnknownAlloc
		}
		return fsys, nil
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL, s, st, fsys, h
}

// frameStream reads the frames of one request in the background.
type frameStream struct {
	frames chan Frame
	done   chan error
	cancel context.CancelFunc
	// data and events are everything received so far.
	data   strings.Builder
	events []string
}

func (s *storeServer) open(t *testing.T, path string) *frameStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	fs := &frameStream{frames: make(chan Frame, 4096), done: make(chan error, 1), cancel: cancel}
	go func() {
		defer resp.Body.Close()
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
			var f Frame
			if err := dec.Decode(&f); err != nil {
				fs.done <- err
				return
			}
			if f.Data != nil || f.FileEvent != "" {
				fs.frames <- f
			}
		}
	}()
	t.Cleanup(cancel)
	return fs
}

// until reads frames until cond holds on all the data and events received
// so far, and returns them; the bound only decides when to give up.
func (f *frameStream) until(t *testing.T, what string, cond func(data string, events []string) bool) (string, []string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for !cond(f.data.String(), f.events) {
		select {
		case fr := <-f.frames:
			f.data.Write(fr.Data)
			if fr.FileEvent != "" {
				f.events = append(f.events, fr.FileEvent)
			}
		case err := <-f.done:
			// Frames queued before the end come first.
			if len(f.frames) > 0 {
				f.done <- err
				continue
			}
			t.Fatalf("waiting for %s: the stream ended (%v) with %q, events %v", what, err, f.data.String(), f.events)
		case <-deadline:
			t.Fatalf("waiting for %s: got %q, events %v after 10s", what, f.data.String(), f.events)
		}
	}
	return f.data.String(), f.events
}

func appendFile(t *testing.T, p, s string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

// failingReopen fails every ReadAt after the first: a file truncated and
// then replaced by something that may not be read before the follower
// reopens it.
type failingReopen struct {
	allocdir.FS
	calls atomic.Int32
}

func (f *failingReopen) ReadAt(p string, off int64) (io.ReadCloser, error) {
	if f.calls.Add(1) > 1 {
		return nil, fmt.Errorf("read %q: %w", p, allocdir.ErrSecret)
	}
	return f.FS.ReadAt(p, off)
}

// TestStreamTruncatedThenUnreadable: a followed file truncated and then
// not readable any more ends the stream with "file deleted"; the server
// (and the process) stay up and the framer stops.
func TestStreamTruncatedThenUnreadable(t *testing.T) {
	s := newStoreServer(t, func(f allocdir.FS) allocdir.FS { return &failingReopen{FS: f} })
	p := filepath.Join(s.logs, "f.log")
	appendFile(t, p, "first line\n")
	before := runtime.NumGoroutine()
	fl := s.open(t, "/v1/client/fs/stream/a1?path=alloc/logs/f.log")
	fl.until(t, "the first line", func(d string, _ []string) bool { return d == "first line\n" })
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	_, events := fl.until(t, "the deletion", func(_ string, ev []string) bool { return len(ev) > 0 })
	if events[0] != eventDeleted {
		t.Errorf("events: %v, want %q", events, eventDeleted)
	}
	if err := <-fl.done; !errors.Is(err, io.EOF) {
		t.Errorf("stream end: %v, want a clean end", err)
	}
	// Heartbeats would have gone to a finished response: wait past one.
	time.Sleep(heartbeatEvery + 200*time.Millisecond)
	waitGoroutines(t, before)
}

// waitGoroutines waits until no more than want (plus the HTTP client's
// idle connection) goroutines run.
func waitGoroutines(t *testing.T, want int) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > want+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", runtime.NumGoroutine(), want+2, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLogsFollowOverGaps: a task planted a dangling link and a directory
// under the next log names, so the runner stepped over them; the follower
// steps over them too and carries on with the next real file.
func TestLogsFollowOverGaps(t *testing.T) {
	s := newStoreServer(t, nil)
	appendFile(t, filepath.Join(s.logs, "web.stdout.0"), "zero\n")
	fl := s.open(t, "/v1/client/fs/logs/a1?task=web&type=stdout&follow=true")
	fl.until(t, "file 0", func(d string, _ []string) bool { return d == "zero\n" })
	if err := os.Symlink("missing", filepath.Join(s.logs, "web.stdout.1")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(s.logs, "web.stdout.2"), 0o755); err != nil {
		t.Fatal(err)
	}
	appendFile(t, filepath.Join(s.logs, "web.stdout.0"), "zero more\n")
	appendFile(t, filepath.Join(s.logs, "web.stdout.3"), "three\n")
	fl.until(t, "file 3 after the gap", func(d string, _ []string) bool { return strings.HasSuffix(d, "three\n") })
	appendFile(t, filepath.Join(s.logs, "web.stdout.3"), "three more\n")
	got, _ := fl.until(t, "more of file 3", func(d string, _ []string) bool { return strings.HasSuffix(d, "three more\n") })
	if got != "zero\nzero more\nthree\nthree more\n" {
		t.Errorf("followed: %q", got)
	}
}

// TestLogsFollowReplacedFile: a log file replaced under the same name
// (a new inode) is followed on, from where the old one was read to.
func TestLogsFollowReplacedFile(t *testing.T) {
	s := newStoreServer(t, nil)
	p := filepath.Join(s.logs, "web.stdout.0")
	appendFile(t, p, "old\n")
	fl := s.open(t, "/v1/client/fs/logs/a1?task=web&type=stdout&follow=true")
	fl.until(t, "the old line", func(d string, _ []string) bool { return d == "old\n" })
	tmp := filepath.Join(s.logs, ".tmp")
	appendFile(t, tmp, "old\nnew\n")
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	got, events := fl.until(t, "the new line", func(d string, _ []string) bool { return strings.HasSuffix(d, "new\n") })
	if got != "old\nnew\n" || len(events) != 1 || events[0] != eventDeleted {
		t.Errorf("after the replacement: data %q, events %v; want \"old\\nnew\\n\" and one %q", got, events, eventDeleted)
	}
	appendFile(t, p, "newer\n")
	fl.until(t, "an append to the new file", func(d string, _ []string) bool { return strings.HasSuffix(d, "newer\n") })
}

// TestLogsFollowRotationsLeaveNothing: following through many rotations
// does not pile up a watcher per file.
func TestLogsFollowRotationsLeaveNothing(t *testing.T) {
	s := newStoreServer(t, nil)
	appendFile(t, filepath.Join(s.logs, "web.stdout.0"), "0\n")
	fl := s.open(t, "/v1/client/fs/logs/a1?task=web&type=stdout&follow=true")
	fl.until(t, "file 0", func(d string, _ []string) bool { return d == "0\n" })
	base := runtime.NumGoroutine()
	for i := 1; i <= 30; i++ {
		appendFile(t, filepath.Join(s.logs, fmt.Sprintf("web.stdout.%d", i)), fmt.Sprintf("%d\n", i))
		want := fmt.Sprintf("%d\n", i)
		fl.until(t, "file "+want, func(d string, _ []string) bool { return strings.HasSuffix(d, want) })
	}
	if n := runtime.NumGoroutine(); n > base+3 {
		t.Errorf("%d goroutines after 30 rotations, %d before: a follower per file is left behind", n, base)
	}
}

// TestFollowingCounts: a client that follows a file counts in Following
// while it waits at the end of the file, and no longer once it is gone.
// Not parallel: the count is the process's.
func TestFollowingCounts(t *testing.T) {
	s := newStoreServer(t, nil)
	waitFollowing := func(what string, want int64) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); s.h.Following() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d followers, want %d", what, s.h.Following(), want)
			}
		}
	}
	waitFollowing("before the test", 0)
	appendFile(t, filepath.Join(s.logs, "web.stdout.0"), "zero\n")
	fl := s.open(t, "/v1/client/fs/logs/a1?task=web&type=stdout&follow=true")
	fl.until(t, "file 0", func(d string, _ []string) bool { return d == "zero\n" })
	waitFollowing("while following", 1)
	fl.cancel()
	waitFollowing("after the client went", 0)
}
