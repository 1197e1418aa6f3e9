package nomadagent

import (
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
)

// follower is a `nomad alloc logs -f` running in the background.
type follower struct {
	cmd  *exec.Cmd
	out  *allocdirtest.SyncBuffer
	done chan struct{}
}

// follow starts `nomad alloc logs -f` of task; cleanup kills it by PID
// if it still runs.
func (n *node) follow(t *testing.T, alloc, task string) *follower {
	t.Helper()
	f := &follower{out: &allocdirtest.SyncBuffer{}, done: make(chan struct{})}
	f.cmd = exec.Command(n.nomad, "alloc", "logs", "-f", alloc, task)
	f.cmd.Env = append(os.Environ(), "NOMAD_ADDR="+n.addr)
	f.cmd.Stdout, f.cmd.Stderr = f.out, f.out
	if err := f.cmd.Start(); err != nil {
		t.Fatalf("start nomad alloc logs -f: %v", err)
	}
	go func() {
		f.cmd.Wait()
		close(f.done)
	}()
	t.Cleanup(f.stop)
	return f
}

// wait waits until the follower has printed want.
func (f *follower) wait(t *testing.T, want string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if f.out.String() == want {
			return
		}
	}
	t.Errorf("nomad alloc logs -f printed %q, want %q", f.out.String(), want)
}

func (f *follower) stop() {
	select {
	case <-f.done:
	default:
		f.cmd.Process.Kill()
		<-f.done
	}
}

// TestRestarts: `nomad alloc logs -f` follows a task across its
// restart (`nomad alloc restart`), which runs it again on the same
// directories; then the agent is killed and started again while the
// task runs, and it takes the task over, untouched, on the same
// alloc_dir.
func TestRestarts(t *testing.T) {
	drivers := []string{"raw_exec"}
	n := startNode(t, nodeOpts{drivers: drivers, persistent: true})
	job := n.runJob(t, stickyJob(1))
	a := n.waitAlloc(t, job, nil, "running")
	f := n.follow(t, a.ID, "t")
	f.wait(t, "started gen 1\n")

	n.cli(t, "alloc", "restart", a.ID, "t")
	f.wait(t, "started gen 1\nstarted gen 1\n")
	f.stop()
	n.wantFile(t, a.ID+"/alloc/data/gens", "gen 1\ngen 1\n")
	before := n.waitAlloc(t, job, nil, "running").TaskStates["t"]
	if before.Restarts != 1 {
		t.Errorf("the task's restarts after nomad alloc restart: %d, want 1", before.Restarts)
	}

	n.restartAgent(t, drivers)
	// The restored client answers for the allocation only once its
	// runner is back: the server's view alone would say running at once.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		if code, _ := n.get(t, "/v1/client/allocation/"+a.ID+"/stats", nil); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restarted agent's client never took %s over", a.ID)
		}
	}
	// Give a restore that went wrong the time to show: a task the client
	// could not reattach to would be started again.
	time.Sleep(3 * time.Second)
	after := n.waitAlloc(t, job, nil, "running").TaskStates["t"]
	if after.Restarts != before.Restarts || !after.StartedAt.Equal(before.StartedAt) {
		t.Errorf("the task after the agent's restart: restarts %d, started %v; before it: %d, %v", after.Restarts, after.StartedAt, before.Restarts, before.StartedAt)
	}
	if got := n.logs(t, a.ID, "t", "stdout", "started gen 1\nstarted gen 1\n"); got != "started gen 1\nstarted gen 1\n" {
		t.Errorf("stdout after the agent's restart: %q", got)
	}
	if got := n.cli(t, "alloc", "fs", a.ID, "alloc/data/gens"); got != "gen 1\ngen 1\n" {
		t.Errorf("nomad alloc fs of alloc/data/gens after the agent's restart: %q", got)
	}
	ls := n.cli(t, "alloc", "fs", a.ID, "t/")
	for _, d := range []string{"local/", "secrets/", "tmp/"} {
		if !strings.Contains(ls, d) {
			t.Errorf("nomad alloc fs %s t/ after the agent's restart does not list %s:\n%s", a.ID, d, ls)
		}
	}
}
