package migrate_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/disk"
	"github.com/allocfs/allocfs/migrate"
)

// get requests srcID's snapshot (or id's) from url with extra headers.
func get(t *testing.T, url, id string, header map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+migrate.SnapshotPath(id), nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// TestSnapshotHandlerServesNomadTar: the body is exactly the allocation's
// snapshot, a plain tar with Nomad's names, and the trailer is its
// SHA-256.
func TestSnapshotHandlerServesNomadTar(t *testing.T) {
	t.Parallel()
	src := newSourceServer(t, newSource(t), nil)
	resp, body := get(t, src.srv.URL, srcID, map[string]string{migrate.TokenHeader: secret})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("got status %d, want 200", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-tar" {
		t.Errorf("got Content-Type %q, want application/x-tar", ct)
	}
	if !bytes.Equal(body, snapshotBytes(t, src.alloc)) {
		t.Error("got a body that differs from the allocation's snapshot")
	}
	sum := crc32.Checksum(body, crc32.MakeTable(crc32.Castagnoli))
	if got, want := resp.Trailer.Get(migrate.TrailerCRC32C), fmt.Sprintf("%08x", sum); got != want {
		t.Errorf("got trailer %q, want %q", got, want)
	}
	tr := tar.NewReader(bytes.NewReader(body))
	var names []string
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	if len(names) < 2 || names[0] != "alloc/data" || !strings.HasPrefix(names[len(names)-1], "web/local") {
		t.Errorf("got entries %q, want alloc/data first and web/local's last", names)
	}
}

// TestSnapshotHandlerTokens: only a token the checker accepts, in either
// header, gets the snapshot; a refused request never reaches the lookup.
func TestSnapshotHandlerTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		header map[string]string
		want   int
	}{
		{"X-Nomad-Token", map[string]string{"X-Nomad-Token": secret}, http.StatusOK},
		{"bearer", map[string]string{"Authorization": "Bearer " + secret}, http.StatusOK},
		{"bearer lowercase", map[string]string{"Authorization": "bearer " + secret}, http.StatusOK},
		{"missing", nil, http.StatusForbidden},
		{"wrong", map[string]string{"X-Nomad-Token": secret + "x"}, http.StatusForbidden},
		{"prefix", map[string]string{"X-Nomad-Token": secret[:3]}, http.StatusForbidden},
		{"wrong bearer", map[string]string{"Authorization": "Bearer nope"}, http.StatusForbidden},
		{"basic", map[string]string{"Authorization": "Basic " + secret}, http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newSourceServer(t, newSource(t), nil)
			resp, body := get(t, src.srv.URL, srcID, tc.header)
			if resp.StatusCode != tc.want {
				t.Fatalf("got status %d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want != http.StatusForbidden {
				return
			}
			if got := strings.TrimSpace(string(body)); got != "Permission denied" {
				t.Errorf("got body %q, want %q", got, "Permission denied")
			}
			if n := src.lookups.Load(); n != 0 {
				t.Errorf("got %d lookups, want 0", n)
			}
		})
	}
}

// handlerServer serves SnapshotHandler with the given lookup and tokens.
func handlerServer(t *testing.T, lookup func(string) (allocdir.FS, error), tokens migrate.TokenChecker) string {
	t.Helper()
	srv := httptest.NewServer(migrate.SnapshotHandler(testLogger(t), lookup, tokens))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSnapshotHandlerNodeSecretToken: a derived token opens its own
// allocation only; a nil checker opens nothing.
func TestSnapshotHandlerNodeSecretToken(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	var lookups atomic.Int32
	lookup := func(string) (allocdir.FS, error) { lookups.Add(1); return alloc, nil }
	tokens := migrate.NodeSecretToken("node-secret")
	url := handlerServer(t, lookup, tokens)
	if resp, _ := get(t, url, srcID, map[string]string{migrate.TokenHeader: tokens.Derive(srcID)}); resp.StatusCode != http.StatusOK {
		t.Errorf("own token: got status %d, want 200", resp.StatusCode)
	}
	if resp, _ := get(t, url, srcID, map[string]string{migrate.TokenHeader: tokens.Derive(goneID)}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("another alloc's token: got status %d, want 403", resp.StatusCode)
	}
	nilURL := handlerServer(t, lookup, nil)
	if resp, _ := get(t, nilURL, srcID, map[string]string{migrate.TokenHeader: tokens.Derive(srcID)}); resp.StatusCode != http.StatusForbidden {
		t.Errorf("nil checker: got status %d, want 403", resp.StatusCode)
	}
	if n := lookups.Load(); n != 1 {
		t.Errorf("got %d lookups, want 1", n)
	}
}

// TestSnapshotHandlerErrors: failures before the archive starts get their
// own status, and internal details stay in the log.
func TestSnapshotHandlerErrors(t *testing.T) {
	t.Parallel()
	unbuilt, err := disk.New(testLogger(t), t.TempDir(), srcID)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		lookup func(string) (allocdir.FS, error)
		id     string
		want   int
	}{
		{"unknown", func(id string) (allocdir.FS, error) {
			return nil, fmt.Errorf("alloc %s: %w", id, allocdir.ErrUnknownAlloc)
		}, srcID, http.StatusNotFound},
		{"gone", func(id string) (allocdir.FS, error) {
			return nil, fmt.Errorf("alloc %s: %w", id, allocdir.ErrGone)
		}, srcID, http.StatusGone},
		{"lookup fails", func(string) (allocdir.FS, error) {
			return nil, errors.New("/secret/host/path: EIO")
		}, srcID, http.StatusInternalServerError},
		{"snapshot fails before writing", func(string) (allocdir.FS, error) {
			return unbuilt, nil
		}, srcID, http.StatusInternalServerError},
		{"invalid ID", func(string) (allocdir.FS, error) {
			t.Error("lookup called for an invalid ID")
			return nil, nil
		}, strings.Repeat("x", 256), http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := handlerServer(t, tc.lookup, migrate.SharedToken(secret))
			resp, body := get(t, url, tc.id, map[string]string{migrate.TokenHeader: secret})
			if resp.StatusCode != tc.want {
				t.Errorf("got status %d (%q), want %d", resp.StatusCode, body, tc.want)
			}
			if strings.Contains(string(body), "/secret/") || strings.Contains(string(body), "/tmp/") {
				t.Errorf("got body %q, want no host path", body)
			}
			if resp.Header.Get("Trailer") != "" || resp.Header.Get("Content-Type") == "application/x-tar" {
				t.Errorf("got headers %v, want no archive headers on an error", resp.Header)
			}
		})
	}
}

