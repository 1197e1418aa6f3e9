package integration

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"github.com/allocfs/allocfs/integration/nomadreplay"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// The tasks of the replayed allocation: one per isolation mode.
var replayTasks = []struct {
	name string
	mode nomadreplay.Isolation
}{
	{"web", nomadreplay.None},
	{"box", nomadreplay.Chroot},
	{"ctr", nomadreplay.Image},
	{"ex2", nomadreplay.Unveil},
}

func replayTaskNames() []string {
	var names []string
	for _, k := range replayTasks {
		names = append(names, k.name)
	}
	return names
}

// nomadID is a random allocation ID of Nomad's shape (a UUID).
func nomadID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// replayChrootEnv is a chroot_env small enough to embed in a test and
// whole enough to run a shell in: the host's /etc, its binaries at /bin
// and the loader and libc where the binaries look for them.
func replayChrootEnv(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{"/etc": "/etc", "/usr/bin": "/bin"}
	found := false
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu"} {
		if _, err := os.Stat(filepath.Join(d, "libc.so.6")); err == nil {
			env[d] = strings.TrimPrefix(d, "/usr")
			found = true
		}
	}
	if _, err := os.Stat("/usr/lib64"); err == nil {
		env["/usr/lib64"] = "/lib64"
	}
	if !found {
		fstest.Lacks(t, "no multiarch libc directory (/usr/lib/<triplet>-linux-gnu) to build the test's chroot from")
	}
	return env
}

// detachBelow detaches every mount below (not at) each of dirs, deepest
// first: what a failed replay leaves must not outlive the test.
func detachBelow(t *testing.T, dirs ...string) {
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Errorf("read mountinfo: %v", err)
		return
	}
	var below []string
	for _, m := range mounts {
		for _, d := range dirs {
			if d != "" && strings.HasPrefix(m.MountPoint, d+"/") {
				below = append(below, m.MountPoint)
			}
		}
	}
	sort.Slice(below, func(i, j int) bool { return len(below[i]) > len(below[j]) })
	for _, p := range below {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("detach %s: %v", p, err)
		}
	}
}

// mountsBelow counts the mounts below dir.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Fatal(err)
	}
	var below []string
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, dir+"/") {
			below = append(below, m.MountPoint)
		}
	}
	return below
}

// replay is one run of Nomad's life of an allocation against one
// alloc_dir.
type replay struct {
	t   *testing.T
	c   *nomadreplay.Client
	id  string
	run *running
	// rootfs is where the image driver binds the allocation's
	// directories, outside alloc_dir.
	rootfs string
}

// running is what the allocation's tasks hold while it runs.
type running struct {
	logs    map[string]*nomadreplay.Logmon
	sockets []*nomadreplay.Socket
	// socketPaths name the sockets; lines counts what each task wrote.
	socketPaths []string
	lines       map[string]int
	secret      *os.File // a descriptor held open in secrets/
}

func newReplay(t *testing.T, allocDir string, env map[string]string) *replay {
	t.Helper()
	top, err := os.MkdirTemp("", "allocfs-nomad-")
	if err != nil {
		t.Fatal(err)
	}
	top, _ = filepath.EvalSymlinks(top)
	r := &replay{
		t: t,
		c: &nomadreplay.Client{
			AllocDir:  allocDir,
			MountsDir: filepath.Join(top, "mounts"),
			ChrootEnv: env,
			Logf:      t.Logf,
		},
		rootfs: filepath.Join(top, "rootfs"),
	}
	// Registered before the daemon is started, so it runs after the
	// replay's mounts are detached and the daemon is gone.
	t.Cleanup(func() {
		if err := os.RemoveAll(top); err != nil {
			t.Errorf("remove %s: %v", top, err)
		}
	})
	return r
}

// cleanupMounts detaches whatever the replay left mounted; it is
// registered after the daemon, so that it runs first.
func (r *replay) cleanupMounts() {
	r.t.Cleanup(func() {
		if r.run != nil {
			r.stopTasks()
		}
		detachBelow(r.t, r.c.AllocDir, r.c.MountsDir, r.rootfs)
	})
}

