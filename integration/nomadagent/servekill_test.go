package nomadagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lineTask numbers a line every 50 ms into alloc/data/lines, through a
// descriptor it keeps open across whatever happens to serve, into
// local/lines, opened again for each line, and to stdout, through
// logmon; it stops once alloc/data/stop exists, or after five minutes
// should the test be gone. A write that fails ends it with an error, so
// that Nomad reports it. Its sleep is busybox's applet, which runs
// /bin/sh, the chroot's, again from the mount: a node the kernel keeps
// across serve's restarts.
const lineTask = `exec 3>>"$NOMAD_ALLOC_DIR/data/lines" || exit 10
i=0
while [ ! -e "$NOMAD_ALLOC_DIR/data/stop" ] && [ $i -lt 6000 ]; do
  i=$((i+1))
  printf 'line %05d\n' $i >&3 || exit 11
  printf 'line %05d\n' $i >> "$NOMAD_TASK_DIR/lines" || exit 12
  printf 'line %05d\n' $i || exit 13
  sleep 0.05 || exit 14
done`

// numberedLines is what lineTask writes in n lines.
func numberedLines(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %05d\n", i)
	}
	return b.String()
}

// waitLines waits until rel inside alloc_dir holds at least min lines,
// and returns how many it holds.
func (n *node) waitLines(t *testing.T, rel string, min int) int {
	t.Helper()
	var got int
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		s, err := n.readFile(t, rel)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("read %s while the task writes: %v", rel, err)
		}
		if got = strings.Count(s, "\n"); got >= min {
			return got
		}
	}
	t.Fatalf("%s holds %d lines after a minute, want at least %d", rel, got, min)
	return 0
}

// waitServeLog waits until serve's log, across its restarts, says text
// at least count times.
func waitServeLog(t *testing.T, n *node, text string, count int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); strings.Count(n.serve.Out.String(), text) < count; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("serve's log says %q %d times, want %d:\n%s", text, strings.Count(n.serve.Out.String(), text), count, n.serve.Out)
		}
	}
}

// taskEvents is what the full allocation says of its task t: the list's
// stubs leave out the exit code.
type taskEvents struct {
	State    string
	Failed   bool
	Restarts int
	Events   []struct {
		Type, DisplayMessage string
		ExitCode             int
	}
}

