//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
)

// TestExecCommandLine: exec's command line is checked before any daemon
// is dialed: usage errors exit 2, a bad ID or user exits 1.
func TestExecCommandLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.sock")
	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"help", []string{"exec", "--help"}, exitOK, ""},
		{"nothing after --", []string{"exec", "a1", "web", "--"}, exitUsage, "no command after --"},
		{"no arguments", []string{"exec"}, exitUsage, "the command goes after --"},
		{"no --", []string{"exec", "a1", "web", "true"}, exitUsage, "the command goes after --"},
		{"no task", []string{"exec", "a1", "--", "true"}, exitUsage, "expected ID TASK before --, got 1"},
		{"zero --max-files", []string{"exec", "a1", "web", "--max-files", "0", "--", "true"}, exitUsage, "--max-files must be at least 1"},
		{"zero --max-file-size", []string{"exec", "a1", "web", "--max-file-size", "0", "--", "true"}, exitUsage, "--max-file-size must be at least 1"},
		{"negative --kill-timeout", []string{"exec", "a1", "web", "--kill-timeout", "-1s", "--", "true"}, exitUsage, "--kill-timeout must not be negative, got -1s"},
		{"--kill-timeout without unit", []string{"exec", "a1", "web", "--kill-timeout", "5", "--", "true"}, exitUsage, "kill-timeout"},
		{"unknown --log-level", []string{"exec", "a1", "web", "--log-level", "loud", "--", "true"}, exitUsage, `unknown --log-level "loud"`},
		{"bad ID", []string{"exec", "..", "web", "--socket", missing, "--", "true"}, exitFailed, "invalid allocation ID"},
		{"bad task", []string{"exec", "a1", "a/b", "--socket", missing, "--", "true"}, exitFailed, "invalid task name"},
		{"daemon not running", []string{"exec", "a1", "web", "--socket", missing, "--", "true"}, exitFailed, "cannot reach allocfs at " + missing},
	}
	if os.Geteuid() == 0 {
		cases = append(cases, struct {
			name   string
			args   []string
			code   int
			stderr string
		}{"unknown user", []string{"exec", "a1", "web", "--user", "no-such-user-here", "--socket", missing, "--", "true"}, exitFailed, `failed to look up user "no-such-user-here"`})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, c.args...)
			if r.code != c.code {
				t.Errorf("exit: got %d, want %d", r.code, c.code)
			}
			if !strings.Contains(r.stderr, c.stderr) {
				t.Errorf("stderr: got %q, want it to contain %q", r.stderr, c.stderr)
			}
		})
	}
}

// TestTaskEnv: the task sees the caller's environment with raw_exec's
// variables, which replace any the caller set, and other NOMAD_ variables
// pass through.
func TestTaskEnv(t *testing.T) {
	got := taskEnv([]string{"PATH=/bin", "NOMAD_TASK_NAME=stale", "NOMAD_REGION=global", "A=b=c"}, "/m/a1", "a1", "web")
	want := []string{
		"PATH=/bin",
		"NOMAD_REGION=global",
		"A=b=c",
		"NOMAD_ALLOC_DIR=/m/a1/alloc",
		"NOMAD_TASK_DIR=/m/a1/web/local",
		"NOMAD_SECRETS_DIR=/m/a1/web/secrets",
		"NOMAD_ALLOC_ID=a1",
		"NOMAD_TASK_NAME=web",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestExitCode: an exit status is passed on as is, a death by signal N
// as 128+N, as a shell reports them.
func TestExitCode(t *testing.T) {
	cases := map[string]int{
		"exit 0":      0,
		"exit 7":      7,
		"exit 255":    255,
		"kill -9 $$":  137,
		"kill -15 $$": 143,
	}
	for script, want := range cases {
		cmd := exec.Command("sh", "-c", script)
		cmd.Run()
		if got := exitCode(cmd.ProcessState); got != want {
			t.Errorf("%q: got %d, want %d", script, got, want)
		}
	}
}

// TestExecAgainstDaemon: against a running daemon, an unknown allocation
// or task and a stopped allocation fail with exit 1 and say so, and the
// task's exit code is exec's.
func TestExecAgainstDaemon(t *testing.T) {
	fstest.RequireFUSE(t)
	dataDir, mnt := testDirs(t)
	d := startServe(t, dataDir, mnt)
	sock := "--socket=" + d.Socket
	mustRun(t, "alloc", "create", "a1", "--task", "web", sock)
	mustRun(t, "alloc", "create", "old", "--task", "web", sock)
	mustRun(t, "alloc", "stop", "old", sock)

	cases := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"unknown allocation", []string{"exec", "a2", "web", sock, "--", "true"}, exitFailed, "unknown allocation"},
		{"unknown task", []string{"exec", "a1", "db", sock, "--", "true"}, exitFailed, `allocation "a1" has no task "db"; its tasks: web`},
		{"stopped allocation", []string{"exec", "old", "web", sock, "--", "true"}, exitFailed, `allocation "old" is terminal`},
		{"missing command", []string{"exec", "a1", "web", sock, "--", "/no/such/command"}, exitFailed, `failed to start task web of allocation "a1"`},
		{"exit code", []string{"exec", "a1", "web", sock, "--", "sh", "-c", "exit 7"}, 7, ""},
		{"success", []string{"exec", "a1", "web", sock, "--", "true"}, exitOK, ""},
		{"signal", []string{"exec", "a1", "web", sock, "--", "sh", "-c", "kill -KILL $$"}, 137, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCLI(t, nil, c.args...)
			if r.code != c.code {
				t.Errorf("exit: got %d, want %d", r.code, c.code)
			}
			if !strings.Contains(r.stderr, c.stderr) {
				t.Errorf("stderr: got %q, want it to contain %q", r.stderr, c.stderr)
			}
		})
	}
	// No run left a FIFO behind.
	entries, err := os.ReadDir(filepath.Join(mnt, "a1", "alloc", "logs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".fifo") {
			t.Errorf("left behind in alloc/logs: %s", e.Name())
		}
	}
}