func (r *replay) must(err error, what string) {
	r.t.Helper()
	if err != nil {
		r.t.Fatalf("%s: %v", what, err)
	}
}

// start builds allocation id as Nomad does, each task in its isolation
// mode, then runs the tasks: logs through logmon's FIFOs, sockets in
// alloc/tmp and secrets/, a template, an artifact, a secret, data.
// It returns what the chroot embed did.
func (r *replay) start(id string) nomadreplay.EmbedStats {
	t := r.t
	t.Helper()
	r.id = id
	r.must(r.c.Start(), "agent start")
	r.must(r.c.Build(id), "Build")
	var embed nomadreplay.EmbedStats
	for _, k := range replayTasks {
		st, err := r.c.BuildTask(id, k.name, k.mode, 1000)
		r.must(err, "BuildTask "+k.name)
		if k.mode == nomadreplay.Chroot {
			embed = st
		}
	}
	// An agent restart runs Build again, and each task's secrets step.
	r.must(r.c.Build(id), "Build after an agent restart")
	for _, k := range replayTasks {
		r.must(r.c.MakeSecretsDirs(id, k.name), "secrets of "+k.name+" after an agent restart")
	}
	dir := r.c.Dir(id)
	for _, k := range replayTasks {
		if got := len(mountsAt(t, filepath.Join(dir, k.name, "secrets"))); got != 1 {
			t.Errorf("%s/secrets: %d mounts after two builds, want the one tmpfs", k.name, got)
		}
	}

	run := &running{logs: map[string]*nomadreplay.Logmon{}, lines: map[string]int{}}
	r.run = run
	for _, k := range replayTasks {
		l, err := r.c.Logmon(id, k.name, 2048, 3)
		r.must(err, "logmon of "+k.name)
		run.logs[k.name] = l
	}
	for _, p := range []string{filepath.Join(dir, "alloc/tmp/consul_grpc.sock"), filepath.Join(dir, "web/secrets/api.sock")} {
		s, err := nomadreplay.Listen(p, filepath.Base(p))
		r.must(err, "listen on "+p)
		run.sockets = append(run.sockets, s)
		run.socketPaths = append(run.socketPaths, p)
	}
	r.must(r.c.Template(id, "web", "local/config.txt", "port = 8080\n"), "template")
	var art bytes.Buffer
	tw := tar.NewWriter(&art)
	for name, body := range map[string]string{"bin/app": "#!/bin/sh\necho app\n", "README": "an artifact\n"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	r.must(r.c.Artifact(id, "web", "app", &art), "artifact")
	r.must(os.WriteFile(filepath.Join(dir, "web/secrets/vault_token"), []byte("s.vault\n"), 0o600), "secret")
	r.must(os.WriteFile(filepath.Join(dir, "web/private/nomad_token"), []byte("s.nomad\n"), 0o600), "private")
	f, err := os.OpenFile(filepath.Join(dir, "web/secrets/held"), os.O_RDWR|os.O_CREATE, 0o600)
	r.must(err, "open in secrets/")
	run.secret = f
	r.must(os.WriteFile(filepath.Join(dir, "alloc/data/state.txt"), []byte("state 1\n"), 0o644), "data")
	for _, k := range replayTasks {
		r.must(os.WriteFile(filepath.Join(dir, k.name, "local/mine"), []byte(k.name+"\n"), 0o644), "local of "+k.name)
	}
	r.runChroot()
	r.runImage()
	// A restart of the chroot task builds its directory again: every
	// file of the embed is found where it is, nothing linked or copied,
	// and what the task wrote stays.
	again, err := r.c.BuildTask(id, "box", nomadreplay.Chroot, 1000)
	r.must(err, "BuildTask of the restarted chroot task")
	if again.Linked != 0 || again.Copied != 0 || again.Skipped != embed.Linked+embed.Copied+embed.Skipped+embed.Symlinks {
		t.Errorf("the chroot build of a restarted task: %+v, want every file skipped (%+v the first time)", again, embed)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "box/local/out")); err != nil || string(b) != "from-chroot\n" {
		t.Errorf("the chroot task's local/ after its restart: %q, %v", b, err)
	}
	return embed
}