// TestServeUpgradeAndKill: while an exec task writes a numbered line
// every 50 ms into alloc/data (through a descriptor it holds), into
// local/ (opening the file each time) and to stdout (through logmon,
// into alloc/logs), serve is upgraded (a second serve takes the live
// mount over) and then killed with SIGKILL and started again (the
// holder keeps the FUSE connection meanwhile). The task never notices:
// it ends with exit code 0, untouched by Nomad, every line is in both
// files once and in order, and the agent's logs API and `nomad alloc
// logs` show each once. On a plain alloc_dir there is no serve to
// upgrade or kill: the rest runs, and shows the checks hold where
// Nomad is at home.
func TestServeUpgradeAndKill(t *testing.T) {
	n := startNode(t, nodeOpts{drivers: []string{"exec"}})
	job := n.runJob(t, batchJob("lines", fmt.Sprintf(`
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", %q]
      }`, lineTask)))
	a := n.waitAlloc(t, job, nil, "running")
	n.stderrOnFailure(t, a.ID, "t")
	lines := a.ID + "/alloc/data/lines"
	count := n.waitLines(t, lines, 20)

	if n.serve == nil {
		t.Logf("alloc_dir is a plain directory: no serve to upgrade or kill")
	} else {
		takeovers := strings.Count(n.serve.Out.String(), "took the mount over")
		start := time.Now()
		if code := n.serve.Upgrade(t); code != 0 {
			t.Errorf("the serve that handed its mount over exited %d, want 0", code)
		}
		waitServeLog(t, n, "took the mount over", takeovers+1)
		t.Logf("upgraded in %v, at line %d", time.Since(start).Round(time.Millisecond), count)
		count = n.waitLines(t, lines, count+20)

		start = time.Now()
		n.serve.Signal(t, syscall.SIGKILL)
		// Dead for a moment, while the task's writes and logmon's wait
		// in the kernel's queue.
		time.Sleep(time.Second)
		n.serve.Restart(t)
		waitServeLog(t, n, "took the mount over", takeovers+2)
		t.Logf("killed and started again in %v, at line %d", time.Since(start).Round(time.Millisecond), count)
		count = n.waitLines(t, lines, count+20)
		// The task removes nothing: every node the kernel held across
		// both takeovers is still there to be found.
		if strings.Contains(n.serve.Out.String(), "from an earlier daemon cannot be found") {
			t.Errorf("a serve taking the mount over lost nodes the kernel held")
		}
	}

	if err := os.WriteFile(n.path(a.ID+"/alloc/data/stop"), nil, 0o644); err != nil {
		t.Fatalf("ask the task to stop: %v", err)
	}
	n.waitAlloc(t, job, nil, "complete")
	var full struct{ TaskStates map[string]taskEvents }
	n.mustDo(t, http.MethodGet, "/v1/allocation/"+a.ID, nil, &full)
	st := full.TaskStates["t"]
	if st.State != "dead" || st.Failed || st.Restarts != 0 {
		t.Errorf("the task: %s, failed %v, restarts %d; want dead, not failed, never restarted", st.State, st.Failed, st.Restarts)
	}
	terminated := 0
	for _, e := range st.Events {
		switch e.Type {
		case "Received", "Task Setup", "Started":
		case "Terminated":
			terminated++
			if e.ExitCode != 0 {
				t.Errorf("the task exited %d (%s), want 0", e.ExitCode, e.DisplayMessage)
			}
		default:
			t.Errorf("the task's event %q: %s", e.Type, e.DisplayMessage)
		}
	}
	if terminated != 1 {
		t.Errorf("the task terminated %d times, want once", terminated)
	}

	got, err := n.readFile(t, lines)
	if err != nil {
		t.Fatalf("read %s: %v", lines, err)
	}
	total := strings.Count(got, "\n")
	want := numberedLines(total)
	if total < count || got != want {
		t.Errorf("%s is not every line once and in order (%d lines, at least %d seen while it ran):\n%s", lines, total, count, firstLineDiff(got, want))
	}
	local, err := n.readFile(t, a.ID+"/t/local/lines")
	if err != nil || local != want {
		t.Errorf("t/local/lines (%v) is not what alloc/data/lines holds:\n%s", err, firstLineDiff(local, want))
	}
	if got := n.logs(t, a.ID, "t", "stdout", want); got != want {
		t.Errorf("stdout through /v1/client/fs/logs:\n%s", firstLineDiff(got, want))
	}
	if got := n.cli(t, "alloc", "logs", a.ID, "t"); got != want {
		t.Errorf("nomad alloc logs:\n%s", firstLineDiff(got, want))
	}
	if got, err := n.readFile(t, a.ID+"/alloc/logs/t.stdout.0"); err != nil || got != want {
		t.Errorf("alloc/logs/t.stdout.0 on alloc_dir (%v):\n%s", err, firstLineDiff(got, want))
	}
	t.Logf("%d lines", total)
}

// firstLineDiff describes where got first differs from want.
func firstLineDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range min(len(g), len(w)) {
		if g[i] != w[i] {
			return fmt.Sprintf("line %d: got %q, want %q (%d lines, want %d)", i+1, g[i], w[i], len(g)-1, len(w)-1)
		}
	}
	return fmt.Sprintf("%d lines, want %d", len(g)-1, len(w)-1)
}

// manyFiles is how many files TestManyFilesInAlloc's task makes.
const manyFiles = 10000

