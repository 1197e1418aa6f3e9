package migrate_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/migrate"
)

// TestFetchRoundTrip: what arrives is what the source holds (content,
// modes, sticky bits, symbolic links), verified by the digest, in one
// new directory inside staging.
func TestFetchRoundTrip(t *testing.T) {
	t.Parallel()
	src := newSourceServer(t, newSource(t), nil)
	opts := fetchOptions(t, src.srv.URL)
	res, err := migrate.Fetch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	assertStagingHolds(t, opts.StagingDir, res.Dir)
	if filepath.Dir(res.Dir) != opts.StagingDir {
		t.Errorf("got dir %q, want one directly inside %q", res.Dir, opts.StagingDir)
	}
	want := readTree(t, src.alloc.AllocDirPath())
	got := readTree(t, res.Dir)
	for name, w := range want {
		if g, ok := got[name]; !ok {
			t.Errorf("%s: missing", name)
		} else if g != w {
			t.Errorf("%s: got mode %v link %q body %d bytes, want mode %v link %q body %d bytes",
				name, g.Mode, g.Link, len(g.Body), w.Mode, w.Link, len(w.Body))
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: extra", name)
		}
	}
	if got["alloc/data/sticky"].Mode&os.ModeSticky == 0 {
		t.Errorf("alloc/data/sticky: got mode %v, want the sticky bit", got["alloc/data/sticky"].Mode)
	}
	if l := got["web/local/shared.txt"].Link; l != "../../alloc/data/hello.txt" {
		t.Errorf("web/local/shared.txt: got link %q, want %q", l, "../../alloc/data/hello.txt")
	}
	if n := int64(len(snapshotBytes(t, src.alloc))); res.Bytes != n {
		t.Errorf("got %d bytes, want %d", res.Bytes, n)
	}
	if res.Entries != len(want) {
		t.Errorf("got %d entries, want %d", res.Entries, len(want))
	}
	if !res.Verified {
		t.Error("got Verified false, want true")
	}
	if res.Attempts != 1 {
		t.Errorf("got %d attempts, want 1", res.Attempts)
	}
}

// TestFetchBadToken: a missing or wrong token gets 403, is not retried,
// never reaches the lookup and leaves staging empty.
func TestFetchBadToken(t *testing.T) {
	t.Parallel()
	for _, token := range []string{"", "wrong"} {
		t.Run("token="+token, func(t *testing.T) {
			t.Parallel()
			src := newSourceServer(t, newSource(t), nil)
			opts := fetchOptions(t, src.srv.URL)
			opts.Token = token
			_, err := migrate.Fetch(t.Context(), opts)
			if !errors.Is(err, migrate.ErrPermissionDenied) {
				t.Errorf("got error %v, want one wrapping ErrPermissionDenied", err)
			}
			var se *migrate.StatusError
			if !errors.As(err, &se) || se.StatusCode != http.StatusForbidden || se.Message != "Permission denied" {
				t.Errorf("got error %#v, want a StatusError 403 \"Permission denied\"", err)
			}
			if n := src.requests.Load(); n != 1 {
				t.Errorf("got %d requests, want 1", n)
			}
			if n := src.lookups.Load(); n != 0 {
				t.Errorf("got %d lookups, want 0", n)
			}
			assertStagingEmpty(t, opts.StagingDir)
		})
	}
}

// TestFetchUnknownAndGone: 404 and 410 map to the allocdir sentinels and
// are not retried.
func TestFetchUnknownAndGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   string
		want error
		code int
	}{
		{"no-such-alloc", allocdir.ErrUnknownAlloc, http.StatusNotFound},
		{goneID, allocdir.ErrGone, http.StatusGone},
	} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			src := newSourceServer(t, newSource(t), nil)
			opts := fetchOptions(t, src.srv.URL)
			opts.AllocID = tc.id
			_, err := migrate.Fetch(t.Context(), opts)
			if !errors.Is(err, tc.want) {
				t.Errorf("got error %v, want one wrapping %v", err, tc.want)
			}
			var se *migrate.StatusError
			if !errors.As(err, &se) || se.StatusCode != tc.code {
				t.Errorf("got error %v, want a StatusError %d", err, tc.code)
			}
			if n := src.requests.Load(); n != 1 {
				t.Errorf("got %d requests, want 1", n)
			}
			assertStagingEmpty(t, opts.StagingDir)
		})
	}
}