// runChroot runs a shell chrooted in the chroot task's directory, in a
// mount namespace of its own with proc mounted, as Nomad's executor
// does; it reads the host's /etc and the shared data and writes local/.
func (r *replay) runChroot() {
	t := r.t
	t.Helper()
	if _, err := exec.LookPath("unshare"); err != nil {
		fstest.Lacks(t, "unshare (util-linux) runs the chroot task in a namespace of its own: %v", err)
	}
	box := filepath.Join(r.c.Dir(r.id), "box")
	for _, d := range []string{"dev", "proc", "sys"} {
		r.must(os.MkdirAll(filepath.Join(box, d), 0o755), "the executor's "+d)
	}
	r.must(os.WriteFile(filepath.Join(box, "executor.out"), []byte("started\n"), 0o644), "executor.out")
	r.must(os.WriteFile(filepath.Join(box, "resolv.conf"), []byte("nameserver 127.0.0.1\n"), 0o644), "resolv.conf")
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "--fork", "sh", "-c",
		`mount -t proc proc "$1/proc" && exec chroot "$1" /bin/sh -c 'head -1 /etc/passwd; cat /alloc/data/state.txt; ls -a /alloc/logs | grep -c fifo; echo from-chroot > /local/out; id -u'`,
		"sh", box)
	res := harness.Run(t, cmd, "a shell chrooted in the chroot task's directory")
	host, _ := os.ReadFile("/etc/passwd")
	first, _, _ := strings.Cut(string(host), "\n")
	want := first + "\nstate 1\n8\n0\n"
	if res.Code != 0 || res.Stdout != want {
		t.Errorf("the chroot task: exit %d, printed %q, want %q\n%s", res.Code, res.Stdout, want, res.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(box, "local/out")); err != nil || string(b) != "from-chroot\n" {
		t.Errorf("what the chroot task wrote in local/: %q, %v", b, err)
	}
}

// runImage binds alloc/, local/ and secrets/ into a root outside
// alloc_dir, as docker does, and writes through the binds.
func (r *replay) runImage() {
	t := r.t
	t.Helper()
	dir := r.c.Dir(r.id)
	for src, dst := range map[string]string{"alloc": "alloc", "ctr/local": "local", "ctr/secrets": "secrets"} {
		p := filepath.Join(r.rootfs, dst)
		r.must(os.MkdirAll(p, 0o755), "the container's "+dst)
		r.must(unix.Mount(filepath.Join(dir, src), p, "", unix.MS_BIND, ""), "bind "+src+" into the container")
	}
	r.must(os.WriteFile(filepath.Join(r.rootfs, "local/from-container"), []byte("ctr\n"), 0o644), "write through the container's local/")
	r.must(os.WriteFile(filepath.Join(r.rootfs, "secrets/token"), []byte("ctr-secret\n"), 0o600), "write through the container's secrets/")
}