// TestManyFilesInAlloc: an exec task makes 10,000 small files in
// ${NOMAD_ALLOC_DIR}/many, the allocation's shared directory itself
// rather than one of its data/, logs/ or tmp/. Each is there through the
// mount and in the agent's listing of alloc/many; allocfs counts them
// in the usage of the allocation's alloc/ volume and holds them in that
// volume's upper layer. Stopped and collected, the allocation leaves no
// directory, record or layer.
//
// No disk limit is tried: allocfs enforces them with btrfs qgroups or
// with the project quotas of xfs and ext4, and the node's data dir here
// is a plain directory of the host's disk, where serve enforces none
// (an allocation that asks for one is refused); this machine's kernel
// has no project quotas at all (CONFIG_QFMT_V2 and CONFIG_XFS_QUOTA are
// off), so btrfs would be the only way. The usage checked is the one
// allocfs reports whatever the backing filesystem: the walk of the
// layers in GET /v1/allocs/{id}, and the quota's count where a limit
// happens to be enforced.
func TestManyFilesInAlloc(t *testing.T) {
	n := startNode(t, nodeOpts{drivers: []string{"exec"}})
	start := time.Now()
	job := n.runJob(t, batchJob("many", fmt.Sprintf(`
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "d=\"$NOMAD_ALLOC_DIR/many\"; mkdir \"$d\" || exit 10; i=0; while [ $i -lt %d ]; do i=$((i+1)); echo $i > \"$d/f$i\" || exit 11; done; echo made $i"]
      }`, manyFiles)))
	a := n.waitAlloc(t, job, nil, "complete")
	n.stderrOnFailure(t, a.ID, "t")
	t.Logf("the task made %d files and completed %v after its job was registered", manyFiles, time.Since(start).Round(time.Millisecond))
	n.logs(t, a.ID, "t", "stdout", fmt.Sprintf("made %d\n", manyFiles))

	var wantBytes int64
	for i := 1; i <= manyFiles; i++ {
		wantBytes += int64(len(strconv.Itoa(i)) + 1)
	}
	dir := a.ID + "/alloc/many"
	start = time.Now()
	entries, err := within(t, "readdir "+dir, func() ([]os.DirEntry, error) { return os.ReadDir(n.path(dir)) })
	if err != nil {
		t.Fatalf("readdir %s: %v", dir, err)
	}
	wantNames(t, "alloc/many through the mount", len(entries), func(i int) string { return entries[i].Name() })
	// In chunks, each bounded: a mount that hangs fails the test.
	for from := 1; from <= manyFiles; from += 1000 {
		_, err := within(t, fmt.Sprintf("read %s/f%d...", dir, from), func() (struct{}, error) {
			for i := from; i < from+1000 && i <= manyFiles; i++ {
				b, err := os.ReadFile(n.path(fmt.Sprintf("%s/f%d", dir, i)))
				if err != nil || string(b) != strconv.Itoa(i)+"\n" {
					return struct{}{}, fmt.Errorf("f%d: %q, %v", i, b, err)
				}
			}
			return struct{}{}, nil
		})
		if err != nil {
			t.Fatalf("%s through the mount: %v", dir, err)
		}
	}
	t.Logf("listed and read the %d files on alloc_dir in %v", manyFiles, time.Since(start).Round(time.Millisecond))

	var ls []struct {
		Name  string
		IsDir bool
		Size  int64
	}
	n.mustDo(t, http.MethodGet, "/v1/client/fs/ls/"+a.ID+"?path=/alloc/many", nil, &ls)
	wantNames(t, "the agent's /v1/client/fs/ls of alloc/many", len(ls), func(i int) string { return ls[i].Name })
	var listed int64
	for _, e := range ls {
		listed += e.Size
	}
	if listed != wantBytes {
		t.Errorf("the agent lists %d bytes in alloc/many, want %d", listed, wantBytes)
	}
	if names := n.quietCLI(t, "alloc", "fs", a.ID, "alloc/many"); names != manyFiles {
		t.Errorf("nomad alloc fs %s alloc/many lists %d files, want %d", a.ID, names, manyFiles)
	}
	if got := n.cli(t, "alloc", "fs", a.ID, fmt.Sprintf("alloc/many/f%d", manyFiles)); got != fmt.Sprintf("%d\n", manyFiles) {
		t.Errorf("nomad alloc fs of alloc/many/f%d: %q", manyFiles, got)
	}

	var layers []string
	if n.serve != nil {
		layers = n.checkUsage(t, a.ID, wantBytes)
	}

	n.mustDo(t, http.MethodDelete, "/v1/job/"+job, nil, nil)
	n.waitAlloc(t, job, nil, "complete")
	n.collect(t, a.ID)
	if n.serve == nil {
		return
	}
	// The store removes a collected allocation's layers after its record,
	// and 10,000 files take a moment.
	var left []string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		left = left[:0]
		for _, p := range append(layers, filepath.Join(n.serve.DataDir, "state", a.ID+".json")) {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
	}
	t.Errorf("left in the store a minute after the GC: %v", left)
}

