package integration

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// readmeBlock is one ```sh block of the README.
type readmeBlock struct {
	line int // of the opening fence
	text string
	// secondNode: the block reaches another node over TCP; the README
	// says so with <!-- readme-test: second-node --> before it.
	secondNode bool
}

// secondNodeMark is what the README puts before a block that needs a
// second node.
const secondNodeMark = "<!-- readme-test: second-node -->"

// readmeBlocks returns the sh blocks of the README at path, in order.
func readmeBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks []readmeBlock
		cur    *readmeBlock
		marked bool
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && line == "```sh":
			cur = &readmeBlock{line: n, secondNode: marked}
			marked = false
		case cur == nil && strings.TrimSpace(line) == secondNodeMark:
			marked = true
		case cur == nil && strings.TrimSpace(line) != "":
			marked = false
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("README: the block at line %d never ends", cur.line)
	}
	return blocks
}

// exempt are the README's lines that the test does not run: the two
// commands a newcomer starts with, which the test itself stands for.
var exempt = regexp.MustCompile(`^make (run|test)\b`)

// placeholder finds what a reader would have to edit before pasting: an
// optional part in brackets, or a <NAME> to fill in.
var placeholder = regexp.MustCompile(`\[-|\[[A-Z]+\]|<[A-Za-z_-]+>`)

// TestReadme runs every sh block of the README as written, top to bottom,
// in one shell session (set -euo pipefail), in a directory laid out as a
// checkout after `make run`: ./bin/allocfs, and the daemon `make run`
// starts serving .allocfs. A block marked as needing a second node runs
// from another network namespace against a second daemon that serves its
// API on TCP, behind a token and TLS, with NODE, TOKEN and ca.pem set up
// as the block expects.
func TestReadme(t *testing.T) {
	fstest.RequireFUSE(t)
	blocks := readmeBlocks(t, filepath.Join("..", "README.md"))
	if len(blocks) < 5 {
		t.Fatalf("README: found %d sh blocks; the parser is wrong or the README lost its examples", len(blocks))
	}
	makefile, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon below is what `make run` starts; if the Makefile starts
	// it another way, this test must learn that way first.
	const makeRunServe = "./bin/allocfs serve --data-dir $(RUN_DIR) --mount $(RUN_DIR)/mnt --socket $(RUN_DIR)/allocfs.sock"
	if !strings.Contains(string(makefile), "\t"+makeRunServe+"\n") || !strings.Contains(string(makefile), "RUN_DIR ?= $(CURDIR)/.allocfs\n") {
		t.Fatalf("the Makefile's run target no longer reads %q with RUN_DIR=$(CURDIR)/.allocfs: update this test to start the daemon as it does", makeRunServe)
	}

	dir, err := os.MkdirTemp("", "allocfs-readme-")
	if err != nil {
		t.Fatal(err)
	}
	if dir, err = filepath.EvalSymlinks(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// A checkout other users can reach, as the README's `exec --user`
	// line needs (and says).
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(harness.Binary(t), filepath.Join(dir, "bin", "allocfs")); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, ".allocfs")
	if err := os.Mkdir(run, 0o755); err != nil {
		t.Fatal(err)
	}
	harness.StartDaemon(t, &harness.Daemon{DataDir: run, Mount: filepath.Join(run, "mnt"), Socket: filepath.Join(run, "allocfs.sock")})

	var remote *readmeRemote
	var script strings.Builder
	script.WriteString("set -euo pipefail\n")
	// What a block leaves running in the background (tail -f) ends with
	// the session.
	script.WriteString("trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n")
	for i, b := range blocks {
		var lines []string
		for _, l := range strings.Split(b.text, "\n") {
			if exempt.MatchString(l) {
				continue
			}
			if cmd, _, _ := strings.Cut(l, "#"); placeholder.MatchString(cmd) {
				t.Errorf("README line %d: %q has a placeholder or an optional part a reader must edit before running it", b.line+1+lineOf(b.text, l), l)
			}
			lines = append(lines, l)
		}
		body := strings.Join(lines, "\n")
		fmt.Fprintf(&script, "echo '::: README block %d (line %d)' >&2\n", i+1, b.line)
		if !b.secondNode {
			script.WriteString(body + "\n")
			continue
		}
		if remote == nil {
			remote = startSecondNode(t, dir)
		}
		fmt.Fprintf(&script, "NODE=%s TOKEN=%s %s env -u ALLOCFS_SOCKET PATH=\"$PWD/bin:$PATH\" bash -euo pipefail <<'ALLOCFS_README_BLOCK'\n%s\nALLOCFS_README_BLOCK\n",
			remote.ip, apiToken, strings.Join(remote.laptop, " "), body)
	}
	cmd := exec.Command("bash", "-c", script.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	var out, errOut allocdirtest.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("the README's blocks failed: %v\nstderr (the last ::: line names the block):\n%s\nstdout:\n%s", err, errOut.String(), out.String())
	}
	t.Logf("README output:\n%s", out.String())
}

// lineOf is the line of l within text, from 0.
func lineOf(text, l string) int {
	for i, x := range strings.Split(text, "\n") {
		if x == l {
			return i
		}
	}
	return 0
}

// readmeRemote is the second node the README's remote blocks reach.
type readmeRemote struct {
	ip string
	// laptop is the command prefix that enters the other namespace.
	laptop []string
}

// readmeAllocID is the allocation the README's remote blocks browse by
// its prefix, 7c1d.
const readmeAllocID = "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"

// startSecondNode starts a daemon in a network namespace that serves its
// API on NODE:4646 behind TOKEN and TLS, with one allocation that has
// logged a line, and writes the CA's certificate to dir/ca.pem.
func startSecondNode(t *testing.T, dir string) *readmeRemote {
	t.Helper()
	p := newNetPair(t)
	write := secretWriter(t)
	ca := newTestCA(t, "cluster CA")
	srvCert, srvKey := ca.issue(t, 2, true, p.addr[0])
	n := startNodeWith(t, p.enter(0), "--http-addr", p.addr[0]+":4646",
		"--token-file", write("token", []byte(apiToken)),
		"--tls-cert", write("srv.pem", srvCert), "--tls-key", write("srv.key", srvKey))
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), ca.pem, 0o644); err != nil {
		t.Fatal(err)
	}
	n.mustCLI(t, "alloc", "create", readmeAllocID, "--task", "web")
	if err := os.WriteFile(filepath.Join(n.mnt, readmeAllocID, "alloc", "logs", "web.stdout.0"), []byte("serving on the second node\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &readmeRemote{ip: p.addr[0], laptop: p.enter(1)}
}