// check sees that everything the running allocation holds works: the
// tasks' logs reach the rotating files through the FIFOs, the sockets
// answer, the secrets and the descriptor held on one are there, the
// binds of every isolation mode show the allocation.
func (r *replay) check(when string) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(when+": "+format, args...)) }
	dir := r.c.Dir(r.id)
	run := r.run
	for _, k := range replayTasks {
		l := run.logs[k.name]
		for i := 0; i < 40; i++ {
			run.lines[k.name]++
			line := fmt.Sprintf("%s line %05d %s\n", k.name, run.lines[k.name], strings.Repeat("x", 80))
			if _, err := l.Stdout.WriteString(line); err != nil {
				fail("%s writes stdout: %v", k.name, err)
			}
			if _, err := l.Stderr.WriteString(line); err != nil {
				fail("%s writes stderr: %v", k.name, err)
			}
		}
	}
	for _, k := range replayTasks {
		want := fmt.Sprintf("%s line %05d ", k.name, run.lines[k.name])
		found := false
		for deadline := time.Now().Add(10 * time.Second); !found && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			found = strings.Contains(lastLog(filepath.Join(dir, "alloc/logs"), k.name+".stderr"), want)
		}
		if !found {
			fail("%s's last stderr line never reached alloc/logs", k.name)
		}
	}
	for i, p := range run.socketPaths {
		c, err := net.DialTimeout("unix", p, 5*time.Second)
		if err != nil {
			fail("connect to %s: %v", p, err)
			continue
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		word, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if err != nil || word != filepath.Base(run.socketPaths[i])+"\n" {
			fail("%s answered %q, %v", p, word, err)
		}
	}
	for p, want := range map[string]string{
		"web/secrets/vault_token":  "s.vault\n",
		"web/private/nomad_token":  "s.nomad\n",
		"web/local/config.txt":     "port = 8080\n",
		"web/local/app/README":     "an artifact\n",
		"ctr/local/from-container": "ctr\n",
		"ctr/secrets/token":        "ctr-secret\n",
		"box/alloc/data/state.txt": "state 1\n",
		"box/executor.out":         "started\n",
		"box/local/out":            "from-chroot\n",
	} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			fail("%s: %q, %v; want %q", p, b, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(r.rootfs, "alloc/data/state.txt")); err != nil || string(b) != "state 1\n" {
		fail("alloc/data through the container's bind: %q, %v", b, err)
	}
	ex2 := filepath.Join(r.c.MountsDir, r.id+"-ex2")
	for _, p := range []string{"alloc/data/state.txt", "local/mine", "secrets/.nomad-mount"} {
		if _, err := os.Stat(filepath.Join(ex2, p)); err != nil {
			fail("exec2's binds: %v", err)
		}
	}
	if _, err := run.secret.WriteAt([]byte(when), 0); err != nil {
		fail("write to the descriptor held in secrets/: %v", err)
	}
	buf := make([]byte, len(when))
	if _, err := run.secret.ReadAt(buf, 0); err != nil || string(buf) != when {
		fail("read from the descriptor held in secrets/: %q, %v", buf, err)
	}
	return errors.Join(errs...)
}

// lastLog is the content of the file of base with the highest index in
// logs.
func lastLog(logs, base string) string {
	entries, _ := os.ReadDir(logs)
	best, name := -1, ""
	for _, e := range entries {
		var n int
		if rest, ok := strings.CutPrefix(e.Name(), base+"."); ok {
			if _, err := fmt.Sscanf(rest, "%d", &n); err == nil && n > best {
				best, name = n, e.Name()
			}
		}
	}
	if name == "" {
		return ""
	}
	b, _ := os.ReadFile(filepath.Join(logs, name))
	return string(b)
}

// stopTasks ends the tasks: the collectors drain and close, the sockets
// close. The allocation's directories stay, as Nomad leaves them.
func (r *replay) stopTasks() {
	t := r.t
	t.Helper()
	run := r.run
	r.run = nil
	for _, name := range replayTaskNames() {
		if l := run.logs[name]; l != nil {
			if err := l.Close(); err != nil {
				t.Errorf("logmon of %s: %v", name, err)
			}
		}
	}
	for _, s := range run.sockets {
		if err := s.Close(); err != nil {
			t.Errorf("close a socket: %v", err)
		}
	}
	if run.secret != nil {
		run.secret.Close()
	}
	// The container stops: docker's binds go with it.
	detachBelow(t, r.rootfs)
}

// checkMoved says whether next has the data prev wrote and prev has
// none left, as after Nomad's Move.
func checkMoved(c *nomadreplay.Client, prev, next string, want map[string]string) error {
	var errs []error
	for p, body := range want {
		if b, err := os.ReadFile(filepath.Join(c.Dir(next), p)); err != nil || string(b) != body {
			errs = append(errs, fmt.Errorf("%s of the new allocation: %q, %v; want %q moved from the previous one", p, b, err, body))
		}
	}
	for p := range want {
		vol := "alloc/data"
		if !strings.HasPrefix(p, "alloc/") {
			vol = strings.SplitN(p, "/", 3)[0] + "/local"
		}
		if _, err := os.Lstat(filepath.Join(c.Dir(prev), vol)); !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("the previous allocation still shows %s (%v)", vol, err))
		}
	}
	return errors.Join(errs...)
}

