//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/daemon"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// The tests run the real binary: exit codes, signals and a FUSE mount
// served by another process are what they check.

func TestMain(m *testing.M) { harness.Main(m) }

// result is what a finished allocfs process left.
type result struct {
	stdout, stderr string
	code           int
}

// runCLI runs allocfs with args and the extra environment variables env
// ("K=V"), and waits for it to exit.
func runCLI(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("allocfs %s: %v", strings.Join(args, " "), err)
	}
	r := result{stdout: stdout.String(), stderr: stderr.String(), code: cmd.ProcessState.ExitCode()}
	t.Logf("allocfs %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	return r
}

// mustRun runs allocfs and fails the test unless it exits 0.
func mustRun(t *testing.T, args ...string) result {
	t.Helper()
	r := runCLI(t, nil, args...)
	if r.code != exitOK {
		t.Fatalf("allocfs %s: exit %d, want 0\n%s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r
}

// startServe starts `allocfs serve` on dataDir and mnt with the socket
// at its default place, and waits until it is up.
func startServe(t *testing.T, dataDir, mnt string) *harness.Daemon {
	t.Helper()
	return harness.Start(t, dataDir, mnt, filepath.Join(dataDir, "allocfs.sock"))
}

// mountedAt returns the filesystem type mounted at dir, or "".
func mountedAt(t *testing.T, dir string) string {
	t.Helper()
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Fatal(err)
	}
	fsType := ""
	for _, m := range mounts {
		if m.MountPoint == dir {
			fsType = m.FSType // the last one is on top
		}
	}
	return fsType
}

// testDirs returns a data dir and a mount point in a fresh temporary
// directory, resolved so they compare equal to mountinfo's paths.
func testDirs(t *testing.T) (dataDir, mnt string) {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "data"), filepath.Join(root, "mnt")
}

// TestServeMountLifecycle: serve mounts, `alloc create` makes the
// allocation appear in the mount, writes through the mount land in the
// store's layer, `alloc destroy` removes it, and SIGTERM unmounts and
// exits 0.
func TestServeMountLifecycle(t *testing.T) {
	fstest.RequireFUSE(t)
	dataDir, mnt := testDirs(t)
	d := startServe(t, dataDir, mnt)
	if got := mountedAt(t, mnt); got != daemon.FSType {
		t.Fatalf("mount at %s: got fstype %q, want %q", mnt, got, daemon.FSType)
	}
	sock := "--socket=" + d.Socket

	r := runCLI(t, nil, "alloc", "create", "a1", "--task", "web", sock)
	if r.code != exitOK {
		t.Fatalf("alloc create: exit %d, want 0: %s", r.code, r.stderr)
	}

	for _, p := range []string{"alloc/logs", "alloc/data", "alloc/tmp", "web/local", "web/tmp", "web/secrets", "web/alloc/logs"} {
		fi, err := os.Stat(filepath.Join(mnt, "a1", p))
		if err != nil || !fi.IsDir() {
			t.Errorf("%s in the mount: got %v, %v; want a directory", p, fi, err)
		}
	}

	content := []byte("written through the mount\n")
	if err := os.WriteFile(filepath.Join(mnt, "a1", "alloc", "data", "f"), content, 0o644); err != nil {
		t.Fatalf("write through the mount: %v", err)
	}

	var st api.AllocStatus
	r = mustRun(t, "alloc", "status", "a1", "--json", sock)
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("alloc status --json: %v\n%s", err, r.stdout)
	}
	if want := filepath.Join(mnt, "a1"); st.Mount != want {
		t.Errorf("status mount: got %q, want %q", st.Mount, want)
	}
	data := st.Layers["alloc/data"]
	if data.Upper == "" {
		t.Fatalf("status has no alloc/data layer: %s", r.stdout)
	}
	backing := filepath.Join(dataDir, "layers", data.Upper, "f")
	got, err := os.ReadFile(backing)
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("backing file %s: got %q, %v; want %q", backing, got, err, content)
	}
	if data.Bytes != int64(len(content)) || data.Files != 1 {
		t.Errorf("status of alloc/data: got %d bytes in %d files, want %d bytes in 1 file", data.Bytes, data.Files, len(content))
	}

	r = mustRun(t, "alloc", "list", sock)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "a1 ") {
		t.Errorf("alloc list: got %q, want a header and a1", r.stdout)
	}
	mustRun(t, "alloc", "status", "a1", sock)
	mustRun(t, "status", sock)

	// A second daemon on the same mount point is refused, and leaves the
	// first one alone.
	other := filepath.Join(filepath.Dir(dataDir), "other")
	r = runCLI(t, nil, "serve", "--data-dir", other, "--mount", mnt)
	if r.code != exitFailed || !strings.Contains(r.stderr, "another allocfs is serving "+mnt) {
		t.Errorf("second serve on %s: got exit %d, %q; want 1 and 'another allocfs is serving'", mnt, r.code, r.stderr)
	}

	mustRun(t, "alloc", "destroy", "a1", sock)
	if r := runCLI(t, nil, "alloc", "status", "a1", sock); r.code != exitFailed {
		t.Errorf("alloc status after destroy: exit %d, want 1", r.code)
	}
	// The kernel forgot a1 before the destroy request was answered.
	if _, err := os.Stat(filepath.Join(mnt, "a1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of a1 right after destroy: got %v, want not-exist", err)
	}

	if code := d.Signal(t, syscall.SIGTERM); code != exitOK {
		t.Fatalf("serve after SIGTERM: exit %d, want 0:\n%s", code, d.Out)
	}
	if got := mountedAt(t, mnt); got != "" {
		t.Errorf("after SIGTERM %s is still mounted (%s)", mnt, got)
	}
	if _, err := os.Lstat(d.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s left behind: %v", d.Socket, err)
	}
}

