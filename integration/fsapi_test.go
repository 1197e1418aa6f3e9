package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/api/fsapi"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// apiToken is the client API token of the TCP listener in these tests.
const apiToken = "c1f0e9d8-api-token"

// freeAddr returns a loopback address nothing listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// fsNode is a daemon serving the client API on its socket and, behind
// apiToken, on TCP.
type fsNode struct {
	*node
	tcp    string
	socket *http.Client
	web    *http.Client
}

// startFSNode starts it, with extra serve flags args.
func startFSNode(t *testing.T, args ...string) *fsNode {
	t.Helper()
	fstest.RequireFUSE(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(apiToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	n := startNodeWith(t, nil, append([]string{"--http-addr", addr, "--token-file", tokenFile}, args...)...)
	// The warning comes with the TCP listener, which may open just after
	// the socket the harness waits for.
	for deadline := time.Now().Add(harness.Timeout); !strings.Contains(n.Out.String(), "tokens are accepted over plain HTTP"); {
		if time.Now().After(deadline) {
			t.Errorf("a node taking a token over plain HTTP did not warn of it:\n%s", n.Out)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	sock := n.socket
	socketClient := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
	}}
	webClient := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(func() {
		socketClient.CloseIdleConnections()
		webClient.CloseIdleConnections()
	})
	return &fsNode{node: n, tcp: addr, socket: socketClient, web: webClient}
}

// answer is one response, read whole.
type answer struct {
	code int
	body string
	ct   string
	hdr  http.Header
}

// get sends a GET over the socket (tcp false) or over TCP with headers.
func (n *fsNode) get(t *testing.T, tcp bool, path string, headers map[string]string) answer {
	t.Helper()
	base, c := "http://allocfs", n.socket
	if tcp {
		base, c = "http://"+n.tcp, n.web
	}
	req, err := http.NewRequest(http.MethodGet, base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: reading the body: %v", path, err)
	}
	return answer{code: resp.StatusCode, body: string(b), ct: resp.Header.Get("Content-Type"), hdr: resp.Header}
}

// frames decodes a framed body.
func frames(t *testing.T, body string) []fsapi.Frame {
	t.Helper()
	var out []fsapi.Frame
	dec := json.NewDecoder(strings.NewReader(body))
	for {
		var f fsapi.Frame
		if err := dec.Decode(&f); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("body is not a sequence of frames: %v\n%s", err, body)
		}
		out = append(out, f)
	}
}

// framedData is the data of a framed body, in order, and the files it
// came from.
func framedData(t *testing.T, body string) (string, []string) {
	t.Helper()
	var data strings.Builder
	var files []string
	for _, f := range frames(t, body) {
		data.Write(f.Data)
		if f.File != "" && (len(files) == 0 || files[len(files)-1] != f.File) {
			files = append(files, f.File)
		}
	}
	return data.String(), files
}

// TestClientFSAPI drives every endpoint and parameter of Nomad's client
// fs API against a running daemon and checks the status, body, frames and
// content type of each answer, then the same API over TCP with and
// without the token.
func TestClientFSAPI(t *testing.T) {
	n := startFSNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	n.mustCLI(t, "alloc", "create", "old", "--task", "web")
	n.mustCLI(t, "alloc", "stop", "old")
	n.mustCLI(t, "gc", "old")
	a1 := filepath.Join(n.mnt, "a1")
	n.mustSh(t, a1, `
printf 'hello world\n' > alloc/data/hello.txt
mkdir alloc/data/dir
printf '<html><script>alert(1)</script></html>' > web/local/page.html
printf 's3cret' > web/secrets/token
ln -s ../secrets/token web/local/tosecret
ln -s /etc/passwd web/local/out
printf 'zero-a\nzero-b\n' > alloc/logs/web.stdout.0
printf 'one-a\n' > alloc/logs/web.stdout.1
printf 'not a log' > alloc/logs/web.stdout.old
mkfifo alloc/data/fifo
`)
	// A socket a task listens on, as Consul Connect's are.
	sock, err := net.Listen("unix", filepath.Join(a1, "alloc/data/sock"))
	if err != nil {
		t.Fatalf("listen on a unix socket in the allocation: %v", err)
	}
	defer sock.Close()
	const (
		fsp = "/v1/client/fs/"
		// Everything web's stdout holds, across its two files.
		allStdout = "zero-a\nzero-b\none-a\n"
	)
	type check func(t *testing.T, a answer)
	bodyIs := func(want string) check {
		return func(t *testing.T, a answer) {
			if a.body != want {
				t.Errorf("body: got %q, want %q", a.body, want)
			}
		}
	}
	bodyHas := func(want string) check {
		return func(t *testing.T, a answer) {
			if !strings.Contains(a.body, want) {
				t.Errorf("body: got %q, want it to contain %q", a.body, want)
			}
		}
	}
	ctIs := func(want string) check {
		return func(t *testing.T, a answer) {
			if a.ct != want {
				t.Errorf("Content-Type: got %q, want %q", a.ct, want)
			}
		}
	}
	listing := func(names ...string) check {
		return func(t *testing.T, a answer) {
			var files []struct{ Name string }
			if err := json.Unmarshal([]byte(a.body), &files); err != nil {
				t.Fatalf("not a JSON listing: %v\n%s", err, a.body)
			}
			got := map[string]bool{}
			for _, f := range files {
				got[f.Name] = true
			}
			for _, name := range names {
				if !got[name] {
					t.Errorf("listing %s lacks %q", a.body, name)
				}
			}
		}
	}
	statOf := func(size int64, contentType string) check {
		return func(t *testing.T, a answer) {
			var fi struct {
				Size        int64
				IsDir       bool
				ContentType string
			}
			if err := json.Unmarshal([]byte(a.body), &fi); err != nil {
				t.Fatalf("not a JSON AllocFileInfo: %v\n%s", err, a.body)
			}
			if fi.Size != size || fi.ContentType != contentType {
				t.Errorf("stat: got size %d type %q, want %d %q", fi.Size, fi.ContentType, size, contentType)
			}
		}
	}
	framedIs := func(data string, files ...string) check {
		return func(t *testing.T, a answer) {
			gotData, gotFiles := framedData(t, a.body)
			if gotData != data || strings.Join(gotFiles, ",") != strings.Join(files, ",") {
				t.Errorf("frames: got data %q from %v, want %q from %v\n%s", gotData, gotFiles, data, files, a.body)
			}
		}
	}
	firstFrame := func(offset int64, file string) check {
		return func(t *testing.T, a answer) {
			fr := frames(t, a.body)
			if len(fr) == 0 || fr[0].Offset != offset || fr[0].File != file {
				t.Errorf("first frame: got %+v, want offset %d of %s", fr, offset, file)
			}
		}
	}

	for _, tc := range []struct {
		name   string
		path   string
		code   int
		checks []check
	}{
		{"ls root", fsp + "ls/a1", 200, []check{ctIs("application/json"), listing("alloc", "web")}},
		{"ls path", fsp + "ls/a1?path=alloc/logs", 200, []check{listing("web.stdout.0", "web.stdout.1")}},
		{"ls secrets lists", fsp + "ls/a1?path=web/secrets", 200, []check{listing("token")}},
		{"ls no alloc id", fsp + "ls/", 400, []check{bodyIs("must provide a valid alloc id"), ctIs("text/plain; charset=utf-8")}},
		{"ls unknown alloc", fsp + "ls/nope", 404, []check{bodyIs(`Unknown allocation "nope"`)}},
		{"ls collected alloc", fsp + "ls/old", 404, []check{bodyIs("state for allocation old not found on client")}},
		{"ls escape", fsp + "ls/a1?path=../..", 400, []check{bodyHas("escapes the alloc directory")}},
		{"ls missing dir", fsp + "ls/a1?path=alloc/nothere", 404, nil},
		{"ls a file", fsp + "ls/a1?path=alloc/data/hello.txt", 400, nil},

		{"stat no path", fsp + "stat/a1", 400, []check{bodyIs("must provide a file name")}},
		{"stat file", fsp + "stat/a1?path=alloc/data/hello.txt", 200, []check{statOf(12, "text/plain; charset=utf-8")}},
		{"stat secret allowed, not sniffed", fsp + "stat/a1?path=web/secrets/token", 200, []check{statOf(6, "application/octet-stream")}},
		{"stat missing", fsp + "stat/a1?path=alloc/data/none", 404, nil},
		{"stat escape link", fsp + "stat/a1?path=web/local/out", 400, []check{bodyHas("escapes")}},

		{"cat no path", fsp + "cat/a1", 400, []check{bodyIs("must provide a file name")}},
		{"cat file", fsp + "cat/a1?path=alloc/data/hello.txt", 200, []check{bodyIs("hello world\n"), ctIs("application/octet-stream")}},
		{"cat html is not html", fsp + "cat/a1?path=web/local/page.html", 200, []check{ctIs("application/octet-stream"),
			func(t *testing.T, a answer) {
				if a.hdr.Get("X-Content-Type-Options") != "nosniff" {
					t.Errorf("X-Content-Type-Options: got %q, want nosniff", a.hdr.Get("X-Content-Type-Options"))
				}
			}}},
		{"cat directory", fsp + "cat/a1?path=alloc/data/dir", 400, []check{bodyIs(`file "alloc/data/dir" is a directory`)}},
		{"cat secret", fsp + "cat/a1?path=web/secrets/token", 403, []check{bodyHas("reading secret file prohibited")}},
		{"cat link into secrets", fsp + "cat/a1?path=web/local/tosecret", 403, []check{bodyHas("reading secret file prohibited")}},
		{"cat link out", fsp + "cat/a1?path=web/local/out", 400, []check{bodyHas("escapes")}},
		{"cat dotdot", fsp + "cat/a1?path=alloc/../../etc/passwd", 400, []check{bodyHas("escapes")}},
		{"cat unknown alloc", fsp + "cat/nope?path=x", 404, nil},

		{"readat no offset", fsp + "readat/a1?path=alloc/data/hello.txt", 400, []check{bodyHas("error parsing offset")}},
		{"readat bad limit", fsp + "readat/a1?path=alloc/data/hello.txt&offset=0&limit=x", 400, []check{bodyHas("error parsing limit")}},
		{"readat negative", fsp + "readat/a1?path=alloc/data/hello.txt&offset=-1", 400, nil},
		{"readat offset", fsp + "readat/a1?path=alloc/data/hello.txt&offset=6", 200, []check{bodyIs("world\n"), ctIs("application/octet-stream")}},
		{"readat limit", fsp + "readat/a1?path=alloc/data/hello.txt&offset=6&limit=5", 200, []check{bodyIs("world")}},
		{"readat limit 0 is all", fsp + "readat/a1?path=alloc/data/hello.txt&offset=0&limit=0", 200, []check{bodyIs("hello world\n")}},
		{"readat secret", fsp + "readat/a1?path=web/secrets/token&offset=0", 403, nil},
		{"readat past the end", fsp + "readat/a1?path=alloc/data/hello.txt&offset=100", 200, []check{bodyIs("")}},
		{"readat past any file", fsp + "readat/a1?path=alloc/data/hello.txt&offset=100000000000000", 200, []check{bodyIs("")}},
		{"readat offset beyond int64", fsp + "readat/a1?path=alloc/data/hello.txt&offset=100000000000000000000", 400, []check{bodyHas("error parsing offset")}},
		{"cat fifo", fsp + "cat/a1?path=alloc/data/fifo", 400, []check{bodyHas("not a regular file")}},
		{"readat fifo", fsp + "readat/a1?path=alloc/data/fifo&offset=0", 400, []check{bodyHas("not a regular file")}},
		{"stream fifo", fsp + "stream/a1?path=alloc/data/fifo", 400, []check{bodyHas("not a regular file")}},
		{"cat socket", fsp + "cat/a1?path=alloc/data/sock", 400, []check{bodyHas("not a regular file")}},
		{"readat socket", fsp + "readat/a1?path=alloc/data/sock&offset=0", 400, []check{bodyHas("not a regular file")}},

		{"stream no path", fsp + "stream/a1?follow=false", 400, []check{bodyIs("must provide a file name")}},
		{"stream", fsp + "stream/a1?path=alloc/data/hello.txt&follow=false", 200, []check{ctIs("application/json"),
			framedIs("hello world\n", "alloc/data/hello.txt"), firstFrame(12, "alloc/data/hello.txt")}},
		{"stream offset", fsp + "stream/a1?path=alloc/data/hello.txt&follow=false&offset=6", 200, []check{framedIs("world\n", "alloc/data/hello.txt")}},
		{"stream origin end", fsp + "stream/a1?path=alloc/data/hello.txt&follow=false&origin=end&offset=3", 200, []check{framedIs("ld\n", "alloc/data/hello.txt")}},
		{"stream origin end past start", fsp + "stream/a1?path=alloc/data/hello.txt&follow=false&origin=end&offset=100", 200, []check{framedIs("hello world\n", "alloc/data/hello.txt")}},
		{"stream bad origin", fsp + "stream/a1?path=alloc/data/hello.txt&origin=middle", 400, []check{bodyIs("origin must be start or end")}},
		{"stream bad follow", fsp + "stream/a1?path=alloc/data/hello.txt&follow=maybe", 400, []check{bodyHas("failed to parse follow field to boolean")}},
		{"stream bad offset", fsp + "stream/a1?path=alloc/data/hello.txt&offset=x", 400, []check{bodyHas("error parsing offset")}},
		{"stream secret", fsp + "stream/a1?path=web/secrets/token&follow=false", 403, nil},
		{"stream directory", fsp + "stream/a1?path=alloc/data/dir&follow=false", 400, nil},

		{"logs no task", fsp + "logs/a1?type=stdout", 400, []check{bodyIs("must provide task name")}},
		{"logs no type", fsp + "logs/a1?task=web", 400, []check{bodyIs("must provide log type (stdout/stderr)")}},
		{"logs bad type", fsp + "logs/a1?task=web&type=stdin", 400, []check{bodyIs("must provide log type (stdout/stderr)")}},
		{"logs unknown task", fsp + "logs/a1?task=db&type=stdout", 400, []check{bodyIs("unknown task name")}},
		{"logs task alloc", fsp + "logs/a1?task=alloc&type=stdout", 400, []check{bodyIs("unknown task name")}},
		{"logs task escape", fsp + "logs/a1?task=..&type=stdout", 400, []check{bodyIs("unknown task name")}},
		{"logs none of type", fsp + "logs/a1?task=web&type=stderr", 404, []check{bodyIs(`log entry for task "web" and log type "stderr" not found`)}},
		{"logs bad plain", fsp + "logs/a1?task=web&type=stdout&plain=x", 400, []check{bodyHas("failed to parse plain field to boolean")}},
		{"logs bad origin", fsp + "logs/a1?task=web&type=stdout&origin=x", 400, []check{bodyIs("origin must be start or end")}},
		{"logs framed", fsp + "logs/a1?task=web&type=stdout", 200, []check{ctIs("application/json"),
			framedIs(allStdout, "alloc/logs/web.stdout.0", "alloc/logs/web.stdout.1")}},
		{"logs plain", fsp + "logs/a1?task=web&type=stdout&plain=true", 200, []check{ctIs("text/plain; charset=utf-8"), bodyIs(allStdout)}},
		{"logs offset across files", fsp + "logs/a1?task=web&type=stdout&plain=true&offset=9", 200, []check{bodyIs("ro-b\none-a\n")}},
		{"logs origin end", fsp + "logs/a1?task=web&type=stdout&plain=true&origin=end&offset=3", 200, []check{bodyIs("-a\n")}},
		{"logs origin end across files", fsp + "logs/a1?task=web&type=stdout&plain=true&origin=end&offset=9", 200, []check{bodyIs("-b\none-a\n")}},
		{"logs collected alloc", fsp + "logs/old?task=web&type=stdout", 404, nil},

		{"gc running alloc", "/v1/client/allocation/a1/gc", 409, []check{bodyHas("stop it before collecting it")}},
		{"gc unknown alloc", "/v1/client/allocation/nope/gc", 404, nil},
		{"node gc", "/v1/client/gc", 200, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := n.get(t, false, tc.path, nil)
			if a.code != tc.code {
				t.Fatalf("GET %s: status %d, want %d; body %q", tc.path, a.code, tc.code, a.body)
			}
			for _, c := range tc.checks {
				c(t, a)
			}
		})
	}

	// Refused reads of what a task planted are the task's doing: they
	// leave no line in the daemon's log.
	t.Run("no log line for special files", func(t *testing.T) {
		for _, name := range []string{"alloc/data/fifo", "alloc/data/sock"} {
			if out := n.Out.String(); strings.Contains(out, name) {
				t.Errorf("daemon log mentions %s:\n%s", name, out)
			}
		}
	})

	t.Run("gc terminal alloc", func(t *testing.T) {
		n.mustCLI(t, "alloc", "create", "done", "--task", "web")
		n.mustCLI(t, "alloc", "stop", "done")
		if a := n.get(t, false, "/v1/client/allocation/done/gc", nil); a.code != 200 {
			t.Fatalf("gc: status %d, body %q", a.code, a.body)
		}
		if a := n.get(t, false, fsp+"ls/done", nil); a.code != 404 {
			t.Errorf("ls after gc: status %d, want 404", a.code)
		}
	})

	// Over TCP the client API needs the token; the control API is not
	// there at all.
	t.Run("tcp", func(t *testing.T) {
		path := fsp + "cat/a1?path=alloc/data/hello.txt"
		for _, tc := range []struct {
			name    string
			path    string
			headers map[string]string
			code    int
		}{
			{"no token", path, nil, 403},
			{"wrong token", path, map[string]string{"X-Nomad-Token": "nope"}, 403},
			{"X-Nomad-Token", path, map[string]string{"X-Nomad-Token": apiToken}, 200},
			{"bearer", path, map[string]string{"Authorization": "Bearer " + apiToken}, 200},
			{"control API absent", "/v1/allocs", map[string]string{"X-Nomad-Token": apiToken}, 404},
			{"snapshots absent without a migrate token", "/v1/client/allocation/a1/snapshot", map[string]string{"X-Nomad-Token": apiToken}, 404},
		} {
			t.Run(tc.name, func(t *testing.T) {
				a := n.get(t, true, tc.path, tc.headers)
				if a.code != tc.code {
					t.Errorf("status %d, want %d; body %q", a.code, tc.code, a.body)
				}
				if a.code == 200 && a.body != "hello world\n" {
					t.Errorf("body %q", a.body)
				}
			})
		}
	})
}

