package nomadagent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// migrateScript is the task of migrateJob. The first allocation fills
// alloc/data and local/ with what a snapshot has to carry: files of
// several modes, owners other than the agent's, a subdirectory two deep,
// symlinks (one dangling), an empty file and one of a megabyte, which
// Nomad copies a kilobyte at a time. Every allocation after it says what
// it found before it started, so the data is seen by the task itself and
// not only by the test.
const migrateScript = `set -e
d="$NOMAD_ALLOC_DIR/data"
l="$NOMAD_TASK_DIR"
if [ -e "$d/first" ]; then
  echo "found $(cat "$d/first") $(readlink "$d/link") $(cat "$l/note") $(cat "$d/sub/blob" | wc -c)"
else
  echo "$NOMAD_ALLOC_ID" > "$d/first"
  mkdir -p "$d/sub/deeper" "$l/cache"
  head -c 1048576 /dev/urandom > "$d/sub/blob"
  printf 'owned\n' > "$d/owned"
  printf '#!/bin/sh\necho run\n' > "$d/sub/run.sh"
  : > "$d/empty"
  printf 'read only\n' > "$d/sub/deeper/ro"
  ln -s sub/blob "$d/link"
  ln -s no-such-file "$l/dangling"
  echo note > "$l/note"
  echo cached > "$l/cache/c"
  chown 65534:65534 "$d/owned"
  chown 1234:4321 "$d/sub/deeper" "$l/cache/c"
  chmod 0640 "$d/owned"
  chmod 0604 "$d/sub/blob"
  chmod 0755 "$d/sub/run.sh"
  chmod 0666 "$d/empty"
  chmod 0400 "$d/sub/deeper/ro"
  chmod 0751 "$d/sub"
  chmod 0750 "$d/sub/deeper"
  chmod 0600 "$l/note"
  chmod 0700 "$l/cache"
  chmod 0644 "$d/first" "$l/cache/c"
fi
echo "$NOMAD_ALLOC_ID" >> "$d/gens"
echo "started $NOMAD_ALLOC_ID"
exec sleep 3600
`

// migrateJob is a service job whose sticky ephemeral disk migrates: a
// drain of its node has Nomad place the replacement on another node,
// whose client fetches the disk from the first one's.
func migrateJob() string {
	return fmt.Sprintf(`job "migrate" {
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
      config {
        command = "/bin/sh"
        args    = ["-c", %q]
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}
`, noRetry, migrateScript)
}

// migratedRoots are what Nomad's snapshot of an allocation holds: the
// shared alloc/data and each task's local/.
var migratedRoots = []string{"alloc/data", "t/local"}

// fileEntry is what a migration must keep of one file: its type and
// permission bits, its owner, and its content (size and SHA-256) or a
// symlink's target. Times are not kept: Nomad's unpacking sets none.
type fileEntry struct {
	mode     iofs.FileMode
	uid, gid uint32
	size     int64
	content  string
}

func (e fileEntry) String() string {
	return fmt.Sprintf("%v %d:%d %d %s", e.mode, e.uid, e.gid, e.size, e.content)
}

// tree reads every file below the migrated roots of alloc on the node's
// alloc_dir, by path from the allocation's directory. The roots
// themselves are left out: Nomad makes them again for the replacement,
// with modes of its own.
func (n *node) tree(t *testing.T, alloc string) map[string]fileEntry {
	t.Helper()
	out := map[string]fileEntry{}
	for _, root := range migratedRoots {
		top := n.path(alloc + "/" + root)
		_, err := within(t, "walk "+top, func() (struct{}, error) {
			return struct{}{}, filepath.WalkDir(top, func(p string, d iofs.DirEntry, err error) error {
				if err != nil || p == top {
					return err
				}
				fi, err := os.Lstat(p)
				if err != nil {
					return err
				}
				st := fi.Sys().(*syscall.Stat_t)
				e := fileEntry{mode: fi.Mode(), uid: st.Uid, gid: st.Gid, size: fi.Size()}
				switch {
				case fi.Mode()&iofs.ModeSymlink != 0:
					if e.content, err = os.Readlink(p); err != nil {
						return err
					}
				case fi.Mode().IsRegular():
					f, err := os.Open(p)
					if err != nil {
						return err
					}
					h := sha256.New()
					_, err = io.Copy(h, f)
					f.Close()
					if err != nil {
						return fmt.Errorf("read %s: %w", p, err)
					}
					e.content = hex.EncodeToString(h.Sum(nil))
				case fi.IsDir():
					// A directory's size is its filesystem's business.
					e.size = 0
				default:
					return fmt.Errorf("%s: a %v, which the test's task never makes", p, fi.Mode().Type())
				}
				rel, _ := filepath.Rel(n.path(alloc), p)
				out[filepath.ToSlash(rel)] = e
				return nil
			})
		})
		if err != nil {
			t.Fatalf("walk %s of %s on %s: %v", root, alloc, n.name, err)
		}
	}
	return out
}