// TestServeRecoversAfterCrash: after SIGKILL, the holder keeps the mount
// (a stat made meanwhile waits), the next serve takes it over and serves
// the file written before the crash; SIGINT with a running allocation
// leaves the mount for the next serve, and SIGUSR1 unmounts.
func TestServeRecoversAfterCrash(t *testing.T) {
	fstest.RequireFUSE(t)
	dataDir, mnt := testDirs(t)
	d := startServe(t, dataDir, mnt)
	mustRun(t, "alloc", "create", "a1", "--task", "web", "--socket", d.Socket)
	content := []byte("survives a crash\n")
	f := filepath.Join(mnt, "a1", "web", "local", "f")
	if err := os.WriteFile(f, content, 0o644); err != nil {
		t.Fatalf("write through the mount: %v", err)
	}

	d.Signal(t, syscall.SIGKILL)
	waited := make(chan error, 1)
	go func() {
		var st unix.Stat_t
		waited <- unix.Stat(filepath.Join(mnt, "a1", "web", "local", "g"), &st)
	}()
	d = startServe(t, dataDir, mnt)
	// Its socket answers before it has taken the mount over.
	for deadline := time.Now().Add(harness.Timeout); !strings.Contains(d.Out.String(), "took the mount over"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve did not take the held mount over:\n%s", d.Out)
		}
	}
	if err := <-waited; !errors.Is(err, unix.ENOENT) {
		t.Errorf("a stat made while no daemon ran: %v, want ENOENT from the next daemon", err)
	}
	got, err := os.ReadFile(f)
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("%s after restart: got %q, %v; want %q", f, got, err, content)
	}
	if code := d.Signal(t, syscall.SIGINT); code != exitOK {
		t.Fatalf("serve after SIGINT: exit %d, want 0", code)
	}
	if got := mountedAt(t, mnt); got != daemon.FSType {
		t.Errorf("after SIGINT with a running allocation, %s is %q; want it still mounted for the next serve", mnt, got)
	}
	d = startServe(t, dataDir, mnt)
	if code := d.Signal(t, syscall.SIGUSR1); code != exitOK {
		t.Fatalf("serve after SIGUSR1: exit %d, want 0", code)
	}
	if got := mountedAt(t, mnt); got != "" {
		t.Errorf("after SIGUSR1 %s is still mounted (%s)", mnt, got)
	}
}