// follower reads a framed stream in the background.
type follower struct {
	frames chan fsapi.Frame
	done   chan error
	cancel context.CancelFunc
}

func (n *fsNode) follow(t *testing.T, path string) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://allocfs"+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.socket.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: status %d: %s", path, resp.StatusCode, b)
	}
	f := &follower{frames: make(chan fsapi.Frame, 1024), done: make(chan error, 1), cancel: cancel}
	go func() {
		defer resp.Body.Close()
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
			var fr fsapi.Frame
			if err := dec.Decode(&fr); err != nil {
				f.done <- err
				return
			}
			if fr.Data != nil || fr.FileEvent != "" {
				f.frames <- fr
			}
		}
	}()
	t.Cleanup(cancel)
	return f
}

// next returns the next data or event frame. The bound only decides when
// to give up on a broken stream.
func (f *follower) next(t *testing.T) fsapi.Frame {
	t.Helper()
	select {
	case fr := <-f.frames:
		return fr
	case err := <-f.done:
		// The reader queues every frame before it reports the end, but
		// select picks among ready cases at random.
		select {
		case fr := <-f.frames:
			f.done <- err
			return fr
		default:
		}
		t.Fatalf("stream ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no frame within 10s")
	}
	return fsapi.Frame{}
}

// TestClientFSFollow follows files through the API while they are written
// through the mount: appends arrive, a truncation and a deletion arrive as
// their FileEvent frames, and a deletion ends the stream.
func TestClientFSFollow(t *testing.T) {
	n := startFSNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	p := filepath.Join(n.mnt, "a1", "alloc", "data", "f.log")
	if err := os.WriteFile(p, []byte("start\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fl := n.follow(t, "/v1/client/fs/stream/a1?path=alloc/data/f.log")
	if fr := fl.next(t); string(fr.Data) != "start\n" || fr.Offset != 6 {
		t.Fatalf("first frame: got %+v, want start at offset 6", fr)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got strings.Builder
	for i := range 20 {
		line := fmt.Sprintf("line %d\n", i)
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		for !strings.HasSuffix(got.String(), line) {
			got.Write(fl.next(t).Data)
		}
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	for {
		fr := fl.next(t)
		if fr.FileEvent == "file truncated" {
			break
		}
		if len(fr.Data) != 0 {
			t.Fatalf("data frame %+v before the truncation event", fr)
		}
	}
	if _, err := f.WriteString("after\n"); err != nil {
		t.Fatal(err)
	}
	if fr := fl.next(t); string(fr.Data) != "after\n" {
		t.Fatalf("after truncation: got %+v, want the new data", fr)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if fr := fl.next(t); fr.FileEvent != "file deleted" {
		t.Fatalf("after rm: got %+v, want a file deleted frame", fr)
	}
	select {
	case err := <-fl.done:
		if !errors.Is(err, io.EOF) {
			t.Errorf("stream after the deletion: ended with %v, want a clean end", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("stream still open 10s after the file was deleted")
	}
}

// daemonUsage is what the daemon holds: goroutines (its own count), open
// fds and inotify watches.
type daemonUsage struct{ goroutines, fds, watches int }

func (n *fsNode) usage(t *testing.T) daemonUsage {
	t.Helper()
	a := n.get(t, false, api.StatusPath, nil)
	var st api.NodeStatus
	if err := json.Unmarshal([]byte(a.body), &st); err != nil {
		t.Fatalf("status: %v: %s", err, a.body)
	}
	u := daemonUsage{goroutines: st.Goroutines}
	fdDir := fmt.Sprintf("/proc/%d/fd", n.Pid())
	entries, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	u.fds = len(entries)
	for _, e := range entries {
		target, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil || target != "anon_inode:inotify" {
			continue
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", n.Pid(), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		u.watches += strings.Count(string(info), "inotify wd:")
	}
	return u
}

// TestClientFSFollowersLeaveNothing opens many followers, of files that
// exist and of log files that do not exist yet, drops their connections,
// and checks that the daemon is back to the goroutines, fds and inotify
// watches it had.
func TestClientFSFollowersLeaveNothing(t *testing.T) {
	n := startFSNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	logs := filepath.Join(n.mnt, "a1", "alloc", "logs")
	if err := os.WriteFile(filepath.Join(logs, "web.stdout.0"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Followers are opened a batch at a time and each is waited for until
	// its first frame (sent at the server's 200 ms flush), so that every
	// one is parked at the end of its file, waiting on inotify, when its
	// client goes away. One round first, so that what is started once
	// (the notifier, HTTP connections) is in the baseline.
	round := func(count int) {
		const batch = 100
		for done := 0; done < count; done += batch {
			var open []*follower
			for i := range min(batch, count-done) {
				path := "/v1/client/fs/logs/a1?task=web&type=stdout&follow=true"
				if i%2 == 1 {
					path = "/v1/client/fs/stream/a1?path=alloc/logs/web.stdout.0"
				}
				open = append(open, n.follow(t, path))
			}
			for _, fl := range open {
				fl.next(t)
			}
			for _, fl := range open {
				fl.cancel()
				<-fl.done
			}
		}
	}
	round(10)
	n.socket.CloseIdleConnections()
	before := n.usage(t)
	const followers = 2000
	round(followers)
	n.socket.CloseIdleConnections()
	var after daemonUsage
	deadline := time.Now().Add(10 * time.Second)
	for {
		after = n.usage(t)
		if after.goroutines <= before.goroutines+2 && after.fds <= before.fds && after.watches <= before.watches {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d followers left: %+v, before %+v (leak)", followers, after, before)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("%d followers: before %+v, after %+v", followers, before, after)
	if after.watches > 1 {
		t.Errorf("%d inotify watches with no follower, want at most 1", after.watches)
	}
}

// BenchmarkFollowLatency measures how long an append through the mount
// takes to reach a client following the task's logs through the API: one
// op is one append and its arrival. The server batches for up to 200 ms
// (Nomad's framing), which bounds the latency from below on a busy stream;
// an idle one is sent at the next flush tick.
func BenchmarkFollowLatency(b *testing.B) {
	fstest.RequireFUSE(b)
	root, err := os.MkdirTemp("", "allocfs-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(root)
	d := harness.Start(b, filepath.Join(root, "data"), filepath.Join(root, "mnt"), filepath.Join(root, "sock"))
	create := exec.Command(harness.Binary(b), "alloc", "create", "a1", "--task", "web", "--socket", d.Socket)
	if r := harness.Run(b, create, "alloc create"); r.Code != 0 {
		b.Fatalf("alloc create: exit %d: %s", r.Code, r.Stderr)
	}
	p := filepath.Join(d.Mount, "a1", "alloc", "logs", "web.stdout.0")
	if err := os.WriteFile(p, []byte("first\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", d.Socket)
		},
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://allocfs/v1/client/fs/logs/a1?task=web&type=stdout&follow=true&plain=true", nil)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		b.Fatal(err)
	}
	var worst time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if _, err := f.WriteString(strconv.Itoa(i) + "\n"); err != nil {
			b.Fatal(err)
		}
		if _, err := r.ReadString('\n'); err != nil {
			b.Fatal(err)
		}
		if d := time.Since(start); d > worst {
			worst = d
		}
	}
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-ms")
}

// TestShutdownEndsFollowers: a daemon asked to stop while clients follow
// files ends their streams and stops at once, rather than waiting out its
// shutdown timeout for streams that never end by themselves.
func TestShutdownEndsFollowers(t *testing.T) {
	n := startFSNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	if err := os.WriteFile(filepath.Join(n.mnt, "a1/alloc/logs/web.stdout.0"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var followers []*follower
	for range 3 {
		fl := n.follow(t, "/v1/client/fs/logs/a1?task=web&type=stdout&follow=true")
		fl.next(t)
		followers = append(followers, fl)
	}
	n.stop(t)
	for _, fl := range followers {
		select {
		case <-fl.done:
		case <-time.After(10 * time.Second):
			t.Fatal("a follower's stream still open 10s after the daemon stopped")
		}
	}
	if strings.Contains(n.Out.String(), "requests still running after the timeout") {
		t.Errorf("the daemon waited out its shutdown timeout for the followers:\n%s", n.Out)
	}
}
