package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
)

// TestSeedScenario is the story allocfs exists for (nomad#18034), end to
// end through the daemon, the mount and the shell, in both local modes:
// allocation A writes data and a log and stops; B replaces it with
// --migrate on the same node and finds the data; A's logs are still
// there to read, through the mount and the API; B appends; collecting A removes A and its logs and
// leaves B's data alone.
func TestSeedScenario(t *testing.T) {
	fstest.RequireFUSE(t)
	for _, mode := range []string{"adopt", "snapshot"} {
		t.Run(mode, func(t *testing.T) {
			n := startNode(t)
			n.mustCLI(t, "alloc", "create", "A", "--task", "web")
			n.mustSh(t, n.mnt, `
				echo "written by A" >> A/alloc/data/test.txt
				echo "A local" > A/web/local/conf
				echo "A failed: disk full" >> A/alloc/logs/web.stderr.0`)

			// A still running: the handover is refused and nothing is made.
			r := n.cli(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--migrate-mode", mode)
			if r.code == 0 || !strings.Contains(r.stderr, "stop it first") {
				t.Fatalf("create B from a running A: exit %d, %q; want a refusal that says to stop A", r.code, r.stderr)
			}
			if _, err := os.Stat(filepath.Join(n.mnt, "B")); !os.IsNotExist(err) {
				t.Fatalf("B after the refusal: got %v, want no such allocation", err)
			}

			n.mustCLI(t, "alloc", "stop", "A")
			n.mustCLI(t, "alloc", "create", "B", "--task", "web", "--previous", "A", "--migrate", "--migrate-mode", mode)
			if got := n.mustSh(t, n.mnt, "cat B/alloc/data/test.txt B/web/local/conf"); got != "written by A\nA local\n" {
				t.Errorf("B's data and local: got %q", got)
			}
			if got := n.mustSh(t, n.mnt, "cat A/alloc/logs/web.stderr.0"); got != "A failed: disk full\n" {
				t.Errorf("A's log after the migration: got %q, want it kept", got)
			}
			// And through the API, by A's ID and as B's previous allocation.
			if got := n.mustCLI(t, "logs", "-stderr", "A", "web"); got != "A failed: disk full\n" {
				t.Errorf("allocfs logs -stderr A web: got %q, want A's log", got)
			}
			if got := n.mustCLI(t, "logs", "--previous", "-stderr", "B", "web"); got != "A failed: disk full\n" {
				t.Errorf("allocfs logs --previous -stderr B web: got %q, want A's log", got)
			}
			n.mustSh(t, n.mnt, `echo "written by B" >> B/alloc/data/test.txt`)
			if got := n.mustSh(t, n.mnt, "cat B/alloc/data/test.txt"); got != "written by A\nwritten by B\n" {
				t.Errorf("B's test.txt after its append: got %q", got)
			}
			// A's own view: a note in adopt mode, the frozen data in
			// snapshot mode; never writable.
			wantA := "written by A\n"
			if mode == "adopt" {
				if got := n.mustSh(t, n.mnt, "ls A/alloc/data"); got != "MIGRATED-TO\n" {
					t.Errorf("A's alloc/data after adoption: got %q, want only MIGRATED-TO", got)
				}
			} else if got := n.mustSh(t, n.mnt, "cat A/alloc/data/test.txt"); got != wantA {
				t.Errorf("A's frozen view: got %q, want %q", got, wantA)
			}
			if r := n.sh(t, n.mnt, "echo x >> A/alloc/data/test.txt"); r.code == 0 || !strings.Contains(r.stderr, "Read-only file system") {
				t.Errorf("write into A's migrated data: exit %d, %q; want Read-only file system", r.code, r.stderr)
			}

			if out := n.mustCLI(t, "gc", "A"); !strings.Contains(out, "collected allocation A") {
				t.Errorf("gc A: got %q", out)
			}
			if _, err := os.Stat(filepath.Join(n.mnt, "A")); !os.IsNotExist(err) {
				t.Errorf("A after gc: got %v, want gone", err)
			}
			if r := n.cli(t, "alloc", "status", "A"); r.code == 0 {
				t.Errorf("status of a collected allocation: exit 0, want a failure")
			}
			if r := n.cli(t, "logs", "--previous", "-stderr", "B", "web"); r.code == 0 || !strings.Contains(r.stderr, "it was collected") {
				t.Errorf("logs --previous of B after gc A: exit %d, %q; want A's logs reported gone", r.code, r.stderr)
			}
			if got := n.mustSh(t, n.mnt, "cat B/alloc/data/test.txt B/web/local/conf"); got != "written by A\nwritten by B\nA local\n" {
				t.Errorf("B's data after A was collected: got %q", got)
			}
			n.stop(t)
		})
	}
}
