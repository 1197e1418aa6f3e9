package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
)

// TestExec: `allocfs exec` runs a command as a task of an allocation on
// the mount, the way raw_exec with logmon does: its output rotated into
// alloc/logs, its directory, environment, user and exit code as asked,
// signals passed on, and no FIFO left behind. One allocation, one task
// per subtest, so that each subtest's logs are its own.
func TestExec(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	tasks := []string{"rot", "env", "code", "user", "sig", "evil"}
	args := []string{"alloc", "create", "a1"}
	for _, task := range tasks {
		args = append(args, "--task", task)
	}
	n.mustCLI(t, args...)
	a1 := filepath.Join(n.mnt, "a1")
	logs := filepath.Join(a1, "alloc", "logs")

	// Over 4 MiB per stream at --max-file-size 1 rotates at least four
	// times; --max-files 2 keeps the newest two files of each stream,
	// which hold the last lines, consecutive and in order.
	t.Run("rotation and retention", func(t *testing.T) {
		const lines = 300000
		r := n.cli(t, "exec", "a1", "rot", "--max-file-size", "1", "--max-files", "2", "--",
			"sh", "-c", fmt.Sprintf("seq -f 'out %%08g' 1 %d; seq -f 'err %%08g' 1 %d >&2", lines, lines))
		if r.code != 0 {
			t.Fatalf("exec: exit %d, want 0\n%s", r.code, r.stderr)
		}
		for _, stream := range []string{"stdout", "stderr"} {
			prefix := map[string]string{"stdout": "out", "stderr": "err"}[stream]
			idx := logIndices(t, logs, "rot."+stream)
			if len(idx) != 2 || idx[1] != idx[0]+1 || idx[0] < 2 {
				t.Errorf("%s: kept indices %v, want two consecutive ones after at least two rotations", stream, idx)
				continue
			}
			var all []string
			for k, i := range idx {
				b, err := os.ReadFile(filepath.Join(logs, fmt.Sprintf("rot.%s.%d", stream, i)))
				if err != nil {
					t.Fatal(err)
				}
				if k == 0 && (len(b) < 1<<20 || len(b) > 1<<20+32<<10) {
					t.Errorf("%s.%d: %d bytes, want 1 MiB plus at most the end of a line", stream, i, len(b))
				}
				if len(b) == 0 || b[len(b)-1] != '\n' {
					t.Errorf("%s.%d does not end a line", stream, i)
				}
				all = append(all, strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")...)
			}
			first, err := strconv.Atoi(strings.TrimPrefix(all[0], prefix+" "))
			if err != nil {
				t.Fatalf("%s: first kept line %q is not whole", stream, all[0])
			}
			for k, line := range all {
				if want := fmt.Sprintf("%s %08d", prefix, first+k); line != want {
					t.Fatalf("%s: kept line %d is %q, want %q", stream, k, line, want)
				}
			}
			if last := first + len(all) - 1; last != lines {
				t.Errorf("%s: the last kept line is %d, want %d", stream, last, lines)
			}
		}
	})

	// The task runs in its directory with raw_exec's variables on top of
	// the caller's environment (MNT comes from the test).
	t.Run("environment and working directory", func(t *testing.T) {
		n.mustCLI(t, "exec", "a1", "env", "--", "sh", "-c",
			`pwd; echo "$NOMAD_ALLOC_DIR"; echo "$NOMAD_TASK_DIR"; echo "$NOMAD_SECRETS_DIR"; echo "$NOMAD_ALLOC_ID"; echo "$NOMAD_TASK_NAME"; echo "$MNT"`)
		got := readLog(t, logs, "env.stdout.0")
		task := filepath.Join(a1, "env")
		want := strings.Join([]string{task, filepath.Join(a1, "alloc"), filepath.Join(task, "local"), filepath.Join(task, "secrets"), "a1", "env", n.mnt}, "\n") + "\n"
		if got != want {
			t.Errorf("env.stdout.0:\ngot\n%s\nwant\n%s", got, want)
		}
	})

	t.Run("exit code", func(t *testing.T) {
		for script, want := range map[string]int{"exit 7": 7, "true": 0, "kill -9 $$": 137} {
			if r := n.cli(t, "exec", "a1", "code", "--", "sh", "-c", script); r.code != want {
				t.Errorf("exec %q: exit %d, want %d\n%s", script, r.code, want, r.stderr)
			}
		}
	})

	// --user nobody: the task's files are nobody's, and so is it.
	t.Run("user", func(t *testing.T) {
		nobody, err := allocdir.LookupOwner("nobody")
		if err != nil {
			t.Skipf("no user nobody: %v", err)
		}
		// The node's temporary directory is 0700: nobody could not reach
		// the task directory to start in it.
		if err := os.Chmod(filepath.Dir(n.mnt), 0o755); err != nil {
			t.Fatal(err)
		}
		n.mustCLI(t, "exec", "a1", "user", "--user", "nobody", "--", "sh", "-c", "id -u; id -g; touch local/made-by-task")
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(a1, "user", "local", "made-by-task"), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != nobody.UID || int(st.Gid) != nobody.GID {
			t.Errorf("the task's file is owned by %d:%d, want nobody (%d:%d)", st.Uid, st.Gid, nobody.UID, nobody.GID)
		}
		if got, want := readLog(t, logs, "user.stdout.0"), fmt.Sprintf("%d\n%d\n", nobody.UID, nobody.GID); got != want {
			t.Errorf("id -u; id -g: got %q, want %q", got, want)
		}
	})

	// SIGTERM to allocfs exec reaches the task, whose exit code is
	// exec's, and what the task printed on its way out is logged.
	t.Run("signal", func(t *testing.T) {
		cmd := exec.Command(harness.Binary(t), "exec", "a1", "sig", "--", "sh", "-c",
			`trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.1; done`)
		cmd.Env = append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
		var stderr harness.SyncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan struct{})
		go func() {
			cmd.Wait()
			close(waited)
		}()
		defer func() {
			cmd.Process.Kill()
			<-waited
		}()
		if !waitFor(harness.Timeout, func() bool { return readLogMaybe(logs, "sig.stdout.0") == "ready\n" }) {
			t.Fatalf("the task did not log ready: %q\n%s", readLogMaybe(logs, "sig.stdout.0"), stderr.String())
		}
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-waited:
		case <-time.After(harness.Timeout):
			t.Fatalf("allocfs exec still running %v after SIGTERM", harness.Timeout)
		}
		if code := cmd.ProcessState.ExitCode(); code != 3 {
			t.Errorf("exit %d after SIGTERM, want the task's 3\n%s", code, stderr.String())
		}
		if got := readLog(t, logs, "sig.stdout.0"); got != "ready\ngot TERM\n" {
			t.Errorf("sig.stdout.0: got %q, want %q", got, "ready\ngot TERM\n")
		}
	})

	// HCSEC-2026-14: a FIFO replaced with a link to a host file makes the
	// run fail before the command starts; the host file is untouched.
	t.Run("symlinked FIFO", func(t *testing.T) {
		outside := filepath.Join(t.TempDir(), "host-file")
		if err := os.WriteFile(outside, []byte("host data\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		before, err := os.Stat(outside)
		if err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(logs, ".evil.stdout.fifo")
		if err := os.Symlink(outside, link); err != nil {
			t.Fatal(err)
		}
		r := n.cli(t, "exec", "a1", "evil", "--", "sh", "-c", "echo pwned; touch local/ran")
		if r.code != 1 {
			t.Errorf("exec through a symlinked FIFO: exit %d, want 1", r.code)
		}
		if want := "unsafe log path: a symbolic link is in the way"; !strings.Contains(r.stderr, want) || !strings.Contains(r.stderr, ".evil.stdout.fifo") {
			t.Errorf("stderr: got %q, want it to name the FIFO and contain %q", r.stderr, want)
		}
		after, err := os.Stat(outside)
		if err != nil || after.Size() != before.Size() || after.Mode() != before.Mode() || !after.ModTime().Equal(before.ModTime()) {
			t.Errorf("host file after exec: %v (%v), want it untouched", after, err)
		}
		if b, _ := os.ReadFile(outside); string(b) != "host data\n" {
			t.Errorf("host file holds %q, want it untouched", b)
		}
		if _, err := os.Stat(filepath.Join(a1, "evil", "local", "ran")); err == nil {
			t.Errorf("the command ran although its logs could not be set up")
		}
		if idx := logIndices(t, logs, "evil.stdout"); len(idx) != 0 {
			t.Errorf("log files made for a refused run: %v", idx)
		}
		os.Remove(link)
	})

	t.Run("unknown allocation or task", func(t *testing.T) {
		if r := n.cli(t, "exec", "a2", "rot", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, "unknown allocation") {
			t.Errorf("unknown allocation: exit %d, stderr %q; want 1 and %q", r.code, r.stderr, "unknown allocation")
		}
		if r := n.cli(t, "exec", "a1", "db", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, `allocation a1 has no task "db"`) {
			t.Errorf("unknown task: exit %d, stderr %q; want 1 and that a1 has no task db", r.code, r.stderr)
		}
	})

	// Every run removed its FIFOs.
	entries, err := os.ReadDir(logs)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".fifo") {
			t.Errorf("left behind in alloc/logs: %s", e.Name())
		}
	}
}

// logIndices returns the indices of base's log files in dir, ascending.
func logIndices(t *testing.T, dir, base string) []int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var idx []int
	for _, e := range entries {
		if rest, ok := strings.CutPrefix(e.Name(), base+"."); ok {
			if i, err := strconv.Atoi(rest); err == nil {
				idx = append(idx, i)
			}
		}
	}
	sort.Ints(idx)
	return idx
}

// readLog returns the content of the log file name in dir.
func readLog(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// readLogMaybe is readLog for a file that may not exist yet.
func readLogMaybe(dir, name string) string {
	b, _ := os.ReadFile(filepath.Join(dir, name))
	return string(b)
}
