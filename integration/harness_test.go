package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/integration/harness"
)

// fsType is the type /proc/self/mountinfo and df show for a mount.
const fsType = harness.FSType

func TestMain(m *testing.M) { harness.Main(m) }

// result is what a finished command left.
type result struct {
	stdout, stderr string
	code           int
}

// node is one `allocfs serve` process with its own data dir, mount point
// and socket, all in one temporary directory that cleanup removes.
type node struct {
	*harness.Daemon
	dataDir, mnt, socket string
}

// startNode starts a daemon on fresh directories and waits until it
// listens and its mount is up.
func startNode(t *testing.T) *node {
	t.Helper()
	return startNodeWith(t, nil)
}

// startNodeWith is startNode for a daemon run under prefix (nsenter into
// a network namespace, say) with extra serve flags args.
func startNodeWith(t *testing.T, prefix []string, args ...string) *node {
	t.Helper()
	// Not t.TempDir: a subtest's name would push the socket path past
	// the 108 bytes a unix socket address can hold.
	root, err := os.MkdirTemp("", "allocfs-it-")
	if err != nil {
		t.Fatal(err)
	}
	// mountinfo shows resolved paths.
	if root, err = filepath.EvalSymlinks(root); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the daemon's own cleanup has
	// killed it and detached the mount.
	t.Cleanup(func() {
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("remove %s: %v", root, err)
		}
	})
	n := &node{
		dataDir: filepath.Join(root, "data"),
		mnt:     filepath.Join(root, "mnt"),
		socket:  filepath.Join(root, "allocfs.sock"),
	}
	n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket, Prefix: prefix, Args: args})
	return n
}

// kill9 kills the daemon with SIGKILL, as a crash or the OOM killer would.
// Its mount stays, held for the next serve (restart/holder.go).
func (n *node) kill9(t *testing.T) { n.Signal(t, syscall.SIGKILL) }

// stop asks for a full stop (SIGUSR1: unmount, running allocations or
// not) and fails the test unless the daemon exits 0 and leaves nothing
// mounted.
func (n *node) stop(t *testing.T) {
	t.Helper()
	if code := n.Signal(t, syscall.SIGUSR1); code != 0 {
		t.Errorf("allocfs serve after SIGUSR1: exit %d, want 0", code)
	}
	if c := harness.MountsAt(t, n.mnt); c != 0 {
		t.Errorf("after SIGUSR1: %d allocfs mounts at %s, want 0", c, n.mnt)
	}
}

// cli runs the binary's client subcommands against this node.
func (n *node) cli(t *testing.T, args ...string) result {
	t.Helper()
	cmd := exec.Command(harness.Binary(t), args...)
	// A binary built with -race sleeps a second before it exits, so that
	// other goroutines can still report; a client command has none.
	cmd.Env = append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	return n.run(t, cmd, "allocfs "+strings.Join(args, " "))
}

// mustCLI is cli that fails the test unless the command exits 0; it
// returns the command's stdout.
func (n *node) mustCLI(t *testing.T, args ...string) string {
	t.Helper()
	r := n.cli(t, args...)
	if r.code != 0 {
		t.Fatalf("allocfs %s: exit %d, want 0\nstderr:\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// sh runs script with bash in dir, with errexit, nounset and pipefail
// on. The environment has MNT, DATA and ALLOCFS_SOCKET of this node and
// LC_ALL=C, so error messages are the untranslated ones.
func (n *node) sh(t *testing.T, dir, script string) result {
	t.Helper()
	cmd := exec.Command("bash", "-c", "set -euo pipefail\n"+script)
	cmd.Dir = dir
	return n.run(t, cmd, "bash: "+script)
}

// mustSh is sh that fails the test unless the script exits 0; it returns
// the script's stdout.
func (n *node) mustSh(t *testing.T, dir, script string) string {
	t.Helper()
	r := n.sh(t, dir, script)
	if r.code != 0 {
		t.Fatalf("script in %s: exit %d, want 0\n%s\nstdout:\n%s\nstderr:\n%s", dir, r.code, script, r.stdout, r.stderr)
	}
	return r.stdout
}

// env is the environment of the commands the tests run.
func (n *node) env() []string {
	return append(os.Environ(),
		"LC_ALL=C",
		"ALLOCFS_SOCKET="+n.socket,
		"MNT="+n.mnt,
		"DATA="+n.dataDir,
	)
}

// run runs cmd to completion with this node's environment.
func (n *node) run(t *testing.T, cmd *exec.Cmd, what string) result {
	t.Helper()
	if cmd.Env == nil {
		cmd.Env = n.env()
	}
	r := harness.Run(t, cmd, what)
	return result{stdout: r.Stdout, stderr: r.Stderr, code: r.Code}
}