// TestServeRecoversAfterCrashWithoutHolder: with --live-restart=false a
// SIGKILL leaves a stale mount; the next serve detaches it, reloads the
// allocation from the data dir and serves its files again, on a host
// that never mounted fusectl.
func TestServeRecoversAfterCrashWithoutHolder(t *testing.T) {
	if fstest.WithFusectl(t, false) {
		return
	}
	fstest.RequireFUSE(t)
	dataDir, mnt := testDirs(t)
	start := func() *harness.Daemon {
		return harness.StartDaemon(t, &harness.Daemon{DataDir: dataDir, Mount: mnt, Socket: filepath.Join(dataDir, "allocfs.sock"), Args: []string{"--live-restart=false"}})
	}
	d := start()
	mustRun(t, "alloc", "create", "a1", "--task", "web", "--socket", d.Socket)
	content := []byte("survives a crash\n")
	f := filepath.Join(mnt, "a1", "web", "local", "f")
	if err := os.WriteFile(f, content, 0o644); err != nil {
		t.Fatalf("write through the mount: %v", err)
	}

	d.Signal(t, syscall.SIGKILL)
	var sfs unix.Statfs_t
	if err := unix.Statfs(mnt, &sfs); !daemon.StaleMount(err) {
		t.Fatalf("statfs of the mount point after SIGKILL: got %v, want ENOTCONN or ECONNABORTED (a stale mount)", err)
	}

	d = start()
	if !strings.Contains(d.Out.String(), "stale mount") {
		t.Errorf("serve did not log the stale mount it detached:\n%s", d.Out)
	}
	got, err := os.ReadFile(f)
	if err != nil || !bytes.Equal(got, content) {
		t.Errorf("%s after restart: got %q, %v; want %q", f, got, err, content)
	}
	if code := d.Signal(t, syscall.SIGINT); code != exitOK {
		t.Fatalf("serve after SIGINT: exit %d, want 0", code)
	}
	if got := mountedAt(t, mnt); got != "" {
		t.Errorf("after SIGINT %s is still mounted (%s)", mnt, got)
	}
}

// TestServeMountPointIsAFile: serve refuses a mount point that is a
// regular file, says so, and creates nothing.
func TestServeMountPointIsAFile(t *testing.T) {
	dataDir, mnt := testDirs(t)
	if err := os.WriteFile(mnt, []byte("not a directory"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "serve", "--data-dir", dataDir, "--mount", mnt)
	if r.code != exitFailed {
		t.Errorf("exit: got %d, want %d", r.code, exitFailed)
	}
	// Without FUSE the check of /dev/fuse comes first, with its own advice.
	if daemon.CheckFUSE() == nil && !strings.Contains(r.stderr, fmt.Sprintf("mount point %q is not a directory", mnt)) {
		t.Errorf("stderr: got %q, want it to say the mount point is not a directory", r.stderr)
	}
	if _, err := os.Lstat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused serve created the data dir: %v", err)
	}
}

