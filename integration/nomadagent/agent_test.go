package nomadagent

import (
	"fmt"
	"strings"
	"testing"
)

// noRetry keeps a failing task from being restarted or rescheduled: the
// test must see its first failure, with its events, not wait out a
// restart policy.
const noRetry = `
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }`

// batchJob is a batch job of one group of one task; task is the task's
// body (driver, config, templates, artifacts).
func batchJob(name, task string) string {
	return fmt.Sprintf(`job %q {
  datacenters = ["dc1"]
  type        = "batch"
  group "g" {%s
    task "t" {
%s
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
`, name, noRetry, task)
}

// TestRawExec: a raw_exec task writes into its local/ and to stdout; the
// file is on the mount, the line reaches the agent's logs API, its CLI
// and the log file on the mount, and `nomad alloc fs` lists alloc/.
func TestRawExec(t *testing.T) {
	n := startNode(t, nodeOpts{drivers: []string{"raw_exec"}})
	job := n.runJob(t, batchJob("raw", `
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hello-raw > \"$NOMAD_TASK_DIR/out.txt\"; echo raw-stdout-line; echo raw-stderr-line >&2"]
      }`))
	a := n.waitAlloc(t, job, nil, "complete")
	n.wantFile(t, a.ID+"/t/local/out.txt", "hello-raw\n")
	n.wantFile(t, a.ID+"/alloc/logs/t.stdout.0", "raw-stdout-line\n")
	if got := n.logs(t, a.ID, "t", "stdout", "raw-stdout-line"); got != "raw-stdout-line\n" {
		t.Errorf("stdout through /v1/client/fs/logs: %q", got)
	}
	n.logs(t, a.ID, "t", "stderr", "raw-stderr-line")
	if got := n.cli(t, "alloc", "logs", a.ID, "t"); got != "raw-stdout-line\n" {
		t.Errorf("nomad alloc logs: %q", got)
	}
	ls := n.cli(t, "alloc", "fs", a.ID, "alloc/")
	for _, d := range []string{"data/", "logs/", "tmp/"} {
		if !strings.Contains(ls, d) {
			t.Errorf("nomad alloc fs %s alloc/ does not list %s:\n%s", a.ID, d, ls)
		}
	}
	if got := n.cli(t, "alloc", "fs", a.ID, "t/local/out.txt"); got != "hello-raw\n" {
		t.Errorf("nomad alloc fs of t/local/out.txt: %q", got)
	}
}