// TestFetchRetriesOverloadedSource: 503 and 429 are retried, other 4xx
// are not.
func TestFetchRetriesOverloadedSource(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code         int
		wantRequests int32
		wantOK       bool
	}{
		{http.StatusServiceUnavailable, 2, true},
		{http.StatusTooManyRequests, 2, true},
		{http.StatusInternalServerError, 2, true},
		{http.StatusBadRequest, 1, false},
		{http.StatusUnauthorized, 1, false},
	} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			t.Parallel()
			src := newSourceServer(t, newSource(t), func(real http.Handler, n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					http.Error(w, "busy", tc.code)
					return
				}
				real.ServeHTTP(w, r)
			})
			opts := fetchOptions(t, src.srv.URL)
			res, err := migrate.Fetch(t.Context(), opts)
			if got := err == nil; got != tc.wantOK {
				t.Errorf("got error %v, want success %v", err, tc.wantOK)
			}
			if n := src.requests.Load(); n != tc.wantRequests {
				t.Errorf("got %d requests, want %d", n, tc.wantRequests)
			}
			if err != nil {
				var se *migrate.StatusError
				if !errors.As(err, &se) || se.StatusCode != tc.code || se.Message != "busy" {
					t.Errorf("got error %v, want a StatusError %d \"busy\"", err, tc.code)
				}
				assertStagingEmpty(t, opts.StagingDir)
				return
			}
			assertStagingHolds(t, opts.StagingDir, res.Dir)
		})
	}
}

// TestFetchCutThenSucceeds: a transfer cut on the first attempt, however
// the cut looks to the client, is retried once and the second attempt's
// result is all that staging holds.
func TestFetchCutThenSucceeds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cut  func(t *testing.T, w http.ResponseWriter, data []byte)
	}{
		{"hijacked mid-stream", func(t *testing.T, w http.ResponseWriter, data []byte) {
			cutAfter(t, w, data, len(data)/2)
		}},
		{"clean end at a block boundary", func(t *testing.T, w http.ResponseWriter, data []byte) {
			// HTTP framing says the body is complete; only the tar
			// stream knows it is not.
			n := len(data) / 2 / 512 * 512
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(data[:n])
		}},
		{"clean end mid-block", func(t *testing.T, w http.ResponseWriter, data []byte) {
			n := len(data)/2 + 100
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(data[:n])
		}},
		{"clean end before the end-of-archive marker", func(t *testing.T, w http.ResponseWriter, data []byte) {
			n := len(data) - 1024
			w.Header().Set("Content-Length", strconv.Itoa(n))
			w.Write(data[:n])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			alloc := newSource(t)
			data := snapshotBytes(t, alloc)
			src := newSourceServer(t, alloc, func(real http.Handler, n int, w http.ResponseWriter, r *http.Request) {
				if n == 1 {
					tc.cut(t, w, data)
					return
				}
				real.ServeHTTP(w, r)
			})
			opts := fetchOptions(t, src.srv.URL)
			res, err := migrate.Fetch(t.Context(), opts)
			if err != nil {
				t.Fatalf("got error %v, want success after one retry", err)
			}
			if n := src.requests.Load(); n != 2 {
				t.Errorf("got %d requests, want 2", n)
			}
			if res.Attempts != 2 {
				t.Errorf("got %d attempts, want 2", res.Attempts)
			}
			assertStagingHolds(t, opts.StagingDir, res.Dir)
			if got, want := readTree(t, res.Dir), readTree(t, alloc.AllocDirPath()); len(got) != len(want) {
				t.Errorf("got %d nodes, want %d", len(got), len(want))
			}
		})
	}
}

