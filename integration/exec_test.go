package integration

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"github.com/allocfs/allocfs/internal/mountinfo"
)

// TestExec: `allocfs exec` runs a command as a task of an allocation on
// the mount, the way raw_exec with logmon does: its output rotated into
// alloc/logs, its directory, environment, user and exit code as asked,
// signals passed on, and no FIFO left behind. One allocation, one task
// per subtest, so that each subtest's logs are its own.
func TestExec(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	tasks := []string{"rot", "env", "code", "user", "sig", "sigkill", "evil", "left-cgroup", "left-subreaper"}
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
			fstest.Lacks(t, "no user nobody: %v", err)
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
		code, stderr := n.signalExec(t, logs, "sig", syscall.SIGTERM,
			`trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.1; done`)
		if code != 3 {
			t.Errorf("exit %d after SIGTERM, want the task's 3\n%s", code, stderr)
		}
		if got := readLog(t, logs, "sig.stdout.0"); got != "ready\ngot TERM\n" {
			t.Errorf("sig.stdout.0: got %q, want %q", got, "ready\ngot TERM\n")
		}
	})

	// A task that ignores the SIGTERM passed on to it is killed once
	// --kill-timeout has passed, as Nomad does after kill_timeout.
	t.Run("signal ignored", func(t *testing.T) {
		code, stderr := n.signalExec(t, logs, "sigkill", syscall.SIGTERM,
			`trap '' TERM; echo ready; while :; do sleep 0.1; done`, "--kill-timeout", "1s")
		if code != 128+int(syscall.SIGKILL) {
			t.Errorf("exit %d after SIGTERM and the kill timeout, want 137\n%s", code, stderr)
		}
		if want := "still running after the kill timeout: killing it"; !strings.Contains(stderr, want) {
			t.Errorf("stderr: got %q, want it to contain %q", stderr, want)
		}
	})

	// Nothing the task started outlives its main process: not a
	// background child, not one that started its own session after a
	// double fork, not one that ignores SIGTERM, which is killed after
	// --kill-timeout. Through the task's cgroup where exec can make one,
	// and through the subreaper that it falls back to elsewhere.
	t.Run("no process left behind", func(t *testing.T) {
		t.Run("cgroup", func(t *testing.T) { n.checkNothingLeft(t, a1, "left-cgroup", nil) })
		t.Run("subreaper", func(t *testing.T) { n.checkNothingLeft(t, a1, "left-subreaper", []string{"ALLOCFS_EXEC_NO_CGROUP=1"}) })
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
		if r := n.cli(t, "exec", "a1", "db", "--", "true"); r.code != 1 || !strings.Contains(r.stderr, `allocation "a1" has no task "db"`) {
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

// signalExec runs script as task of a1 through allocfs exec with extra
// args, waits until the task has logged "ready", sends sig to exec, and
// returns exec's exit code and stderr.
func (n *node) signalExec(t *testing.T, logs, task string, sig syscall.Signal, script string, args ...string) (int, string) {
	t.Helper()
	args = append(append([]string{"exec", "a1", task}, args...), "--", "sh", "-c", script)
	cmd := exec.Command(harness.Binary(t), args...)
	cmd.Env = append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	var stderr allocdirtest.SyncBuffer
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
	stdout := task + ".stdout.0"
	if !waitFor(harness.Timeout, func() bool { return readLogMaybe(logs, stdout) == "ready\n" }) {
		t.Fatalf("the task did not log ready: %q\n%s", readLogMaybe(logs, stdout), stderr.String())
	}
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(harness.Timeout):
		t.Fatalf("allocfs exec still running %v after %v", harness.Timeout, sig)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}

// leftBehindScript starts three processes that outlive the shell and
// writes their pids to local/: a background child, a process in a
// session of its own after a double fork (setsid -f), and one that
// ignores SIGTERM. It prints exec's pid (its parent) and its cgroup.
const leftBehindScript = `
echo "exec $PPID"
grep '^0::' /proc/self/cgroup
sleep 1001 & echo $! > local/child
setsid -f sh -c 'echo $$ > local/setsid.new; mv local/setsid.new local/setsid; exec sleep 1002'
sh -c 'trap "" TERM; echo $$ > local/stubborn.new; mv local/stubborn.new local/stubborn; exec sleep 1003' &
while [ ! -s local/setsid ] || [ ! -s local/stubborn ]; do sleep 0.01; done
echo bye
`

// checkNothingLeft runs leftBehindScript as task of allocation a1 with
// the extra environment env, and checks that exec exits 0, says how it
// tracked the task, killed the process that ignored SIGTERM, and that
// none of the three processes exists afterwards, not even as a zombie.
func (n *node) checkNothingLeft(t *testing.T, a1, task string, env []string) {
	cmd := exec.Command(harness.Binary(t), "exec", "a1", task, "--kill-timeout", "1s", "--log-level", "info", "--", "sh", "-c", leftBehindScript)
	cmd.Env = append(append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE")), env...)
	r := n.run(t, cmd, "allocfs exec "+task)
	local := filepath.Join(a1, task, "local")
	var pids []int
	for _, name := range []string{"child", "setsid", "stubborn"} {
		b, err := os.ReadFile(filepath.Join(local, name))
		if err != nil {
			t.Fatalf("the task did not record its %s: %v\n%s", name, err, r.stderr)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		pids = append(pids, pid)
	}
	for i, pid := range pids {
		// Killed here if the test fails, by pid and only if it is still
		// the task's sleep.
		if sleeping(pid, 1001+i) {
			t.Errorf("sleep %d (pid %d) outlived the task", 1001+i, pid)
			syscall.Kill(pid, syscall.SIGKILL)
		} else if zombie(pid) {
			t.Errorf("pid %d is a zombie nobody reaped", pid)
		}
	}
	if r.code != 0 {
		t.Errorf("exit %d, want the task's 0\n%s", r.code, r.stderr)
	}
	if want := "killing what is left of the task"; !strings.Contains(r.stderr, want) {
		t.Errorf("stderr: got %q, want it to contain %q (the process that ignores SIGTERM)", r.stderr, want)
	}

	out := strings.Split(readLog(t, filepath.Join(a1, "alloc", "logs"), task+".stdout.0"), "\n")
	if len(out) != 4 || out[2] != "bye" {
		t.Fatalf("%s.stdout.0: got %q, want exec's pid, the task's cgroup and bye", task, out)
	}
	execPid := strings.TrimPrefix(out[0], "exec ")
	inOwn := strings.HasSuffix(out[1], "/allocfs-exec-"+execPid)
	wantCgroup := env == nil && canMakeCgroup(t)
	switch {
	case wantCgroup && (!strings.Contains(r.stderr, "method=cgroup") || !inOwn):
		t.Errorf("exec could make a cgroup but did not run the task in one: the task was in %q; stderr %q", out[1], r.stderr)
	case env != nil && (!strings.Contains(r.stderr, "method=subreaper") || inOwn):
		t.Errorf("exec with %v: the task was in %q, stderr %q; want the subreaper", env, out[1], r.stderr)
	case env == nil && !wantCgroup:
		t.Logf("exec tracked the task without a cgroup: %s", r.stderr)
	}
	// The task's cgroup is gone with it.
	if m := regexp.MustCompile(`cgroup=(\S+)`).FindStringSubmatch(r.stderr); m != nil {
		if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the task's cgroup %s after exec: %v, want it removed", m[1], err)
		}
	}
}

// sleeping reports whether process pid is `sleep secs`.
func sleeping(pid, secs int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && string(b) == fmt.Sprintf("sleep\x00%d\x00", secs)
}

// zombie reports whether process pid has exited and is not reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && bytes.HasPrefix(b[i:], []byte(") Z "))
}

// canMakeCgroup reports whether this process can make a cgroup v2 below
// its own, as exec, its grandchild in the same cgroup, will try to: a
// probe of the machine, independent of exec's own code.
func canMakeCgroup(t *testing.T) bool {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return false
	}
	var own string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			own = p
		}
	}
	mounts, err := mountinfo.Read("")
	if own == "" || err != nil {
		return false
	}
	for _, m := range mounts {
		rel, ok := strings.CutPrefix(own, strings.TrimSuffix(m.Root, "/"))
		if m.FSType != "cgroup2" || !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
			continue
		}
		probe := filepath.Join(m.MountPoint, rel, fmt.Sprintf("allocfs-probe-%d", os.Getpid()))
		if err := os.Mkdir(probe, 0o755); err != nil {
			t.Logf("no cgroup v2 for tasks: %v", err)
			return false
		}
		os.Remove(probe)
		return true
	}
	return false
}