// mountsAt lists the mounts at exactly dir.
func mountsAt(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, m := range mounts {
		if m.MountPoint == dir {
			types = append(types, m.FSType)
		}
	}
	return types
}

// replayHooks are what a run on allocfs adds: restarts, and a look
// through allocfs's own status, metrics and client API.
type replayHooks struct {
	n *metricsNode
}

// TestNomadReplay runs Nomad's client's life of an allocation, step by
// step as nomadreplay replays it, against a plain ext4 directory and
// against the allocfs mount: Build, a task per isolation mode (raw_exec,
// exec's chroot, docker's binds, exec2's binds), secrets tmpfs, logmon's
// FIFOs and rotation, sockets, a template, an artifact, an agent
// restart; on allocfs a serve upgrade and a kill -9 while all of it is
// in place; the seed's scenario (a sticky+migrate group replaced on the
// node: the data moves, the previous allocation's stderr log stays
// readable); a remote migration through a directory named with the
// previous allocation's ID; and the client GC's Destroy. Both must give
// the same answers; allocfs must also embed the chroot copying nothing.
func TestNomadReplay(t *testing.T) {
	fstest.RequireFUSE(t)
	env := replayChrootEnv(t)
	t.Run("ext4", func(t *testing.T) {
		top, err := os.MkdirTemp("", "allocfs-nomad-ext4-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(top) })
		top, _ = filepath.EvalSymlinks(top)
		r := newReplay(t, filepath.Join(top, "alloc"), env)
		r.cleanupMounts()
		r.scenario(nil)
	})
	t.Run("allocfs", func(t *testing.T) {
		r := newReplay(t, "", env)
		n := startNodeWith(t, nil, "--chroot-env", harness.ChrootEnvFlag(env), "--metrics-usage-interval", "100ms")
		r.c.AllocDir = n.mnt
		r.cleanupMounts()
		sock := n.socket
		client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}}
		t.Cleanup(client.CloseIdleConnections)
		r.scenario(&replayHooks{n: &metricsNode{&fsNode{node: n, socket: client}}})
	})
}