// TestFetchAlwaysCut: a source that always cuts exhausts the attempts and
// leaves staging empty.
func TestFetchAlwaysCut(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	src := newSourceServer(t, alloc, func(_ http.Handler, _ int, w http.ResponseWriter, _ *http.Request) {
		cutAfter(t, w, data, len(data)/2)
	})
	opts := fetchOptions(t, src.srv.URL)
	opts.Retries = 3
	_, err := migrate.Fetch(t.Context(), opts)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("got error %v, want one wrapping io.ErrUnexpectedEOF", err)
	}
	if n := src.requests.Load(); n != 3 {
		t.Errorf("got %d requests, want 3", n)
	}
	assertStagingEmpty(t, opts.StagingDir)
}

// TestFetchMaliciousArchive: an archive refused for its content is not
// retried and leaves staging empty.
func TestFetchMaliciousArchive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		entries []allocdirtest.TarEntry
	}{
		{"symlink escape", []allocdirtest.TarEntry{
			allocdirtest.TarDir("alloc/data"),
			allocdirtest.TarSymlink("alloc/data/evil", "../../../../etc"),
			allocdirtest.TarFile("alloc/data/ok", "x"),
		}},
		{"symlink escape through another link", []allocdirtest.TarEntry{
			allocdirtest.TarDir("alloc/data"),
			allocdirtest.TarSymlink("alloc/data/up", "../.."),
			allocdirtest.TarSymlink("alloc/data/evil", "up/../etc"),
		}},
		{"absolute symlink", []allocdirtest.TarEntry{
			allocdirtest.TarDir("alloc/data"),
			allocdirtest.TarSymlink("alloc/data/evil", "/etc/shadow"),
		}},
		{"write through a symlink", []allocdirtest.TarEntry{
			allocdirtest.TarDir("alloc/data"),
			allocdirtest.TarSymlink("alloc/data/d", "."),
			allocdirtest.TarFile("alloc/data/d/x", "x"),
		}},
		{"dot-dot name", []allocdirtest.TarEntry{
			allocdirtest.TarDir("alloc/data"),
			allocdirtest.TarFile("alloc/data/../../x", "x"),
		}},
		{"outside the layout", []allocdirtest.TarEntry{
			allocdirtest.TarFile("web/secrets/token", "x"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var count atomic.Int32
			srv := staticServer(t, allocdirtest.Tar(t, true, tc.entries...), &count)
			opts := fetchOptions(t, srv.URL)
			_, err := migrate.Fetch(t.Context(), opts)
			if !errors.Is(err, allocdir.ErrArchive) {
				t.Errorf("got error %v, want one wrapping ErrArchive", err)
			}
			if n := count.Load(); n != 1 {
				t.Errorf("got %d requests, want 1", n)
			}
			assertStagingEmpty(t, opts.StagingDir)
		})
	}
}

// TestFetchSenderError: a snapshot that failed on the source arrives as a
// complete archive carrying the error entry; it is refused and not
// retried, from the real handler and from a Nomad source that appends its
// error text after the archive.
func TestFetchSenderError(t *testing.T) {
	t.Parallel()
	t.Run("allocfs source", func(t *testing.T) {
		t.Parallel()
		alloc := newSource(t)
		// A registered task whose local/ does not exist makes the
		// snapshot fail after alloc/data was sent.
		alloc.NewTaskDir(allocdir.Task{Name: "zzz"})
		src := newSourceServer(t, alloc, nil)
		opts := fetchOptions(t, src.srv.URL)
		_, err := migrate.Fetch(t.Context(), opts)
		if !errors.Is(err, allocdir.ErrArchive) {
			t.Errorf("got error %v, want one wrapping ErrArchive", err)
		}
		if n := src.requests.Load(); n != 1 {
			t.Errorf("got %d requests, want 1", n)
		}
		assertStagingEmpty(t, opts.StagingDir)
	})
	t.Run("nomad source", func(t *testing.T) {
		t.Parallel()
		body := allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/x", strings.Repeat("x", 5000)),
			allocdirtest.TarFile("NOMAD-"+srcID+"-ERROR.log", "Error snapshotting: disk on fire"))
		body = append(body, "failed to snapshot: disk on fire"...)
		var count atomic.Int32
		srv := staticServer(t, body, &count)
		opts := fetchOptions(t, srv.URL)
		_, err := migrate.Fetch(t.Context(), opts)
		if !errors.Is(err, allocdir.ErrArchive) {
			t.Errorf("got error %v, want one wrapping ErrArchive", err)
		}
		if n := count.Load(); n != 1 {
			t.Errorf("got %d requests, want 1", n)
		}
		assertStagingEmpty(t, opts.StagingDir)
	})
}

