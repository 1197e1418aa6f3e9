package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// TestRemoteCLI browses a node from another network namespace as an
// operator would from a laptop: `alloc fs` and `alloc logs` with
// Nomad's -address, -token, -ca-cert, -client-cert and -client-key (and
// their environment variables), an ID prefix instead of the ID, and no
// task named. A missing token, an ambiguous prefix and an unknown task
// are refused with messages that say what to do.
func TestRemoteCLI(t *testing.T) {
	fstest.RequireFUSE(t)
	p := newNetPair(t)
	write := secretWriter(t)
	ca := newTestCA(t, "cluster CA")
	srvCert, srvKey := ca.issue(t, 2, true, p.addr[0])
	cliCert, cliKey := ca.issue(t, 3, false)
	addr := p.addr[0] + ":4646"
	n := startNodeWith(t, p.enter(0), "--http-addr", addr,
		"--token-file", write("token", []byte(apiToken)),
		"--tls-cert", write("srv.pem", srvCert), "--tls-key", write("srv.key", srvKey),
		"--tls-ca", write("ca.pem", ca.pem))
	const (
		id    = "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"
		other = "7c9a8b7c-6d5e-4f3a-9b8c-7d6e5f4a3b2c"
	)
	n.mustCLI(t, "alloc", "create", id, "--task", "web")
	n.mustCLI(t, "alloc", "create", other, "--task", "web", "--task", "db")
	logFile := filepath.Join(n.mnt, id, "alloc", "logs", "web.stdout.0")
	if err := os.WriteFile(logFile, []byte("first line\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	remote := []string{"-address", "https://" + addr, "-token", apiToken, "-ca-cert", write("cli-ca.pem", ca.pem),
		"-client-cert", write("cli.pem", cliCert), "-client-key", write("cli.key", cliKey)}
	laptop := func(env []string, args ...string) result {
		t.Helper()
		cmd := exec.Command(p.enter(1)[0], append(append(p.enter(1)[1:], harness.Binary(t)), args...)...)
		// No socket to fall back on: only the address reaches the node.
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "ALLOCFS_SOCKET=/nonexistent/allocfs.sock", "GORACE=atexit_sleep_ms=0"}, env...)
		return n.run(t, cmd, "allocfs "+strings.Join(args, " ")+" (from the other namespace)")
	}

	ls := laptop(nil, append(append([]string{"alloc", "fs"}, remote...), "7c1d", "alloc/logs")...)
	if ls.code != 0 || !strings.Contains(ls.stdout, "web.stdout.0") {
		t.Fatalf("alloc fs -address ... 7c1d alloc/logs: exit %d\nstdout: %s\nstderr: %s", ls.code, ls.stdout, ls.stderr)
	}
	envs := []string{"ALLOCFS_ADDR=https://" + addr, "ALLOCFS_TOKEN=" + apiToken, "ALLOCFS_CACERT=" + remote[5],
		"ALLOCFS_CLIENT_CERT=" + remote[7], "ALLOCFS_CLIENT_KEY=" + remote[9]}
	stat := laptop(envs, "alloc", "fs", "-stat", "-json", "7c1d2", "alloc/logs/web.stdout.0")
	var fi struct {
		Name string
		Size int64
	}
	if stat.code != 0 || json.Unmarshal([]byte(stat.stdout), &fi) != nil || fi.Name != "web.stdout.0" || fi.Size != int64(len("first line\n")) {
		t.Errorf("alloc fs -stat -json with the environment's client settings: exit %d, %+v\nstdout: %s\nstderr: %s", stat.code, fi, stat.stdout, stat.stderr)
	}
	if cat := laptop(envs, "alloc", "fs", "7c1d", "alloc/logs/web.stdout.0"); cat.code != 0 || cat.stdout != "first line\n" {
		t.Errorf("alloc fs on a file prints it: exit %d %q\nstderr: %s", cat.code, cat.stdout, cat.stderr)
	}

	for _, c := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no token", envs[:1], []string{"alloc", "fs", "-ca-cert", remote[5], "-client-cert", remote[7], "-client-key", remote[9], "7c1d"}, "403"},
		{"ambiguous prefix", envs, []string{"alloc", "fs", "7c"}, "matched 2 allocations"},
		{"too short", envs, []string{"alloc", "fs", "7"}, "too short"},
		{"no such allocation", envs, []string{"alloc", "logs", "ffff"}, `unknown allocation "ffff": no allocation has that ID`},
		{"task needed", envs, []string{"alloc", "logs", "7c9a"}, `allocation "` + other + `" has 2 tasks (db, web): name one`},
		{"unknown task", envs, []string{"alloc", "logs", "7c1d", "db"}, `allocation "` + id + `" has no task "db"; its tasks: web`},
		{"control API only on the socket", envs, []string{"alloc", "logs", "-previous", "7c1d"}, "-previous needs the control socket"},
	} {
		r := laptop(c.env, c.args...)
		if r.code == 0 || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%s: allocfs %s: exit %d, stderr %q; want a failure saying %q", c.name, strings.Join(c.args, " "), r.code, r.stderr, c.want)
		}
		if c.name == "ambiguous prefix" && (!strings.Contains(r.stderr, id) || !strings.Contains(r.stderr, other)) {
			t.Errorf("ambiguous prefix: stderr %q does not list both matches", r.stderr)
		}
	}

	// alloc logs -f follows what the task writes next, over TLS, from the
	// other namespace, with no task named.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	follow := exec.CommandContext(ctx, p.enter(1)[0], append(append(p.enter(1)[1:], harness.Binary(t)), "alloc", "logs", "-f", "7c1d")...)
	follow.Env = append([]string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C", "GORACE=atexit_sleep_ms=0"}, envs...)
	var errOut allocdirtest.SyncBuffer
	follow.Stderr = &errOut
	out, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	next := func(want string) {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("alloc logs -f ended before %q: %v\nstderr: %s", want, lines.Err(), errOut.String())
		}
		if got := lines.Text(); got != want {
			t.Fatalf("alloc logs -f: got %q, want %q", got, want)
		}
	}
	next("first line")
	f, err := os.OpenFile(logFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("written later\n")
	f.Close()
	next("written later")
	// nsenter passes the signal on to the client it runs.
	follow.Process.Signal(syscall.SIGINT)
	if err := follow.Wait(); err != nil {
		t.Errorf("alloc logs -f after SIGINT: %v (want exit 0)\nstderr: %s", err, errOut.String())
	}
}
