package integration

import (
	"bytes"
	"fmt"
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

// TestLogsFollowAcrossRotation runs `allocfs logs -f` while `allocfs exec`
// writes numbered lines through rotation (1 MiB files), and checks that
// the follower printed every line once, in order; then that the same logs
// read without -f, with -tail, and through --previous after a migration
// are what they should be.
func TestLogsFollowAcrossRotation(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	logs := filepath.Join(n.mnt, "a1", "alloc", "logs")
	// The logs endpoint answers 404 until the task has a log file; the
	// runner appends to the highest existing one, so this one is used.
	if err := os.WriteFile(filepath.Join(logs, "web.stdout.0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	var out allocdirtest.SyncBuffer
	var errOut bytes.Buffer
	follow := exec.Command(harness.Binary(t), "logs", "-f", "a1", "web")
	follow.Env = append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	follow.Stdout, follow.Stderr = &out, &errOut
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	followDone := make(chan error, 1)
	go func() { followDone <- follow.Wait() }()
	t.Cleanup(func() {
		follow.Process.Kill()
		<-followDone
	})

	const lines = 400000 // 5.6 MB: five rotations at 1 MiB
	r := n.cli(t, "exec", "a1", "web", "--max-file-size", "1", "--max-files", "20", "--",
		"sh", "-c", fmt.Sprintf("seq -f 'line %%08g' 1 %d", lines))
	if r.code != 0 {
		t.Fatalf("exec: exit %d\n%s", r.code, r.stderr)
	}
	if idx := logIndices(t, logs, "web.stdout"); len(idx) < 5 {
		t.Fatalf("log files %v: want at least five after rotation", idx)
	}
	last := fmt.Sprintf("line %08d\n", lines)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.HasSuffix(out.String(), last) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower has not printed the last line 30s after the task ended; it printed %d bytes\nstderr: %s", len(out.String()), errOut.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := follow.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-followDone:
		if err != nil {
			t.Errorf("allocfs logs -f after SIGINT: %v (want exit 0)\nstderr: %s", err, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("allocfs logs -f still running 10s after SIGINT")
	}
	followDone <- nil
	checkNumbered(t, out.String(), 1, lines)

	t.Run("without follow", func(t *testing.T) {
		checkNumbered(t, n.mustCLI(t, "logs", "a1", "web"), 1, lines)
	})
	t.Run("tail", func(t *testing.T) {
		checkNumbered(t, n.mustCLI(t, "logs", "-tail", "-n", "3", "a1", "web"), lines-2, lines)
		if got := n.mustCLI(t, "logs", "-tail", "-c", "5", "a1", "web"); got != "0000\n" {
			t.Errorf("-tail -c 5: got %q, want %q", got, "0000\n")
		}
	})
	t.Run("stderr", func(t *testing.T) {
		// The runner opened web.stderr.0, and the task wrote nothing to it.
		if got := n.mustCLI(t, "logs", "-stderr", "a1", "web"); got != "" {
			t.Errorf("-stderr: got %q, want nothing", got)
		}
	})
	t.Run("previous", func(t *testing.T) {
		n.mustCLI(t, "alloc", "stop", "a1")
		n.mustCLI(t, "alloc", "create", "a2", "--task", "web", "--previous", "a1", "--migrate")
		checkNumbered(t, n.mustCLI(t, "logs", "--previous", "-tail", "-n", "2", "a2", "web"), lines-1, lines)
		if r := n.cli(t, "logs", "a2", "web"); r.code == 0 {
			t.Errorf("logs of a2, which has none: exit 0, want an error (logs are not migrated)")
		}
		n.mustCLI(t, "gc", "a1")
		r := n.cli(t, "logs", "--previous", "a2", "web")
		if r.code == 0 || !strings.Contains(r.stderr, "it was collected") {
			t.Errorf("--previous after gc: exit %d, stderr %q; want the logs reported gone", r.code, r.stderr)
		}
	})
}

// checkNumbered checks that out is exactly the lines "line %08d" from
// first to last, each once, in order.
func checkNumbered(t *testing.T, out string, first, last int) {
	t.Helper()
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(got) != last-first+1 {
		t.Errorf("got %d lines, want %d (%d..%d)", len(got), last-first+1, first, last)
	}
	for i, line := range got {
		if want := fmt.Sprintf("line %08d", first+i); line != want {
			t.Fatalf("line %d: got %q, want %q (lost, repeated or out of order)", i+1, line, want)
		}
	}
}