// tamperWriter flips one byte of the stream at offset on its way out and
// passes everything else, the trailer included, through.
type tamperWriter struct {
	http.ResponseWriter
	offset int64
	n      int64
}

func (w *tamperWriter) Write(p []byte) (int, error) {
	if i := w.offset - w.n; i >= 0 && i < int64(len(p)) {
		p = bytes.Clone(p)
		p[i] ^= 0xff
	}
	w.n += int64(len(p))
	return w.ResponseWriter.Write(p)
}

// TestFetchIntegrityMismatch: a byte flipped inside a file body keeps the
// archive valid, so only the digest catches it; every attempt is refused
// and nothing is left.
func TestFetchIntegrityMismatch(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	offset := bytes.Index(data, []byte(helloBody))
	if offset < 0 {
		t.Fatal("file body not found in the archive")
	}
	src := newSourceServer(t, alloc, func(real http.Handler, _ int, w http.ResponseWriter, r *http.Request) {
		real.ServeHTTP(&tamperWriter{ResponseWriter: w, offset: int64(offset) + 3}, r)
	})
	opts := fetchOptions(t, src.srv.URL)
	opts.Retries = 2
	_, err := migrate.Fetch(t.Context(), opts)
	if !errors.Is(err, migrate.ErrIntegrity) {
		t.Errorf("got error %v, want one wrapping ErrIntegrity", err)
	}
	if n := src.requests.Load(); n != 2 {
		t.Errorf("got %d requests, want 2", n)
	}
	assertStagingEmpty(t, opts.StagingDir)
}

// TestFetchNomadSource: a source that sends no digest (stock Nomad) is
// accepted on the archive's own end-of-archive check, unverified.
func TestFetchNomadSource(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	var count atomic.Int32
	srv := staticServer(t, snapshotBytes(t, alloc), &count)
	opts := fetchOptions(t, srv.URL)
	res, err := migrate.Fetch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.Verified {
		t.Error("got Verified true, want false")
	}
	assertStagingHolds(t, opts.StagingDir, res.Dir)
}

// stallAfterHalf sends half of data, then nothing until the client goes
// away; started is closed once the half is on the wire.
func stallAfterHalf(w http.ResponseWriter, r *http.Request, data []byte, started chan<- struct{}) {
	w.Header().Set("Content-Type", "application/x-tar")
	w.Write(data[:len(data)/2])
	http.NewResponseController(w).Flush()
	if started != nil {
		close(started)
	}
	<-r.Context().Done()
}

// TestFetchCancelMidTransfer: cancelling the context mid-transfer returns
// its error at once, without a retry, and leaves staging empty.
func TestFetchCancelMidTransfer(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	started := make(chan struct{})
	src := newSourceServer(t, alloc, func(_ http.Handler, n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			stallAfterHalf(w, r, data, started)
			return
		}
		stallAfterHalf(w, r, data, nil)
	})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		<-started
		time.Sleep(50 * time.Millisecond)
		cancel()
	}()
	opts := fetchOptions(t, src.srv.URL)
	begin := time.Now()
	_, err := migrate.Fetch(ctx, opts)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got error %v, want one wrapping context.Canceled", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("took %s, want a prompt return", d)
	}
	if n := src.requests.Load(); n != 1 {
		t.Errorf("got %d requests, want 1", n)
	}
	assertStagingEmpty(t, opts.StagingDir)
}