func (r *replay) scenario(h *replayHooks) {
	t := r.t
	a := nomadID()
	embed := r.start(a)
	t.Logf("the chroot embed: %+v", embed)
	if embed.Dirs == 0 || embed.Linked+embed.Copied+embed.Skipped == 0 {
		t.Errorf("the chroot embed did nothing: %+v", embed)
	}
	if h != nil && (embed.Copied != 0 || embed.CopiedBytes != 0) {
		t.Errorf("on allocfs the chroot embed copied %d files, %d bytes; want none", embed.Copied, embed.CopiedBytes)
	}
	if err := r.check("running"); err != nil {
		t.Fatal(err)
	}
	if h != nil {
		h.statusAndMetrics(t, a)
		// An upgrade, then a crash, with the tmpfs, binds, FIFOs and
		// sockets in place.
		n := h.n.node
		old := n.Daemon
		n.Daemon = harness.StartDaemon(t, &harness.Daemon{DataDir: n.dataDir, Mount: n.mnt, Socket: n.socket, Args: old.Args})
		if code := old.Wait(t); code != 0 {
			t.Errorf("the daemon that handed over exited %d:\n%s", code, old.Out)
		}
		waitLog(t, n.Daemon, "took the mount over")
		if err := r.check("after a serve upgrade"); err != nil {
			t.Error(err)
		}
		n.kill9(t)
		n.Restart(t)
		waitLog(t, n.Daemon, "took the mount over")
		if err := r.check("after kill -9 and serve"); err != nil {
			t.Error(err)
		}
		h.statusAndMetrics(t, a)
	}
	if rot := rotations(r.run); rot == 0 {
		t.Errorf("logmon never rotated a file")
	}
	stderr := lastLog(filepath.Join(r.c.Dir(a), "alloc/logs"), "web.stderr")
	r.stopTasks()

	// The seed's scenario: the group is replaced on the node and its
	// sticky, migrating disk moves.
	b := nomadID()
	r.must(r.c.Build(b), "Build of the replacement")
	r.must(r.c.Move(a, b, replayTaskNames()), "Move")
	want := map[string]string{"alloc/data/state.txt": "state 1\n", "web/local/config.txt": "port = 8080\n", "box/local/out": "from-chroot\n", "ctr/local/from-container": "ctr\n"}
	if err := checkMoved(r.c, a, b, want); err != nil {
		t.Error(err)
	}
	for _, k := range replayTasks {
		_, err := r.c.BuildTask(b, k.name, k.mode, 1000)
		r.must(err, "BuildTask "+k.name+" of the replacement")
	}
	if b, err := os.ReadFile(filepath.Join(r.c.Dir(b), "web/local/mine")); err != nil || string(b) != "web\n" {
		t.Errorf("web/local/mine after BuildTask of the replacement: %q, %v", b, err)
	}
	if got := lastLog(filepath.Join(r.c.Dir(a), "alloc/logs"), "web.stderr"); got != stderr || got == "" {
		t.Errorf("the previous allocation's stderr log after the Move: %d bytes, want the %d it had", len(got), len(stderr))
	}
	if h != nil {
		h.logsAPI(t, a, stderr)
	}

	// A remote migration: the previous node's snapshot lands in a
	// directory named with the previous allocation's ID, then moves.
	src := t.TempDir()
	for p, body := range map[string]string{"alloc/data/db/one": strings.Repeat("1", 3000), "alloc/data/two": "two\n", "web/local/remote": "remote\n"} {
		os.MkdirAll(filepath.Join(src, filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(src, p), []byte(body), 0o640)
	}
	os.Symlink("two", filepath.Join(src, "alloc/data/link"))
	unix.Mkfifo(filepath.Join(src, "alloc/data/fifo"), 0o600)
	var snap bytes.Buffer
	r.must(nomadreplay.Snapshot(&snap, src, []string{"web"}), "snapshot on the previous node")
	prev, c := nomadID(), nomadID()
	r.must(r.c.Receive(prev, &snap), "receive the snapshot")
	r.must(r.c.Build(c), "Build of the remote replacement")
	r.must(r.c.Move(prev, c, []string{"web"}), "Move of the received snapshot")
	r.destroy(prev, []string{"web"})
	if err := checkMoved(r.c, prev, c, map[string]string{"alloc/data/db/one": strings.Repeat("1", 3000), "alloc/data/two": "two\n", "alloc/data/link": "two\n", "web/local/remote": "remote\n"}); err != nil {
		t.Error(err)
	}
	if _, err := os.Lstat(r.c.Dir(prev)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the received snapshot's directory after Destroy: %v", err)
	}

	// The client GC.
	r.destroy(a, replayTaskNames())
	r.destroy(b, replayTaskNames())
	r.destroy(c, []string{"web"})
	if left := mountsBelow(t, r.c.AllocDir); len(left) != 0 {
		t.Errorf("mounts left below alloc_dir after every Destroy: %v", left)
	}
	if entries, err := os.ReadDir(r.c.AllocDir); err != nil || len(entries) != 0 {
		t.Errorf("alloc_dir after every Destroy: %v, %v", entries, err)
	}
	if h != nil {
		if res := h.n.cli(t, "alloc", "status", a); res.code == 0 {
			t.Errorf("allocfs alloc status of a destroyed allocation exits 0:\n%s", res.stdout)
		}
	}
}

// destroy is the client GC's Destroy of id. Nomad's own Destroy reports
// an error for an exec2 task on any filesystem (it removes the task's
// alloc/ before it detaches the bind on it) and goes on: what counts is
// that the directory and its mounts are gone.
func (r *replay) destroy(id string, tasks []string) {
	t := r.t
	t.Helper()
	if err := r.c.Destroy(id, tasks); err != nil {
		t.Logf("Nomad's Destroy of %s reports: %v", id, err)
	}
	if _, err := os.Lstat(r.c.Dir(id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Destroy: %v", id, err)
	}
	if left := mountsBelow(t, r.c.Dir(id)); len(left) != 0 {
		t.Errorf("mounts left below %s after Destroy: %v", id, left)
	}
}

func rotations(run *running) int64 {
	var n int64
	for _, l := range run.logs {
		n += l.Rotations()
	}
	return n
}

// statusAndMetrics: allocfs's own status and metrics show the
// allocation Nomad made through the mount.
func (h *replayHooks) statusAndMetrics(t *testing.T, id string) {
	t.Helper()
	out := h.n.mustCLI(t, "alloc", "status", id)
	for _, want := range []string{id, "Nomad's client", "web", "box", "ctr", "ex2"} {
		if !strings.Contains(out, want) {
			t.Errorf("allocfs alloc status %s does not say %q:\n%s", id, want, out)
		}
	}
	h.n.waitFor(t, "the replayed allocation's series", func(s scrapeOf) bool {
		return s.value("allocfs_alloc_status", map[string]string{"alloc_id": id, "status": "running"}) == 1 &&
			s.value("allocfs_alloc_bytes", map[string]string{"alloc_id": id, "volume": "alloc/data", "layer": "upper"}) >= float64(len("state 1\n"))
	})
}

// logsAPI: the previous allocation's stderr log, after the Move, through
// Nomad's /v1/client/fs/logs.
func (h *replayHooks) logsAPI(t *testing.T, id, want string) {
	t.Helper()
	a := h.n.get(t, false, "/v1/client/fs/logs/"+id+"?task=web&type=stderr&plain=true&origin=end&offset="+fmt.Sprint(len(want)), nil)
	if a.code != http.StatusOK || a.body != want {
		t.Errorf("the previous allocation's stderr through /v1/client/fs/logs: %d, %d bytes %q; want the end of its last file", a.code, len(a.body), firstLine(a.body))
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// TestNomadReplayNoticesALostMove shows the replay fails where it should:
// with the remap replaced by a refused rename (EXDEV, what a plain FUSE
// alloc_dir answers), Nomad's fallback rebuilds the new allocation empty,
// and the replay reports the data lost.
func TestNomadReplayNoticesALostMove(t *testing.T) {
	fstest.RequireFUSE(t)
	r := newReplay(t, "", nil)
	n := startNode(t)
	r.c.AllocDir = n.mnt
	r.cleanupMounts()
	r.c.Rename = func(oldpath, newpath string) error {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: unix.EXDEV}
	}
	a, b := nomadID(), nomadID()
	r.must(r.c.Start(), "agent start")
	r.must(r.c.Build(a), "Build")
	_, err := r.c.BuildTask(a, "web", nomadreplay.None, 1000)
	r.must(err, "BuildTask")
	r.must(os.WriteFile(filepath.Join(r.c.Dir(a), "alloc/data/state.txt"), []byte("state 1\n"), 0o644), "data")
	r.must(r.c.Build(b), "Build of the replacement")
	err = r.c.Move(a, b, []string{"web"})
	if !errors.Is(err, nomadreplay.ErrMigrationLost) {
		t.Errorf("Move with a refused rename: %v, want the data lost", err)
	}
	if err := checkMoved(r.c, a, b, map[string]string{"alloc/data/state.txt": "state 1\n"}); err == nil {
		t.Errorf("the replay's check passes a Move whose rename was refused")
	} else {
		t.Logf("as it should, the replay says: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(r.c.Dir(a), "alloc/data/state.txt")); err != nil || string(b) != "state 1\n" {
		t.Errorf("the previous allocation's data after the refused rename: %q, %v", b, err)
	}
	if entries, err := os.ReadDir(filepath.Join(r.c.Dir(b), "alloc/data")); err != nil || len(entries) != 0 || !slices.Equal(mountsBelow(t, r.c.Dir(b)), nil) {
		t.Errorf("the rebuilt replacement: %v, %v", entries, err)
	}
	r.destroy(a, []string{"web"})
	r.destroy(b, []string{"web"})
}
