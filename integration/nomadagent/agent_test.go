package nomadagent

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
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
	n.stderrOnFailure(t, a.ID, "t")
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

// TestExec: an exec task, chrooted in its task directory with the
// client's chroot_env (a static busybox as /bin/sh), writes into its
// local/ and the shared alloc/ and to stdout.
func TestExec(t *testing.T) {
	n := startNode(t, nodeOpts{drivers: []string{"exec"}})
	start := time.Now()
	job := n.runJob(t, batchJob("exec", `
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo exec-local > \"$NOMAD_TASK_DIR/out.txt\"; echo exec-alloc > \"$NOMAD_ALLOC_DIR/exec.txt\"; echo exec-stdout"]
      }`))
	a := n.waitAlloc(t, job, nil, "complete")
	n.stderrOnFailure(t, a.ID, "t")
	t.Logf("the exec task ran and completed %v after its job was registered", time.Since(start).Round(time.Millisecond))
	n.wantFile(t, a.ID+"/t/local/out.txt", "exec-local\n")
	n.wantFile(t, a.ID+"/alloc/exec.txt", "exec-alloc\n")
	n.wantFile(t, a.ID+"/alloc/logs/t.stdout.0", "exec-stdout\n")
	n.logs(t, a.ID, "t", "stdout", "exec-stdout")
	// Nomad's GC of a chroot: allocfs takes the chroot environment out
	// first, so that the walk removes the task's own files alone.
	n.collect(t, a.ID)
	if n.serve != nil && !strings.Contains(n.serve.Out.String(), "Nomad tears a chroot task directory down") {
		t.Errorf("serve did not log that Nomad tore the chroot task directory down")
	}
}

// TestTemplatesAndArtifact: templates rendered into local/, secrets/
// and ${NOMAD_ALLOC_DIR}, and a tar.gz artifact from a local server
// unpacked into local/, reach the task and show on alloc_dir.
func TestTemplatesAndArtifact(t *testing.T) {
	requireAgentTests(t)
	srv := serveFiles(t, map[string][]byte{"art.tar.gz": tarGz(t, map[string]string{
		"hello.txt": "from-artifact\n",
		"sub/b.txt": "nested\n",
	})})
	n := startNode(t, nodeOpts{drivers: []string{"raw_exec"}})
	job := n.runJob(t, batchJob("tpl", fmt.Sprintf(`
      driver = "raw_exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "cat local/tpl.txt secrets/tpl.txt \"$NOMAD_ALLOC_DIR/tpl.txt\" local/art/hello.txt local/art/sub/b.txt"]
      }
      template {
        destination = "local/tpl.txt"
        data        = <<EOT
local {{ env "NOMAD_TASK_NAME" }}
EOT
      }
      template {
        destination = "secrets/tpl.txt"
        data        = "secret {{ env \"NOMAD_TASK_NAME\" }}\n"
      }
      template {
        destination = "${NOMAD_ALLOC_DIR}/tpl.txt"
        data        = "shared\n"
      }
      artifact {
        source      = "%s/art.tar.gz"
        destination = "local/art"
      }`, srv)))
	a := n.waitAlloc(t, job, nil, "complete")
	n.stderrOnFailure(t, a.ID, "t")
	want := "local t\nsecret t\nshared\nfrom-artifact\nnested\n"
	if got := n.logs(t, a.ID, "t", "stdout", want); got != want {
		t.Errorf("what the task read: %q, want %q", got, want)
	}
	n.wantFile(t, a.ID+"/t/local/tpl.txt", "local t\n")
	n.wantFile(t, a.ID+"/t/secrets/tpl.txt", "secret t\n")
	n.wantFile(t, a.ID+"/alloc/tpl.txt", "shared\n")
	n.wantFile(t, a.ID+"/t/local/art/hello.txt", "from-artifact\n")
	n.wantFile(t, a.ID+"/t/local/art/sub/b.txt", "nested\n")
}

// stickyJob is a service job whose sticky, migrating ephemeral disk
// collects one line per generation in alloc/data.
func stickyJob(gen int) string {
	return fmt.Sprintf(`job "sticky" {
  datacenters = ["dc1"]
  type        = "service"
  group "g" {%s
    ephemeral_disk {
      sticky  = true
      migrate = true
    }
    task "t" {
      driver       = "raw_exec"
      kill_timeout = "2s"
      env {
        GEN = "%d"
      }
      config {
        command = "/bin/sh"
        args    = ["-c", "echo gen $GEN >> \"$NOMAD_ALLOC_DIR/data/gens\"; echo started gen $GEN; exec sleep 3600"]
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
`, noRetry, gen)
}