// wantNames fails the test unless the count names name(i) gives are f1
// to f<manyFiles>, each once.
func wantNames(t *testing.T, what string, count int, name func(i int) string) {
	t.Helper()
	seen := make(map[string]bool, count)
	for i := range count {
		seen[name(i)] = true
	}
	missing := 0
	for i := 1; i <= manyFiles; i++ {
		if !seen[fmt.Sprintf("f%d", i)] {
			missing++
		}
	}
	if count != manyFiles || len(seen) != manyFiles || missing != 0 {
		t.Errorf("%s: %d entries, %d distinct, %d of f1..f%d missing", what, count, len(seen), missing, manyFiles)
	}
}

// quietCLI runs the Nomad CLI against the agent, like cli, without
// logging what it printed (a listing of 10,000 names), and returns how
// many of its lines name a file f<number>.
func (n *node) quietCLI(t *testing.T, args ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.nomad, args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+n.addr)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nomad %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	files := 0
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			if num, ok := strings.CutPrefix(f[len(f)-1], "f"); ok {
				if _, err := strconv.Atoi(num); err == nil {
					files++
				}
			}
		}
	}
	return files
}

// checkUsage checks that allocfs counts the task's files in allocation
// id's alloc/ volume, and returns the paths of every layer of the
// allocation in the store.
func (n *node) checkUsage(t *testing.T, id string, wantBytes int64) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	c := n.store()
	defer c.Close()
	st, err := c.AllocStatus(ctx, id)
	if err != nil {
		t.Fatalf("allocfs's status of %s: %v", id, err)
	}
	u, ok := st.Layers["alloc"]
	if !ok {
		t.Fatalf("allocfs's status of %s has no alloc/ volume: %+v", id, st.Layers)
	}
	// At least: Nomad and its drivers may keep files of their own in
	// alloc/.
	if u.Files < manyFiles || u.Bytes < wantBytes {
		t.Errorf("allocfs counts %d files, %d bytes in %s's alloc/, want at least %d, %d", u.Files, u.Bytes, id, manyFiles, wantBytes)
	}
	layers := filepath.Join(n.serve.DataDir, "layers")
	if on, err := os.ReadDir(filepath.Join(layers, u.Upper, "many")); err != nil || len(on) != manyFiles {
		t.Errorf("alloc/'s upper layer %s holds %d files in many/ (%v), want %d", u.Upper, len(on), err, manyFiles)
	}
	if st.Disk != nil && (st.Disk.UsedBytes < wantBytes || (st.Disk.LimitInodes > 0 && st.Disk.UsedInodes < manyFiles)) {
		t.Errorf("the disk limit of %s counts %d bytes, %d inodes, want at least %d, %d", id, st.Disk.UsedBytes, st.Disk.UsedInodes, wantBytes, manyFiles)
	}
	node, err := c.NodeStatus(ctx)
	if err != nil {
		t.Fatalf("allocfs's node status: %v", err)
	}
	t.Logf("alloc/ holds %d files, %d bytes; disk limits enforced: %v (%s)", u.Files, u.Bytes, node.Quota.Enforced, node.Quota.Why)
	var paths []string
	for _, l := range st.Layers {
		for _, layer := range append([]string{l.Upper}, l.Lowers...) {
			paths = append(paths, filepath.Join(layers, layer))
		}
	}
	return paths
}