// TestCLIExitCodes: usage errors exit 2, failures exit 1, and the
// messages say what went wrong. None of these needs a daemon.
func TestCLIExitCodes(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.sock")
	empty := filepath.Join(t.TempDir(), "empty")
	longSecret := filepath.Join(t.TempDir(), "long")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(longSecret, []byte(strings.Repeat("s", 65)), 0o600); err != nil {
		t.Fatal(err)
	}
	config := func(text string) string {
		p := filepath.Join(t.TempDir(), "serve.flags")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name   string
		env    []string
		args   []string
		code   int
		stderr string
	}{
		{"no command", nil, nil, exitUsage, "a command is required"},
		{"unknown command", nil, []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"help", nil, []string{"--help"}, exitOK, ""},
		{"alloc create help", nil, []string{"alloc", "create", "--help"}, exitOK, ""},
		{"version", nil, []string{"version"}, exitOK, ""},
		{"--version", nil, []string{"--version"}, exitOK, ""},
		{"alloc without subcommand", nil, []string{"alloc"}, exitUsage, "a command is required"},
		{"create without --task", nil, []string{"alloc", "create", "a1", "--socket", missing}, exitUsage, "at least one --task is required"},
		{"create without ID", nil, []string{"alloc", "create", "--task", "web"}, exitUsage, "expected 1 argument"},
		{"create with two IDs", nil, []string{"alloc", "create", "a1", "a2", "--task", "web"}, exitUsage, `unexpected argument "a2"`},
		{"unknown flag", nil, []string{"alloc", "list", "--bogus"}, exitUsage, "unknown flag: --bogus"},
		{"bad --user", nil, []string{"alloc", "create", "a1", "--task", "web", "--user", "web"}, exitUsage, "--user wants TASK=USER"},
		{"--user of an unknown task", nil, []string{"alloc", "create", "a1", "--task", "web", "--user", "db=nobody"}, exitUsage, "names a task not given"},
		{"negative --secrets-mb", nil, []string{"alloc", "create", "a1", "--task", "web", "--secrets-mb", "-1"}, exitUsage, "must not be negative"},
		{"bad log level", nil, []string{"serve", "--log-level", "loud"}, exitUsage, `unknown --log-level "loud"`},
		{"config file missing", nil, []string{"serve", "--config", missing}, exitUsage, "failed to read the config file"},
		{"config line not a flag", nil, []string{"serve", "--config", config("log-level=debug\n")}, exitUsage, `"log-level=debug" is not a flag`},
		{"config names a config", nil, []string{"serve", "--config", config("--config=/etc/x\n")}, exitUsage, "--config cannot name another file"},
		{"config unknown flag", nil, []string{"serve", "--config", config("# c\n--bogus\n")}, exitUsage, "unknown flag: --bogus"},
		{"config bad level", nil, []string{"serve", "--config", config("--log-level loud\n")}, exitUsage, `unknown --log-level "loud"`},
		{"token file without TCP", nil, []string{"serve", "--token-file", empty}, exitUsage, "--token-file needs --http-addr"},
		{"TLS cert without key", nil, []string{"serve", "--tls-cert", empty}, exitUsage, "--tls-cert and --tls-key go together"},
		{"TCP without any token", nil, []string{"serve", "--http-addr", "127.0.0.1:0"}, exitUsage, "nothing is served over TCP without a token"},
		{"empty API token", nil, []string{"serve", "--http-addr", "127.0.0.1:0", "--token-file", empty}, exitUsage, "is empty"},
		{"node secret too long", nil, []string{"serve", "--http-addr", "127.0.0.1:0", "--node-secret-file", longSecret}, exitUsage, "BLAKE2b takes a key of at most 64"},
		{"TLS CA alone", nil, []string{"serve", "--http-addr", "127.0.0.1:0", "--migrate-token-file", longSecret, "--tls-ca", empty}, exitUsage, "--tls-ca needs --tls-cert and --tls-key"},
		{"TLS key alone", nil, []string{"serve", "--http-addr", "127.0.0.1:0", "--migrate-token-file", longSecret, "--tls-key", empty}, exitUsage, "--tls-cert and --tls-key go together"},
		{"negative --disk-mb", nil, []string{"alloc", "create", "a1", "--task", "web", "--disk-mb", "-1"}, exitUsage, "--disk-mb must not be negative"},
		{"negative --disk-inodes", nil, []string{"alloc", "create", "a1", "--task", "web", "--disk-inodes", "-3"}, exitUsage, "--disk-inodes must not be negative"},
		{"negative --default-disk-mb", nil, []string{"serve", "--default-disk-mb", "-5"}, exitUsage, "--default-disk-mb -5"},
		{"bad --quota-groups", nil, []string{"serve", "--quota-groups", "9-3"}, exitUsage, `--quota-groups "9-3"`},
		{"--quota-groups not a range", nil, []string{"serve", "--quota-groups", "many"}, exitUsage, "want FIRST-LAST"},
		{"--nomad-addr not a URL", nil, []string{"serve", "--nomad-addr", "ftp://nomad:4646"}, exitUsage, "want http://host:port"},
		{"--nomad-token-file alone", nil, []string{"serve", "--nomad-token-file", empty}, exitUsage, "--nomad-token-file needs --nomad-addr"},
		{"fs bad ID", nil, []string{"alloc", "fs", "..", "--socket", missing}, exitFailed, "invalid allocation ID"},
		{"fs needs an allocation", nil, []string{"alloc", "fs", "--socket", missing}, exitUsage, "expected 1 argument(s)"},
		{"fs too many arguments", nil, []string{"alloc", "fs", "a1", "x", "y"}, exitUsage, `unexpected argument "y"`},
		{"fs unknown flag", nil, []string{"alloc", "fs", "-recursive", "a1"}, exitUsage, "unknown shorthand flag"},
		{"fs -n with -c", nil, []string{"fs", "-tail", "-n", "3", "-c", "10", "a1", "--socket", missing}, exitUsage, "cannot be used together"},
		{"fs bad address", nil, []string{"alloc", "fs", "-address", "ftp://node:1", "a1"}, exitFailed, "not a node's base URL"},
		{"fs missing CA file", nil, []string{"alloc", "fs", "-address", "https://node:1", "-ca-cert", "/nonexistent/ca.pem", "a1"}, exitFailed, "failed to read the CA certificate"},
		{"fs key without cert", nil, []string{"alloc", "fs", "-address", "https://node:1", "-client-key", "/k.pem", "a1"}, exitFailed, "a client certificate needs its key"},
		{"fs remote unreachable", nil, []string{"alloc", "fs", "-address", "http://127.0.0.1:1", "a1"}, exitFailed, "cannot reach allocfs at http://127.0.0.1:1"},
		{"logs bad task", nil, []string{"logs", "a1", "a/b", "--socket", missing}, exitFailed, "invalid task name"},
		{"logs -n with -c", nil, []string{"logs", "-tail", "-n", "3", "-c", "10", "a1", "web", "--socket", missing}, exitUsage, "cannot be used together"},
		{"logs negative -n", nil, []string{"logs", "-tail", "-n", "-1", "a1", "web", "--socket", missing}, exitUsage, "must not be negative"},
		{"logs daemon not running", nil, []string{"logs", "-stderr", "a1", "web", "--socket", missing}, exitFailed, "cannot reach allocfs at " + missing},
		{"ID with a slash", nil, []string{"alloc", "create", "a/b", "--task", "web", "--socket", missing}, exitFailed, "invalid allocation ID"},
		{"ID dot-dot", nil, []string{"alloc", "create", "..", "--task", "web", "--socket", missing}, exitFailed, "invalid allocation ID"},
		{"status of ID dot-dot", nil, []string{"alloc", "status", "..", "--socket", missing}, exitFailed, "invalid allocation ID"},
		{"daemon not running", nil, []string{"alloc", "list", "--socket", missing}, exitFailed,
			"cannot reach allocfs at " + missing + ": is `allocfs serve` running?"},
		{"socket from the environment", []string{"ALLOCFS_SOCKET=" + missing}, []string{"alloc", "destroy", "a1"}, exitFailed,
			"cannot reach allocfs at " + missing},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, c.env, c.args...)
			if r.code != c.code {
				t.Errorf("exit: got %d, want %d", r.code, c.code)
			}
			if !strings.Contains(r.stderr, c.stderr) {
				t.Errorf("stderr: got %q, want it to contain %q", r.stderr, c.stderr)
			}
		})
	}
}

// TestServeRefusesAnUnenforceableDefault: a default disk limit on a data
// dir that cannot enforce one stops serve at start, saying what would
// (every allocation would otherwise be refused, or unlimited while it
// looks sized), and nothing is mounted.
func TestServeRefusesAnUnenforceableDefault(t *testing.T) {
	fstest.RequireFUSE(t)
	dataDir, mnt := testDirs(t)
	r := runCLI(t, nil, "serve", "--data-dir", dataDir, "--mount", mnt, "--default-disk-mb", "100")
	if r.code != exitFailed {
		t.Fatalf("exit: got %d, want %d\n%s", r.code, exitFailed, r.stderr)
	}
	for _, want := range []string{"default disk limit", "cannot enforce disk limits", "btrfs", "--enable-quotas"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, r.stderr)
		}
	}
	if n := harness.MountsAt(t, mnt); n != 0 {
		t.Errorf("%d mounts at %s after a refused start", n, mnt)
	}
}