// TestFetchStall: a source that stops sending is abandoned after
// StallTimeout and retried.
func TestFetchStall(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	src := newSourceServer(t, alloc, func(_ http.Handler, _ int, w http.ResponseWriter, r *http.Request) {
		stallAfterHalf(w, r, data, nil)
	})
	opts := fetchOptions(t, src.srv.URL)
	opts.Retries = 2
	opts.StallTimeout = 150 * time.Millisecond
	begin := time.Now()
	_, err := migrate.Fetch(t.Context(), opts)
	if err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("got error %v, want a stall", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("took %s, want about 2 × 150ms", d)
	}
	// The client gives an attempt up on its own clock: on a busy machine
	// the server's handler may count the second request only after
	// Fetch returned.
	deadline := time.Now().Add(10 * time.Second)
	for src.requests.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := src.requests.Load(); n != 2 {
		t.Errorf("got %d requests, want 2", n)
	}
	assertStagingEmpty(t, opts.StagingDir)
}

// TestFetchNoGoroutineLeak: a fetch with a retry leaves no goroutine
// running once it returned and the source is gone. Not parallel: it
// counts the process's goroutines.
func TestFetchNoGoroutineLeak(t *testing.T) {
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	before := runtime.NumGoroutine()
	src := newSourceServer(t, alloc, func(real http.Handler, n int, w http.ResponseWriter, r *http.Request) {
		if n == 1 {
			cutAfter(t, w, data, len(data)/2)
			return
		}
		real.ServeHTTP(w, r)
	})
	opts := fetchOptions(t, src.srv.URL)
	var reports atomic.Int32
	opts.Progress = func(migrate.Progress) { reports.Add(1) }
	if _, err := migrate.Fetch(t.Context(), opts); err != nil {
		t.Fatal(err)
	}
	src.srv.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Errorf("got %d goroutines, want at most %d as before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// TestFetchProgress: reports arrive while bytes flow, at least 200 ms
// apart, with growing byte counts, and end with one Done report.
func TestFetchProgress(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	src := newSourceServer(t, alloc, func(real http.Handler, _ int, w http.ResponseWriter, r *http.Request) {
		real.ServeHTTP(&slowWriter{ResponseWriter: w, delay: 60 * time.Millisecond, chunk: 256 << 10}, r)
	})
	var (
		mu      sync.Mutex
		reports []migrate.Progress
	)
	opts := fetchOptions(t, src.srv.URL)
	opts.Progress = func(p migrate.Progress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	}
	res, err := migrate.Fetch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) < 3 {
		t.Fatalf("got %d reports, want at least 3 (two while flowing, one done): %+v", len(reports), reports)
	}
	last := reports[len(reports)-1]
	if !last.Done || last.Err != nil || last.Bytes != res.Bytes {
		t.Errorf("got last report %+v, want Done with %d bytes and no error", last, res.Bytes)
	}
	for i, p := range reports[:len(reports)-1] {
		if p.Done {
			t.Errorf("report %d: got Done before the end", i)
		}
		if p.AllocID != srcID || p.Attempt != 1 || p.Total != -1 {
			t.Errorf("report %d: got %+v, want alloc %s, attempt 1, total -1", i, p, srcID)
		}
		if i == 0 {
			continue
		}
		prev := reports[i-1]
		if p.Bytes <= prev.Bytes {
			t.Errorf("report %d: got %d bytes after %d, want more", i, p.Bytes, prev.Bytes)
		}
		if d := p.Elapsed - prev.Elapsed; d < 200*time.Millisecond {
			t.Errorf("report %d: got %s after the previous one, want at least 200ms", i, d)
		}
		if p.Rate <= 0 {
			t.Errorf("report %d: got rate %f, want > 0", i, p.Rate)
		}
	}
}

// TestFetchRetryReports: every retried attempt is reported, with the wait
// before the next, even one that never reached the source (nothing
// listens), so that a client waiting on the fetch hears of each retry.
func TestFetchRetryReports(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ln.Close()
	var (
		mu      sync.Mutex
		reports []migrate.Progress
	)
	opts := fetchOptions(t, url)
	opts.Retries = 3
	opts.Progress = func(p migrate.Progress) {
		mu.Lock()
		reports = append(reports, p)
		mu.Unlock()
	}
	if _, err := migrate.Fetch(t.Context(), opts); err == nil {
		t.Fatal("a fetch from nothing succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2 {
		t.Fatalf("got %d reports, want one per retried attempt (2): %+v", len(reports), reports)
	}
	for i, p := range reports {
		if p.Attempt != i+1 || !p.Done || p.Err == nil || p.RetryIn <= 0 {
			t.Errorf("report %d: got %+v, want attempt %d done with its error and the wait before the next", i, p, i+1)
		}
	}
}

// slowWriter passes the stream on in chunks, pausing between them.
type slowWriter struct {
	http.ResponseWriter
	delay time.Duration
	chunk int
}

func (w *slowWriter) Write(p []byte) (int, error) {
	var n int
	for len(p) > 0 {
		c := min(len(p), w.chunk)
		m, err := w.ResponseWriter.Write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		http.NewResponseController(w.ResponseWriter).Flush()
		time.Sleep(w.delay)
		p = p[c:]
	}
	return n, nil
}

// TestFetchInvalidOptions: bad options fail before any request.
func TestFetchInvalidOptions(t *testing.T) {
	t.Parallel()
	var count atomic.Int32
	srv := staticServer(t, nil, &count)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*migrate.FetchOptions){
		"alloc ID with slash":  func(o *migrate.FetchOptions) { o.AllocID = "a/b" },
		"empty alloc ID":       func(o *migrate.FetchOptions) { o.AllocID = "" },
		"no scheme":            func(o *migrate.FetchOptions) { o.URL = "10.0.0.1:4646" },
		"ftp":                  func(o *migrate.FetchOptions) { o.URL = "ftp://10.0.0.1" },
		"missing staging":      func(o *migrate.FetchOptions) { o.StagingDir = filepath.Join(o.StagingDir, "nope") },
		"staging is not a dir": func(o *migrate.FetchOptions) { o.StagingDir = file },
	} {
		opts := fetchOptions(t, srv.URL)
		mod(&opts)
		if _, err := migrate.Fetch(t.Context(), opts); err == nil {
			t.Errorf("%s: got success, want an error", name)
		}
	}
	if n := count.Load(); n != 0 {
		t.Errorf("got %d requests, want 0", n)
	}
}

// TestFetchTLS: a source whose certificate the client trusts works; one
// it does not trust is refused on the first attempt.
func TestFetchTLS(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	h := migrate.SnapshotHandler(testLogger(t), func(string) (allocdir.FS, error) { return alloc, nil }, migrate.SharedToken(secret))
	srv := httptest.NewUnstartedServer(h)
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake
	srv.StartTLS()
	t.Cleanup(srv.Close)

	opts := fetchOptions(t, srv.URL)
	opts.HTTPClient = srv.Client()
	res, err := migrate.Fetch(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Verified {
		t.Error("got Verified false, want true")
	}
	conns.Store(0)
	opts = fetchOptions(t, srv.URL)
	if _, err := migrate.Fetch(t.Context(), opts); err == nil {
		t.Error("untrusted certificate: got success, want an error")
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("untrusted certificate: got %d connections, want 1 (no retry)", n)
	}
	assertStagingEmpty(t, opts.StagingDir)
}

// trickle sends data chunk bytes at a time, one chunk every pause, until
// it is all sent or the client went away; sent counts what went out.
func trickle(w http.ResponseWriter, r *http.Request, data []byte, chunk int, pause time.Duration, sent *atomic.Int64) {
	w.Header().Set("Content-Type", "application/x-tar")
	rc := http.NewResponseController(w)
	for len(data) > 0 {
		c := min(chunk, len(data))
		n, err := w.Write(data[:c])
		sent.Add(int64(n))
		if err != nil || rc.Flush() != nil {
			return
		}
		data = data[c:]
		select {
		case <-r.Context().Done():
			return
		case <-time.After(pause):
		}
	}
}

// TestFetchDeadline: the deadline ends a fetch whose bytes keep flowing,
// and one that waits to retry; either way Fetch fails with ErrDeadline
// (and context.DeadlineExceeded), without another attempt, and staging
// is left empty.
func TestFetchDeadline(t *testing.T) {
	t.Parallel()
	t.Run("trickling", func(t *testing.T) {
		t.Parallel()
		alloc := newSource(t)
		data := snapshotBytes(t, alloc)
		var sent atomic.Int64
		src := newSourceServer(t, alloc, func(_ http.Handler, _ int, w http.ResponseWriter, r *http.Request) {
			// 25 KiB/s: the 3 MiB archive would take two minutes.
			trickle(w, r, data, 512, 20*time.Millisecond, &sent)
		})
		opts := fetchOptions(t, src.srv.URL)
		opts.Deadline = 300 * time.Millisecond
		opts.MinProgressBytes = -1 // only the deadline may end it
		_, err := migrate.Fetch(t.Context(), opts)
		if !errors.Is(err, migrate.ErrDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got error %v, want one wrapping ErrDeadline and context.DeadlineExceeded", err)
		}
		if n := src.requests.Load(); n != 1 {
			t.Errorf("got %d requests, want 1", n)
		}
		if n := sent.Load(); n == 0 || n >= int64(len(data)) {
			t.Errorf("source sent %d of %d bytes, want some but not all", n, len(data))
		}
		assertStagingEmpty(t, opts.StagingDir)
	})
	t.Run("waiting to retry", func(t *testing.T) {
		t.Parallel()
		src := newSourceServer(t, newSource(t), func(_ http.Handler, _ int, w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "busy", http.StatusServiceUnavailable)
		})
		opts := fetchOptions(t, src.srv.URL)
		opts.Backoff = time.Hour
		opts.Deadline = 200 * time.Millisecond
		_, err := migrate.Fetch(t.Context(), opts)
		if !errors.Is(err, migrate.ErrDeadline) {
			t.Errorf("got error %v, want one wrapping ErrDeadline", err)
		}
		if n := src.requests.Load(); n != 1 {
			t.Errorf("got %d requests, want 1", n)
		}
		assertStagingEmpty(t, opts.StagingDir)
	})
}

// TestFetchTooSlow: a source that never stalls but sends less than
// MinProgressBytes per MinProgressWindow has each attempt abandoned with
// ErrTooSlow, is retried like a stalled one, and leaves staging empty.
func TestFetchTooSlow(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	data := snapshotBytes(t, alloc)
	var sent atomic.Int64
	src := newSourceServer(t, alloc, func(_ http.Handler, _ int, w http.ResponseWriter, r *http.Request) {
		// 16 bytes every 20 ms: at most 120 bytes per window.
		trickle(w, r, data, 16, 20*time.Millisecond, &sent)
	})
	opts := fetchOptions(t, src.srv.URL)
	opts.Retries = 2
	opts.MinProgressBytes = 1 << 10
	opts.MinProgressWindow = 150 * time.Millisecond
	_, err := migrate.Fetch(t.Context(), opts)
	if !errors.Is(err, migrate.ErrTooSlow) {
		t.Errorf("got error %v, want one wrapping ErrTooSlow", err)
	}
	if errors.Is(err, migrate.ErrDeadline) {
		t.Errorf("got error %v, want the pace rule, not the deadline", err)
	}
	if n := src.requests.Load(); n != 2 {
		t.Errorf("got %d requests, want 2 (a slow attempt is retried)", n)
	}
	if n := sent.Load(); n >= 2*int64(len(data)) {
		t.Errorf("source sent %d bytes, want the attempts cut short", n)
	}
	assertStagingEmpty(t, opts.StagingDir)
}
