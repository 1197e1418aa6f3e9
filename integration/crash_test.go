package integration

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"

	"github.com/allocfs/allocfs/integration/harness"
)

// TestSecondServeRefused checks that a second `allocfs serve` on a data
// dir that one already serves fails at once, saying which process holds it
// and where it is mounted, and changes nothing: no mount, no socket, and
// the first daemon serves on. On another mount point it always fails; on
// the same one it fails with --live-restart=false, and takes the mount
// over otherwise (an upgrade: restart_test.go).
func TestSecondServeRefused(t *testing.T) {
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web")
	n.mustSh(t, n.mnt, `echo kept > a1/alloc/data/f`)

	other, err := os.MkdirTemp("", "allocfs-second-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	for _, c := range []struct{ name, mnt string }{
		{"another mount", filepath.Join(other, "mnt")},
		{"the same mount", n.mnt},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock := filepath.Join(other, "second.sock")
			cmd := exec.Command(harness.Binary(t), "serve", "--data-dir", n.dataDir, "--mount", c.mnt, "--socket", sock, "--live-restart=false")
			r := n.run(t, cmd, "second allocfs serve")
			if r.code == 0 {
				t.Fatalf("second serve on %s: exit 0, want a failure", n.dataDir)
			}
			for _, want := range []string{"data dir is in use", fmt.Sprintf("pid %d", n.Pid()), "mount " + n.mnt} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("second serve's error %q does not say %q", r.stderr, want)
				}
			}
			if _, err := os.Lstat(sock); !os.IsNotExist(err) {
				t.Errorf("second serve left its socket: %v", err)
			}
			if c.mnt != n.mnt {
				if got := harness.MountsAt(t, c.mnt); got != 0 {
					t.Errorf("second serve mounted %d times at %s", got, c.mnt)
				}
			}
			if got := harness.MountsAt(t, n.mnt); got != 1 {
				t.Errorf("first daemon's mount: %d allocfs mounts at %s, want 1", got, n.mnt)
			}
			if out := n.mustSh(t, n.mnt, `cat a1/alloc/data/f`); out != "kept\n" {
				t.Errorf("file through the first mount: %q", out)
			}
		})
	}
	n.mustCLI(t, "alloc", "create", "a2", "--task", "web")
}

// TestKillMidGC kills the daemon with SIGKILL while it removes a
// collected allocation's 30,000-file layer, and checks that the next
// daemon's collector removes what is left of it: no layer is left that
// no record names.
func TestKillMidGC(t *testing.T) {
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "big", "--task", "web")
	layer := filepath.Join(n.dataDir, "layers", volumeLayer(t, n.dataDir, "big", "alloc/data"))
	for d := 0; d < 30; d++ {
		dir := filepath.Join(layer, fmt.Sprintf("d%02d", d))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for f := 0; f < 1000; f++ {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(f)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	n.mustCLI(t, "alloc", "stop", "big")

	gc := exec.Command(harness.Binary(t), "gc", "big")
	gc.Env = append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
	if err := gc.Start(); err != nil {
		t.Fatal(err)
	}
	// The record goes first, in one journaled change; the removal of the
	// layer follows. Kill the daemon once the record is gone.
	state := filepath.Join(n.dataDir, "state", "big.json")
	deadline := time.Now().Add(harness.Timeout)
	for {
		if _, err := os.Lstat(state); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the collected allocation's record never went")
		}
		time.Sleep(time.Millisecond)
	}
	n.kill9(t)
	gc.Wait()
	if _, err := os.Lstat(layer); err != nil {
		t.Fatalf("the layer was gone before the kill (%v): the test did not kill mid-removal", err)
	}

	n.Restart(t)
	// The collector's pass removes the half-removed layer first and the
	// allocation's other layers after it, one by one: wait for the pass.
	deadline = time.Now().Add(harness.Timeout)
	for {
		_, err := os.Lstat(layer)
		orphans := orphanLayers(t, n.dataDir)
		if os.IsNotExist(err) && len(orphans) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v after the restart, the half-removed layer (%v) or layers no record names (%v) are still there:\n%s", harness.Timeout, err, orphans, n.Out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(n.Out.String(), "removed orphan layer") {
		t.Errorf("the daemon did not log the orphan's removal:\n%s", n.Out)
	}
	if r := n.cli(t, "alloc", "status", "big"); r.code == 0 {
		t.Errorf("the collected allocation is back after the restart:\n%s", r.stdout)
	}
}