// TestSnapshotHandlerHead: HEAD checks token and allocation and sends no
// archive.
func TestSnapshotHandlerHead(t *testing.T) {
	t.Parallel()
	src := newSourceServer(t, newSource(t), nil)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodHead, src.srv.URL+migrate.SnapshotPath(srcID), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(migrate.TokenHeader, secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-tar" {
		t.Errorf("got status %d, Content-Type %q, want 200 application/x-tar", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// failingWriter is a client that goes away after limit bytes.
type failingWriter struct {
	*httptest.ResponseRecorder
	limit int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.Body.Len()+len(p) > w.limit {
		return 0, errors.New("connection reset by peer")
	}
	return w.ResponseRecorder.Write(p)
}

// TestSnapshotHandlerClientGone: when the client goes away the handler
// stops writing, returns, and sends no digest.
func TestSnapshotHandlerClientGone(t *testing.T) {
	t.Parallel()
	alloc := newSource(t)
	h := migrate.SnapshotHandler(testLogger(t), func(string) (allocdir.FS, error) { return alloc, nil }, migrate.SharedToken(secret))
	req := httptest.NewRequestWithContext(t.Context(), http.MethodGet, migrate.SnapshotPath(srcID), nil)
	req.Header.Set(migrate.TokenHeader, secret)
	w := &failingWriter{ResponseRecorder: httptest.NewRecorder(), limit: 1 << 20}
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		t.Errorf("got status %d, want 200 (sent before the failure)", w.Code)
	}
	if got := w.Header().Get(migrate.TrailerCRC32C); got != "" {
		t.Errorf("got digest %q, want none for a transfer that failed", got)
	}
}

// TestSharedToken: constant-time equality with the configured secret;
// empty on either side refuses.
func TestSharedToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		secret, token string
		want          bool
	}{
		{"abc", "abc", true},
		{"abc", "abd", false},
		{"abc", "ab", false},
		{"abc", "abcd", false},
		{"abc", "", false},
		{"", "", false},
		{"", "abc", false},
	} {
		if got := migrate.SharedToken(tc.secret).Check(srcID, tc.token); got != tc.want {
			t.Errorf("SharedToken(%q).Check(%q): got %v, want %v", tc.secret, tc.token, got, tc.want)
		}
	}
}

// TestNodeSecretToken: tokens are Nomad's migrate tokens,
// base64url(BLAKE2b-512 keyed with the node secret, over the allocation
// ID), bound to one allocation and one secret, padded or not. The expected
// value was computed with Python's hashlib.blake2b, an implementation
// independent of ours.
func TestNodeSecretToken(t *testing.T) {
	t.Parallel()
	n := migrate.NodeSecretToken("7e4b1f0a-3c2d-4e5f-8a9b-0c1d2e3f4a5b")
	const want = "HZ5WVSyYazetqtd22qETtz1-bfGbggMWRQK3WOvJkE6QVLGwYzJw4iPvYxAz8LexfA9GbkFHtOZODZyAZa4lOg=="
	if got := n.Derive(srcID); got != want {
		t.Errorf("got Derive %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name  string
		check migrate.NodeSecretToken
		id    string
		token string
		want  bool
	}{
		{"own", n, srcID, want, true},
		{"unpadded", n, srcID, strings.TrimRight(want, "="), true},
		{"other alloc", n, goneID, want, false},
		{"other secret", migrate.NodeSecretToken("other"), srcID, want, false},
		{"empty token", n, srcID, "", false},
		{"empty secret", "", srcID, migrate.NodeSecretToken("").Derive(srcID), false},
		{"garbage", n, srcID, "!!!", false},
		{"secret over 64 bytes", migrate.NodeSecretToken(strings.Repeat("k", 65)), srcID, want, false},
		{"truncated", n, srcID, want[:20], false},
	} {
		if got := tc.check.Check(tc.id, tc.token); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
	if got := migrate.NodeSecretToken("").Derive(srcID); got != "" {
		t.Errorf("empty secret: got Derive %q, want \"\"", got)
	}
}