// TestStickyMigrate: a change of the job replaces its allocation on the
// node; the replacement finds the sticky disk's data (on the mount, by a
// remap, nothing copied) and the previous allocation's logs stay
// readable until it is collected.
func TestStickyMigrate(t *testing.T) {
	n := startNode(t, nodeOpts{drivers: []string{"raw_exec"}})
	job := n.runJob(t, stickyJob(1))
	a1 := n.waitAlloc(t, job, nil, "running")
	n.logs(t, a1.ID, "t", "stdout", "started gen 1")
	n.wantFile(t, a1.ID+"/alloc/data/gens", "gen 1\n")

	n.runJob(t, stickyJob(2))
	a2 := n.waitAlloc(t, job, map[string]bool{a1.ID: true}, "running")
	// The list's stubs leave the previous allocation out.
	var full struct{ PreviousAllocation string }
	n.mustDo(t, http.MethodGet, "/v1/allocation/"+a2.ID, nil, &full)
	if full.PreviousAllocation != a1.ID {
		t.Errorf("the replacement %s follows %q, want %s", a2.ID, full.PreviousAllocation, a1.ID)
	}
	n.logs(t, a2.ID, "t", "stdout", "started gen 2")
	n.wantFile(t, a2.ID+"/alloc/data/gens", "gen 1\ngen 2\n")
	if n.exists(t, a1.ID+"/alloc/data") {
		t.Errorf("%s/alloc/data is still there after the migration", a1.ID)
	}
	// The previous allocation's logs, until GC.
	if got := n.logs(t, a1.ID, "t", "stdout", "started gen 1"); got != "started gen 1\n" {
		t.Errorf("the previous allocation's stdout through the API: %q", got)
	}
	if got := n.cli(t, "alloc", "logs", a1.ID, "t"); got != "started gen 1\n" {
		t.Errorf("nomad alloc logs of the previous allocation: %q", got)
	}
	n.wantFile(t, a1.ID+"/alloc/logs/t.stdout.0", "started gen 1\n")
	if n.serve != nil {
		found := false
		for _, line := range strings.Split(n.serve.Out.String(), "\n") {
			if strings.Contains(line, "handed volume over") && strings.Contains(line, "op=remap") &&
				strings.Contains(line, a2.ID) && strings.Contains(line, a1.ID) && strings.Contains(line, "alloc/data") {
				found = true
			}
		}
		if !found {
			t.Errorf("serve's log has no \"handed volume over\" of alloc/data from %s to %s with op=remap", a1.ID, a2.ID)
		}
	}
}

// TestStopAndGC: once its job is stopped and the client collects it, an
// allocation's directory is gone from alloc_dir, with every mount Nomad
// made in it (secrets/ and private/ tmpfs), and allocfs keeps no record
// of it.
func TestStopAndGC(t *testing.T) {
	n := startNode(t, nodeOpts{drivers: []string{"raw_exec"}})
	job := n.runJob(t, stickyJob(1))
	a := n.waitAlloc(t, job, nil, "running")
	n.wantFile(t, a.ID+"/alloc/data/gens", "gen 1\n")
	dir := n.path(a.ID)
	if got := mountsBelow(t, dir); len(got) < 2 {
		t.Errorf("mounts below %s while it runs: %v, want at least secrets/ and private/", dir, got)
	}
	if n.serve != nil && !n.storeHas(t, a.ID) {
		t.Errorf("allocfs has no record of the running allocation %s", a.ID)
	}

	n.mustDo(t, http.MethodDelete, "/v1/job/"+job, nil, nil)
	n.waitAlloc(t, job, nil, "complete")
	n.collect(t, a.ID)
}

// collect has Nomad collect the terminal allocation id (`nomad system gc`
// and the client's GC) and checks that its directory, every mount Nomad
// made in it and allocfs's record of it are gone.
func (n *node) collect(t *testing.T, id string) {
	t.Helper()
	n.cli(t, "system", "gc")
	n.mustDo(t, http.MethodPut, "/v1/client/gc", nil, nil)
	start := time.Now()
	for n.exists(t, id) {
		if time.Since(start) > time.Minute {
			t.Fatalf("%s still on alloc_dir a minute after the client's GC", id)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the allocation's directory went %v after the client's GC", time.Since(start).Round(time.Millisecond))
	n.wantGone(t, id)
}

// wantGone fails the test unless the node's alloc_dir has no directory
// of id, no mount below it, and allocfs no record of it.
func (n *node) wantGone(t *testing.T, id string) {
	t.Helper()
	dir := n.path(id)
	if n.exists(t, id) {
		t.Errorf("%s is still in %s", id, n.allocDir)
	}
	if got := mountsBelow(t, dir); len(got) != 0 {
		t.Errorf("mounts left below %s: %v", dir, got)
	}
	if n.serve != nil && n.storeHas(t, id) {
		t.Errorf("allocfs still has a record of %s", id)
	}
}