// TestMigrateBetweenNodes: Nomad's own migration of a sticky ephemeral
// disk from one node to another. One server and two clients, each client
// with its alloc_dir on an allocfs mount of its own; the node that runs
// the first allocation is drained, and the replacement on the other node
// starts with the first one's alloc/data and local/ as they were, byte
// for byte, with their modes, owners and symlinks. Nomad's client fetches
// them from the first node's client as a tar, unpacks it into a
// directory of the previous allocation on its own alloc_dir and renames
// the volumes into the replacement: on allocfs, remaps. Once the job is
// stopped and collected, neither alloc_dir keeps anything of either
// allocation.
func TestMigrateBetweenNodes(t *testing.T) {
	srv := startServer(t)
	drivers := []string{"raw_exec"}
	start := time.Now()
	from := startNode(t, nodeOpts{join: srv, name: "allocfs-a", drivers: drivers})
	to := startNode(t, nodeOpts{join: srv, name: "allocfs-b", drivers: drivers})
	t.Logf("both clients were ready %v after the server", time.Since(start).Round(time.Millisecond))

	job := srv.runJob(t, migrateJob())
	a1 := srv.waitAlloc(t, job, nil, "running")
	switch a1.NodeID {
	case from.nodeID:
	case to.nodeID:
		from, to = to, from
	default:
		t.Fatalf("allocation %s placed on node %q, neither of the clients (%s, %s)", a1.ID, a1.NodeID, from.nodeID, to.nodeID)
	}
	from.stderrOnFailure(t, a1.ID, "t")
	from.logs(t, a1.ID, "t", "stdout", "started "+a1.ID)
	before := from.tree(t, a1.ID)
	// What the task made, so that two empty trees cannot pass for a
	// migration.
	want := map[string]struct {
		mode     iofs.FileMode
		uid, gid uint32
	}{
		"alloc/data/owned":         {0o640, 65534, 65534},
		"alloc/data/sub":           {iofs.ModeDir | 0o751, 0, 0},
		"alloc/data/sub/blob":      {0o604, 0, 0},
		"alloc/data/sub/run.sh":    {0o755, 0, 0},
		"alloc/data/sub/deeper":    {iofs.ModeDir | 0o750, 1234, 4321},
		"alloc/data/sub/deeper/ro": {0o400, 0, 0},
		"alloc/data/empty":         {0o666, 0, 0},
		"alloc/data/link":          {iofs.ModeSymlink | 0o777, 0, 0},
		"t/local/note":             {0o600, 0, 0},
		"t/local/dangling":         {iofs.ModeSymlink | 0o777, 0, 0},
		"t/local/cache":            {iofs.ModeDir | 0o700, 0, 0},
		"t/local/cache/c":          {0o644, 1234, 4321},
		"alloc/data/first":         {0o644, 0, 0},
	}
	for p, w := range want {
		e, ok := before[p]
		if !ok || e.mode != w.mode || e.uid != w.uid || e.gid != w.gid {
			t.Errorf("%s of the first allocation on %s: %v (there: %v); want %v %d:%d", p, from.name, e, ok, w.mode, w.uid, w.gid)
		}
	}
	if e := before["alloc/data/sub/blob"]; e.size != 1<<20 {
		t.Errorf("alloc/data/sub/blob of the first allocation: %d bytes, want %d", e.size, 1<<20)
	}
	if e := before["alloc/data/link"]; e.content != "sub/blob" {
		t.Errorf("alloc/data/link of the first allocation points to %q, want sub/blob", e.content)
	}

	drained := time.Now()
	srv.cli(t, "node", "drain", "-enable", "-yes", "-detach", "-deadline", "1m", from.nodeID)
	a2 := srv.waitAlloc(t, job, map[string]bool{a1.ID: true}, "running")
	t.Logf("the replacement ran %v after the drain began", time.Since(drained).Round(time.Millisecond))
	to.stderrOnFailure(t, a2.ID, "t")
	if a2.NodeID != to.nodeID {
		t.Fatalf("the replacement %s runs on node %s, want %s (%s)", a2.ID, a2.NodeID, to.nodeID, to.name)
	}
	var full struct{ PreviousAllocation string }
	srv.mustDo(t, http.MethodGet, "/v1/allocation/"+a2.ID, nil, &full)
	if full.PreviousAllocation != a1.ID {
		t.Errorf("the replacement %s follows %q, want %s", a2.ID, full.PreviousAllocation, a1.ID)
	}
	found := fmt.Sprintf("found %s sub/blob note %d\nstarted %s\n", a1.ID, 1<<20, a2.ID)
	if got := to.logs(t, a2.ID, "t", "stdout", "started "+a2.ID); got != found {
		t.Errorf("the replacement's stdout: %q, want %q", got, found)
	}

	after := to.tree(t, a2.ID)
	// gens is the one file the replacement writes.
	if got, want := after["alloc/data/gens"], before["alloc/data/gens"]; got.mode != want.mode || got.uid != want.uid || got.gid != want.gid {
		t.Errorf("alloc/data/gens on %s: %v, on %s: %v", to.name, got, from.name, want)
	}
	to.wantFile(t, a2.ID+"/alloc/data/gens", a1.ID+"\n"+a2.ID+"\n")
	delete(before, "alloc/data/gens")
	delete(after, "alloc/data/gens")
	var paths []string
	for p := range before {
		paths = append(paths, p)
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			paths = append(paths, p)
		}
	}
	sort.Strings(paths)
	for _, p := range paths {
		b, inBefore := before[p]
		a, inAfter := after[p]
		switch {
		case !inAfter:
			t.Errorf("%s of %s on %s (%v) is missing from %s on %s", p, a1.ID, from.name, b, a2.ID, to.name)
		case !inBefore:
			t.Errorf("%s of %s on %s (%v) was not in %s on %s", p, a2.ID, to.name, a, a1.ID, from.name)
		case a != b:
			t.Errorf("%s: %v in %s on %s, %v in %s on %s", p, b, a1.ID, from.name, a, a2.ID, to.name)
		}
	}
	// The previous allocation's directory on the new node held the
	// snapshot only until its volumes were renamed away.
	to.wantGone(t, a1.ID)
	if to.serve != nil {
		out := to.serve.Out.String()
		for _, vol := range migratedRoots {
			ok := false
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "handed volume over") && strings.Contains(line, "op=remap") &&
					strings.Contains(line, a2.ID) && strings.Contains(line, a1.ID) && strings.Contains(line, vol) {
					ok = true
				}
			}
			if !ok {
				t.Errorf("serve's log on %s has no \"handed volume over\" of %s from %s to %s with op=remap", to.name, vol, a1.ID, a2.ID)
			}
		}
	}

	srv.mustDo(t, http.MethodDelete, "/v1/job/"+url.PathEscape(job), nil, nil)
	srv.waitAlloc(t, job, map[string]bool{a1.ID: true}, "complete")
	from.collect(t, a1.ID)
	to.collect(t, a2.ID)
	for _, n := range []*node{from, to} {
		for _, id := range []string{a1.ID, a2.ID} {
			n.wantGone(t, id)
		}
		ents, err := within(t, "list "+n.allocDir, func() ([]os.DirEntry, error) { return os.ReadDir(n.allocDir) })
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("list the alloc_dir of %s: %v", n.name, err)
		}
		for _, e := range ents {
			t.Errorf("%s left in the alloc_dir of %s after the GC", e.Name(), n.name)
		}
	}
}
