//go:build linux

package fsapi

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/hashicorp/go-hclog"
)

// loggedServer serves allocation a1 (task web) of a store without a
// mount, with the handler's log, at every level, going to logs. data and
// logDir are the host directories behind alloc/data and alloc/logs.
type loggedServer struct {
	url          string
	data, logDir string
	logs         *allocdirtest.SyncBuffer
}

func newLoggedServer(t *testing.T) *loggedServer {
	t.Helper()
	logs := &allocdirtest.SyncBuffer{}
	url, store, st, _, _ := serveA1(t, hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Trace}), nil)
	return &loggedServer{
		url:    url,
		data:   store.LayerPath(st.Volumes["alloc/data"].Upper),
		logDir: store.LayerPath(st.Volumes["alloc/logs"].Upper),
		logs:   logs,
	}
}

func (s *loggedServer) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(s.url + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", path, err)
	}
	return resp.StatusCode, string(b)
}

// bindSocket creates a listening unix socket named name in dir, reached
// through /proc so that a long temporary path still fits in a socket
// address. It is closed, and removed, when the test ends.
func bindSocket(t *testing.T, dir, name string) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ln, err := net.Listen("unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, name))
	if err != nil {
		t.Fatalf("bind a unix socket in %s: %v", dir, err)
	}
	t.Cleanup(func() { ln.Close() })
	if fi, err := os.Lstat(filepath.Join(dir, name)); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("%s/%s: got (%v, %v), want a socket", dir, name, fi, err)
	}
}

// TestReadSpecialFiles: a FIFO or a socket a task planted in a volume, or
// in place of a log file, is refused at once with 400 by every endpoint
// that reads content, while a writer holds the FIFO open and never
// writes, and no request writes a log line: a task cannot fill the
// daemon's log.
func TestReadSpecialFiles(t *testing.T) {
	t.Parallel()
	s := newLoggedServer(t)
	for _, p := range []string{filepath.Join(s.data, "fifo"), filepath.Join(s.logDir, "web.stdout.0")} {
		if err := unix.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bindSocket(t, s.data, "sock")
	// A writer that holds the FIFO open and never writes: a read that got
	// past the checks would block until the test gives up.
	w, err := os.OpenFile(filepath.Join(s.data, "fifo"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	const fsp = Prefix
	for _, path := range []string{
		fsp + "cat/a1?path=alloc/data/fifo",
		fsp + "readat/a1?path=alloc/data/fifo&offset=0",
		fsp + "readat/a1?path=alloc/data/fifo&offset=10&limit=5",
		fsp + "stream/a1?path=alloc/data/fifo&follow=false",
		fsp + "stream/a1?path=alloc/data/fifo&follow=true",
		fsp + "stream/a1?path=alloc/data/fifo&origin=end&offset=0",
		fsp + "cat/a1?path=alloc/data/sock",
		fsp + "readat/a1?path=alloc/data/sock&offset=0",
		fsp + "stream/a1?path=alloc/data/sock&follow=false",
		fsp + "cat/a1?path=alloc/logs/web.stdout.0",
	} {
		for range 3 {
			code, body := s.get(t, path)
			if code != http.StatusBadRequest || !strings.Contains(body, allocdir.ErrNotRegular.Error()) {
				t.Errorf("GET %s: got %d %q, want 400 saying %q", path, code, body, allocdir.ErrNotRegular)
			}
		}
	}
	// The logs endpoint only counts regular files as logs: a FIFO in
	// place of the only one leaves none.
	for _, path := range []string{
		fsp + "logs/a1?task=web&type=stdout",
		fsp + "logs/a1?task=web&type=stdout&follow=true&plain=true",
	} {
		if code, body := s.get(t, path); code != http.StatusNotFound {
			t.Errorf("GET %s: got %d %q, want 404", path, code, body)
		}
	}
	// Listing and stat still work: only content reads are refused.
	if code, body := s.get(t, fsp+"stat/a1?path=alloc/data/fifo"); code != http.StatusOK || !strings.Contains(body, `"FileMode":"prw-r--r--"`) {
		t.Errorf("stat of the FIFO: got %d %s, want 200 with its mode", code, body)
	}
	if logs := s.logs.String(); logs != "" {
		t.Errorf("got log lines for refused reads, want none:\n%s", logs)
	}
}

// TestReadAtHugeOffset: an offset past the end of a file reads nothing,
// as in Nomad, even one beyond the largest file the backing filesystem
// can hold (1e14 is past ext4's 16 TiB, where lseek itself fails).
func TestReadAtHugeOffset(t *testing.T) {
	t.Parallel()
	s := newLoggedServer(t)
	if err := os.WriteFile(filepath.Join(s.data, "hello.txt"), []byte("hello world\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, offset := range []string{"12", "13", "100000000000000", "9223372036854775807"} {
		path := Prefix + "readat/a1?path=alloc/data/hello.txt&offset=" + offset
		if code, body := s.get(t, path); code != http.StatusOK || body != "" {
			t.Errorf("GET %s: got %d %q, want 200 and an empty body", path, code, body)
		}
		path = Prefix + "stream/a1?path=alloc/data/hello.txt&follow=false&offset=" + offset
		code, body := s.get(t, path)
		if code != http.StatusOK {
			t.Errorf("GET %s: got %d %q, want 200", path, code, body)
		}
		if strings.Contains(body, `"Data"`) {
			t.Errorf("GET %s: got frames with data %q, want none", path, body)
		}
	}
	// Beyond int64 is a bad request, as in Nomad.
	if code, body := s.get(t, Prefix+"readat/a1?path=alloc/data/hello.txt&offset=100000000000000000000"); code != http.StatusBadRequest {
		t.Errorf("offset beyond int64: got %d %q, want 400", code, body)
	}
	if logs := s.logs.String(); strings.Contains(logs, "[ERROR]") || strings.Contains(logs, "[WARN]") {
		t.Errorf("got error log lines, want none:\n%s", logs)
	}
}
