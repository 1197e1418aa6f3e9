package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
		{"unknown task", []string{"exec", "a1", "db", sock, "--", "true"}, exitFailed, `allocation a1 has no task "db" (its tasks: web)`},
		{"stopped allocation", []string{"exec", "old", "web", sock, "--", "true"}, exitFailed, "allocation old is terminal"},
		{"missing command", []string{"exec", "a1", "web", sock, "--", "/no/such/command"}, exitFailed, "failed to start task web of allocation a1"},
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
