package migrate_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/allocdir/disk"
	"github.com/allocfs/allocfs/migrate"
)

const (
	// srcID is the allocation the test sources serve.
	srcID = "5f0c7a2e-8d1b-4e43-9a6f-2b7d9e1c0a31"
	// goneID is an allocation the test lookup reports as collected.
	goneID = "9e4d3c2b-1a0f-4e5d-8c7b-6a5f4e3d2c1b"
	// secret is the shared token of the test sources.
	secret = "s3cret-token"
	// helloBody is the content of alloc/data/hello.txt; the tamper test
	// finds it in the stream to flip a byte of a file body.
	helloBody = "hello from the previous allocation\n"
)

// testLogger writes to the test's log; see allocdirtest.Logger.
var testLogger = allocdirtest.Logger

// newSource builds the previous allocation on disk: alloc/data and
// web/local with files of several modes, a 3 MiB file (so that a
// transfer can be cut in the middle of a body), nested and sticky
// directories and symbolic links. web/local is created by hand rather than
// by TaskDir.Build, which would mount a tmpfs for secrets/ as root.
func newSource(t *testing.T) *disk.AllocDir {
	t.Helper()
	d, err := disk.New(testLogger(t), t.TempDir(), srcID)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Build(); err != nil {
		t.Fatal(err)
	}
	d.NewTaskDir(allocdir.Task{Name: "web"})
	root := d.AllocDirPath()
	big := make([]byte, 3<<20+123)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	dirs := []struct {
		name string
		mode fs.FileMode
	}{
		{"web", 0o777},
		{"web/local", 0o777},
		{"alloc/data/bin", 0o755},
		{"alloc/data/nested/deep", 0o750},
		{"alloc/data/sticky", 0o777 | fs.ModeSticky},
		{"web/local/conf", 0o700},
	}
	for _, dir := range dirs {
		p := filepath.Join(root, dir.name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, dir.mode); err != nil {
			t.Fatal(err)
		}
	}
	files := []struct {
		name string
		mode fs.FileMode
		body []byte
	}{
		{"alloc/data/hello.txt", 0o640, []byte(helloBody)},
		{"alloc/data/bin/run.sh", 0o755, []byte("#!/bin/sh\necho hi\n")},
		{"alloc/data/nested/deep/big.bin", 0o600, big},
		{"alloc/data/empty", 0o444, nil},
		{"web/local/conf/app.toml", 0o600, []byte("port = 8080\n")},
	}
	for _, f := range files {
		p := filepath.Join(root, f.name)
		if err := os.WriteFile(p, f.body, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"alloc/data/link":      "hello.txt",
		"alloc/data/bin/up":    "../nested/deep",
		"web/local/shared.txt": "../../alloc/data/hello.txt",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// snapshotBytes is the archive the source serves.
func snapshotBytes(t *testing.T, d allocdir.FS) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := d.Snapshot(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// source is a test node: the real handler over one on-disk allocation,
// behind an optional wrapper that can misbehave, with counters.
type source struct {
	alloc    *disk.AllocDir
	srv      *httptest.Server
	requests atomic.Int32
	lookups  atomic.Int32
}

// newSourceServer serves alloc through SnapshotHandler. wrap, when not
// nil, receives the real handler and the request number (from 1) and may
// answer instead of it.
func newSourceServer(t *testing.T, alloc *disk.AllocDir, wrap func(real http.Handler, n int, w http.ResponseWriter, r *http.Request)) *source {
	t.Helper()
	s := &source{alloc: alloc}
	lookup := func(id string) (allocdir.FS, error) {
		s.lookups.Add(1)
		switch id {
		case srcID:
			return alloc, nil
		case goneID:
			return nil, fmt.Errorf("alloc %s: %w", id, allocdir.ErrGone)
		}
		return nil, fmt.Errorf("alloc %s: %w", id, allocdir.ErrUnknownAlloc)
	}
	real := migrate.SnapshotHandler(testLogger(t), lookup, migrate.SharedToken(secret))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(s.requests.Add(1))
		if wrap != nil {
			wrap(real, n, w, r)
			return
		}
		real.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// staticServer serves body as a tar to every request.
func staticServer(t *testing.T, body []byte, count *atomic.Int32) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count.Add(1)
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// fetchOptions fetches srcID from url into a fresh staging directory,
// with a backoff short enough for tests.
func fetchOptions(t *testing.T, url string) migrate.FetchOptions {
	t.Helper()
	return migrate.FetchOptions{
		URL:        url,
		AllocID:    srcID,
		Token:      secret,
		StagingDir: t.TempDir(),
		Backoff:    time.Millisecond,
		Logger:     testLogger(t),
	}
}

// cutAfter answers with the first n bytes of data, then hijacks the
// connection and closes it: the client sees the stream stop without the
// end of its chunked encoding.
func cutAfter(t *testing.T, w http.ResponseWriter, data []byte, n int) {
	w.Header().Set("Content-Type", "application/x-tar")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(data[:n]); err != nil {
		t.Errorf("write: %v", err)
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.Flush(); err != nil {
		t.Errorf("flush: %v", err)
		return
	}
	conn, _, err := rc.Hijack()
	if err != nil {
		t.Errorf("hijack: %v", err)
		return
	}
	conn.Close()
}

// assertStagingEmpty checks that a failed fetch left nothing behind.
func assertStagingEmpty(t *testing.T, staging string) {
	t.Helper()
	assertStagingHolds(t, staging)
}

// assertStagingHolds checks that staging holds exactly the given
// directories (full paths).
func assertStagingHolds(t *testing.T, staging string, want ...string) {
	t.Helper()
	entries, err := os.ReadDir(staging)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, filepath.Join(staging, e.Name()))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("staging holds %q, want %q", got, want)
	}
}

// treeNode is what the round trip compares of every node.
type treeNode struct {
	Mode fs.FileMode
	Body string
	Link string
}

// readTree maps every node below the migrated roots of dir to its mode,
// content or link target.
func readTree(t *testing.T, dir string) map[string]treeNode {
	t.Helper()
	tree := make(map[string]treeNode)
	for _, root := range []string{"alloc/data", "web/local"} {
		err := filepath.WalkDir(filepath.Join(dir, root), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(dir, p)
			info, err := e.Info()
			if err != nil {
				return err
			}
			n := treeNode{Mode: info.Mode()}
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				n.Link, err = os.Readlink(p)
			case info.Mode().IsRegular():
				var b []byte
				b, err = os.ReadFile(p)
				n.Body = string(b)
			}
			tree[rel] = n
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return tree
}