// TestKillDuringChange kills the daemon with SIGKILL in the middle of
// each kind of change, held at one of its system calls by strace, and
// checks that the restarted daemon shows the change whole (the journal,
// synced or still in the page cache, is replayed) or not at all, never
// two allocations on one writable layer, and no orphan once its collector
// has run.
func TestKillDuringChange(t *testing.T) {
	if _, err := exec.LookPath("strace"); err != nil {
		fstest.Lacks(t, "strace is needed to hold the daemon at a system call (apt-get install strace)")
	}
	for _, c := range []struct {
		name    string
		setup   string   // allocfs commands, one per line
		change  []string // the allocfs command that is interrupted
		syscall string   // held on its first call after the change starts
		after   func(recs map[string]stateRecord) bool
	}{
		{"create held at the journal's fsync", "", []string{"alloc", "create", "n", "--task", "web"}, "fsync",
			func(r map[string]stateRecord) bool { _, ok := r["n"]; return ok }},
		{"create held at a layer's mkdir", "", []string{"alloc", "create", "n", "--task", "web"}, "mkdirat",
			func(r map[string]stateRecord) bool { _, ok := r["n"]; return ok }},
		{"adopt held at a state file's rename", "alloc create a --task web\nalloc stop a",
			[]string{"alloc", "create", "b", "--task", "web", "--previous", "a", "--migrate"}, "renameat2",
			func(r map[string]stateRecord) bool { return r["a"].MigratedTo == "b" }},
		{"snapshot held at the journal's fsync", "alloc create a --task web\nalloc stop a",
			[]string{"alloc", "create", "b", "--task", "web", "--previous", "a", "--migrate", "--migrate-mode", "snapshot"}, "fsync",
			func(r map[string]stateRecord) bool { return r["a"].MigratedTo == "b" }},
		{"destroy held at the journal's fsync", "alloc create a --task web", []string{"alloc", "destroy", "a"}, "fsync",
			func(r map[string]stateRecord) bool { _, ok := r["a"]; return !ok }},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := startNode(t)
			for _, line := range strings.Split(c.setup, "\n") {
				if line != "" {
					n.mustCLI(t, strings.Fields(line)...)
				}
			}
			before := readRecords(t, n.dataDir)
			// Hold the daemon's first such call for 30 s; it is killed
			// long before.
			trace := exec.Command("strace", "-f", "-qq", "-o", "/dev/null", "-p", strconv.Itoa(n.Pid()),
				"-e", "trace="+c.syscall, "-e", "inject="+c.syscall+":delay_enter=30000000:when=1")
			if err := trace.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { trace.Process.Kill(); trace.Wait() })
			time.Sleep(500 * time.Millisecond) // strace attaches to every thread
			change := exec.Command(harness.Binary(t), c.change...)
			change.Env = append(n.env(), "GORACE=atexit_sleep_ms=0 "+os.Getenv("GORACE"))
			if err := change.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			n.kill9(t)
			trace.Process.Kill()
			trace.Wait()
			change.Wait()

			n.Restart(t)
			recs := readRecords(t, n.dataDir)
			switch {
			case c.after(recs):
			case sameRecords(recs, before):
			default:
				t.Fatalf("after the kill the records are neither before nor after the change:\n%v\nbefore:\n%v", recs, before)
			}
			t.Logf("state after the kill: after=%v", c.after(recs))
			writable := map[string]string{}
			for id, r := range recs {
				for key, v := range r.Volumes {
					if v.ReadOnly {
						continue
					}
					if other, ok := writable[v.Upper]; ok {
						t.Errorf("layer %s is writable under %s and %s/%s", v.Upper, other, id, key)
					}
					writable[v.Upper] = id + "/" + key
				}
			}
			n.mustCLI(t, "gc")
			if orphans := orphanLayers(t, n.dataDir); len(orphans) > 0 {
				t.Errorf("layers no record names after the restart and a gc: %v", orphans)
			}
		})
	}
}

