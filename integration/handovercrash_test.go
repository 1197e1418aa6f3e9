package integration

import (
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

// TestHandOverCrashes: a serve upgrade where one of the two daemons dies
// (SIGKILL) at a step of the hand-over, one subtest per step, each
// seen in the dying daemon's log: the new one once it has asked, the old
// one once asked, once parked, the new one once it has taken the
// connection, once serving. The holder keeps the connection throughout,
// so a serve started afterwards takes the mount over and a writer that
// appends and fsyncs all along sees no error, and its file has every
// line once and in order; a process looking up names all along sees no
// error either.
func TestHandOverCrashes(t *testing.T) {
	fstest.RequireFUSE(t)
	for _, step := range []struct {
		name string
		old  bool // the old daemon dies, else the new one
		line string
	}{
		{"new daemon once it asked", false, "taking the mount over from the running serve"},
		{"old daemon once asked", true, "shutting down; the mount stays for the next serve"},
		{"old daemon once parked", true, "stopped; the mount waits for the next serve"},
		{"new daemon once it took the connection", false, "took the mount over"},
		{"new daemon once serving", false, "serving:"},
	} {
		t.Run(step.name, func(t *testing.T) {
			n := startNode(t)
			n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
			data := filepath.Join(n.mnt, "a1/alloc/data")
			logPath := filepath.Join(data, "log.txt")
			writer := helperTask(t, "TestHelperAppender", appendEnv+"="+logPath)
			for deadline := time.Now().Add(harness.Timeout); ; time.Sleep(10 * time.Millisecond) {
				if b, _ := os.ReadFile(logPath); len(b) > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the writer wrote nothing: %s", writer.err.String())
				}
			}
			probe := startStallProbe(data)
			time.Sleep(200 * time.Millisecond)

			old := n.Daemon
			var out allocdirtest.SyncBuffer
			cmd := exec.Command(harness.Binary(t), "serve", "--data-dir", n.dataDir, "--mount", n.mnt, "--socket", n.socket, "--log-level", "info")
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{})
			go func() {
				cmd.Wait()
				close(exited)
			}()
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})
			saw := func(what string, log func() string) {
				t.Helper()
				for deadline := time.Now().Add(harness.Timeout); !strings.Contains(log(), step.line); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the %s daemon never said %q:\n%s", what, step.line, log())
					}
				}
			}
			if step.old {
				saw("old", old.Out.String)
				old.Kill()
			} else {
				saw("new", out.String)
				cmd.Process.Signal(syscall.SIGKILL)
				<-exited
			}
			select {
			case <-exited:
				// The new daemon is gone (killed, or it gave up):
				// the old one hands over if it was asked, else it
				// serves on; the next serve takes the mount over from
				// it or from the holder.
				select {
				case <-old.Exited():
				case <-time.After(3 * time.Second):
				}
				n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket})
				waitLog(t, n.Daemon, "took the mount over")
			default:
				// The old daemon died after the new one asked: the new
				// one takes the data dir, then the connection.
				for deadline := time.Now().Add(harness.Timeout); !strings.Contains(out.String(), "serving:"); time.Sleep(10 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the new daemon does not serve after the old one died:\n%s", out.String())
					}
				}
			}
			time.Sleep(300 * time.Millisecond)
			writer.stopTask(t, syscall.SIGTERM)
			close(probe.stop)
			<-probe.done
			wrote := 0
			if _, err := fmt.Sscanf(writer.out.String(), "wrote %d", &wrote); err != nil || writer.cmd.ProcessState.ExitCode() != 0 {
				t.Fatalf("the writer: exit %d, %q %q\nnew daemon:\n%s", writer.cmd.ProcessState.ExitCode(), writer.out.String(), writer.err.String(), out.String())
			}
			var want strings.Builder
			for i := 1; i <= wrote; i++ {
				fmt.Fprintf(&want, "line %06d\n", i)
			}
			if b, err := os.ReadFile(logPath); err != nil || string(b) != want.String() {
				t.Errorf("the log after %d lines (%v) is not every line once and in order:\n%s", wrote, err, firstDifference(string(b), want.String()))
			}
			probe.mu.Lock()
			if len(probe.errs) > 0 {
				t.Errorf("lookups failed: %v", probe.errs)
			}
			t.Logf("%d lines; the longest a lookup waited: %v", wrote, probe.longest)
			probe.mu.Unlock()
			if t.Failed() {
				t.Logf("the new daemon's output:\n%s", out.String())
			}
		})
	}
}