// TestExecKeepsTheTaskCodeWhenLogsFail: when the log files cannot take
// the task's output (the data dir is on a full tmpfs), exec still exits
// with the task's code, 0 included, and says on stderr how many bytes
// were lost: exactly what the task wrote minus what the files hold. No
// FIFO is left and the allocation keeps running.
func TestExecKeepsTheTaskCodeWhenLogsFail(t *testing.T) {
	fstest.RequireFUSE(t)
	dataDir, mnt := testDirs(t)
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dataDir, "tmpfs", 0, "size=2m"); err != nil {
		t.Skipf("cannot mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dataDir, syscall.MNT_DETACH) })
	d := startServe(t, dataDir, mnt)
	sock := "--socket=" + d.Socket
	mustRun(t, "alloc", "create", "a1", "--task", "fills", "--task", "full", sock)
	logs := filepath.Join(mnt, "a1", "alloc", "logs")
	const script = "seq 1 1000000; echo oops >&2; exit %d"
	want, err := exec.Command("sh", "-c", fmt.Sprintf(script, 0)).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}

	// fills: 6.9 MB into 2 MiB; full: everything is lost.
	for _, c := range []struct {
		task string
		code int
	}{{"fills", 0}, {"full", 3}} {
		r := runCLI(t, nil, "exec", "a1", c.task, sock, "--", "sh", "-c", fmt.Sprintf(script, c.code))
		if r.code != c.code {
			t.Errorf("%s: exit %d, want the task's %d", c.task, r.code, c.code)
		}
		m := regexp.MustCompile(`the task's logs are incomplete: .*lost_bytes=(\d+)`).FindStringSubmatch(r.stderr)
		if m == nil {
			t.Errorf("%s: stderr %q does not report the loss with lost_bytes", c.task, r.stderr)
			continue
		}
		lost, _ := strconv.Atoi(m[1])
		kept := 0
		entries, err := os.ReadDir(logs)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasSuffix(e.Name(), ".fifo") {
				t.Errorf("%s: left behind in alloc/logs: %s", c.task, e.Name())
			}
			if strings.HasPrefix(e.Name(), c.task+".") {
				info, err := e.Info()
				if err != nil {
					t.Fatal(err)
				}
				kept += int(info.Size())
			}
		}
		if lost == 0 || kept+lost != len(want) {
			t.Errorf("%s: %d bytes lost and %d in the files, want %d in all and some lost", c.task, lost, kept, len(want))
		}
		if c.task == "full" && kept != 0 {
			t.Errorf("full: the files took %d bytes of a full disk", kept)
		}
	}
	if r := mustRun(t, "alloc", "status", "a1", sock); !regexp.MustCompile(`(?m)^Status +running$`).MatchString(r.stdout) {
		t.Errorf("a1 after the runs: %q, want it running", r.stdout)
	}
}