// stateRecord is the part of a state file the tests read.
type stateRecord struct {
	Volumes map[string]struct {
		Upper    string   `json:"upper"`
		Lowers   []string `json:"lowers"`
		ReadOnly bool     `json:"readonly"`
	} `json:"volumes"`
	MigratedTo string   `json:"migrated_to"`
	Retained   []string `json:"retained"`
}

// readRecords reads every state file of a data dir whose daemon is
// running (it checkpoints its journal when it starts).
func readRecords(t *testing.T, dataDir string) map[string]stateRecord {
	t.Helper()
	out := map[string]stateRecord{}
	files, err := filepath.Glob(filepath.Join(dataDir, "state", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var r stateRecord
		if err := json.Unmarshal(data, &r); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".json")] = r
	}
	return out
}

func sameRecords(a, b map[string]stateRecord) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

// volumeLayer returns the upper layer of an allocation's volume.
func volumeLayer(t *testing.T, dataDir, id, key string) string {
	t.Helper()
	r, ok := readRecords(t, dataDir)[id]
	if !ok {
		t.Fatalf("no record of %s", id)
	}
	return r.Volumes[key].Upper
}

// orphanLayers lists the layers no state file names.
func orphanLayers(t *testing.T, dataDir string) []string {
	t.Helper()
	used := map[string]bool{}
	for _, r := range readRecords(t, dataDir) {
		for _, v := range r.Volumes {
			used[v.Upper] = true
			for _, l := range v.Lowers {
				used[l] = true
			}
		}
		for _, l := range r.Retained {
			used[l] = true
		}
	}
	entries, err := os.ReadDir(filepath.Join(dataDir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !used[e.Name()] {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out
}

// TestKillMidChrootRemoval kills the daemon with SIGKILL in the middle of
// Nomad's removal of a chroot (unlinks of host entries, each recorded in
// the task layer's removal log, not a whiteout): the next daemon, taking
// the mount over, shows every entry unlinked before the kill still gone,
// the rest still there, each directory emptied so removable, and the
// allocation's removal takes all of it.
func TestKillMidChrootRemoval(t *testing.T) {
	host, err := os.MkdirTemp("", "allocfs-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(host) })
	var files []string
	for d := range 4 {
		for f := range 50 {
			rel := filepath.Join(fmt.Sprintf("d%d", d), fmt.Sprintf("f%02d", f))
			if err := os.MkdirAll(filepath.Join(host, filepath.Dir(rel)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(host, rel), []byte(rel), 0o644); err != nil {
				t.Fatal(err)
			}
			files = append(files, rel)
		}
	}
	n := startNodeWith(t, nil, "--chroot-env", host+"=/share")
	alloc := filepath.Join(n.mnt, "a1")
	box := filepath.Join(alloc, "box")
	for _, step := range []func() error{
		func() error { return os.Mkdir(alloc, 0o755) },
		func() error { return os.Mkdir(box, 0o777) },
		func() error { return os.Chown(box, 65534, 65534) },
		func() error { return os.Mkdir(filepath.Join(box, "local"), 0o777) },
		func() error { return os.Chown(box, 0, 0) }, // Nomad's chroot build starts
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	share := filepath.Join(box, "share")
	if _, err := os.Stat(filepath.Join(share, files[0])); err != nil {
		t.Fatalf("the chroot does not show the host's files: %v", err)
	}
	// d0/ whole and half of d1/, as os.RemoveAll goes, then the kill.
	gone := files[:75]
	for _, rel := range gone {
		if err := os.Remove(filepath.Join(share, rel)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Remove(filepath.Join(share, "d0")); err != nil {
		t.Fatal(err)
	}
	n.kill9(t)
	n.Restart(t)

	for _, rel := range append([]string{"d0"}, gone...) {
		if _, err := os.Lstat(filepath.Join(share, rel)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, removed before the kill, after the restart: %v", rel, err)
		}
	}
	for _, rel := range files[75:] {
		if b, err := os.ReadFile(filepath.Join(share, rel)); err != nil || string(b) != rel {
			t.Errorf("%s, never removed, after the restart: %q, %v", rel, b, err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(share, "d1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 25 {
		t.Errorf("d1/ after the restart lists %d entries, want 25", len(entries))
	}
	if err := os.RemoveAll(alloc); err != nil {
		t.Fatalf("Nomad's GC after the restart: %v", err)
	}
	if _, err := os.Lstat(alloc); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the allocation after its removal: %v", err)
	}
}
