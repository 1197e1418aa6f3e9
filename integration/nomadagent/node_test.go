package nomadagent

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/integration/harness"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// opTimeout bounds one file operation on alloc_dir: a daemon that died
// under the mount must fail the test, not hang it.
const opTimeout = 20 * time.Second

// allocTimeout bounds how long an allocation may take to reach the state
// a test waits for; a chroot task's first start embeds its chroot_env.
const allocTimeout = 2 * time.Minute

// onMount reports whether alloc_dir is an allocfs mount (the default) or a
// plain directory (ALLOCFS_NOMAD_BACKEND=plain), which shows that a test
// can pass where Nomad is at home.
func onMount() bool { return os.Getenv("ALLOCFS_NOMAD_BACKEND") != "plain" }

// requireAgentTests skips unless the real agent's tests were asked for:
// they take minutes and need the agent binary, so `make test` leaves them
// to `make test-nomad`.
func requireAgentTests(t *testing.T) {
	t.Helper()
	if os.Getenv("ALLOCFS_NOMAD_TESTS") != "1" {
		t.Skip("the real Nomad agent's tests run with ALLOCFS_NOMAD_TESTS=1 (make test-nomad)")
	}
	if onMount() {
		fstest.RequireFUSE(t)
	} else if os.Geteuid() != 0 {
		fstest.Lacks(t, "Nomad's client runs chroot tasks and mounts secrets/ as root only, euid is %d", os.Geteuid())
	}
}

// nomadBinary is $NOMAD_BIN, else the agent kept beside the repository
// (<repo>/../shared/tools/nomad/nomad), where CI's clone finds it too.
func nomadBinary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("NOMAD_BIN")
	if p == "" {
		// The test runs in its package's directory, two below the root.
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			t.Fatalf("the repository's root: %v", err)
		}
		p = filepath.Join(root, "..", "shared", "tools", "nomad", "nomad")
	}
	if fi, err := os.Stat(p); err != nil || fi.Mode()&0o111 == 0 {
		fstest.Lacks(t, "no Nomad agent at %s (set NOMAD_BIN): %v", p, err)
	}
	return p
}

// staticBusybox is the host's busybox, which must be statically linked
// (Debian's busybox-static): it is the one file of the exec tasks' chroot
// and of the docker image, with nothing to load it.
func staticBusybox(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("busybox")
	if err == nil {
		p, err = filepath.EvalSymlinks(p)
	}
	if err != nil {
		fstest.Lacks(t, "busybox (apt-get install busybox-static): %v", err)
	}
	f, err := elf.Open(p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			fstest.Lacks(t, "%s is dynamically linked: install busybox-static", p)
		}
	}
	return p
}

// shellChrootEnv is the small chroot_env of the tests' exec tasks: a
// static busybox as /bin/sh, so that a chroot costs one file instead of
// the host's /usr.
func shellChrootEnv(t *testing.T) map[string]string {
	return map[string]string{staticBusybox(t): "/bin/sh"}
}

// nodeOpts is what a test asks of its node.
type nodeOpts struct {
	// chrootEnv is the client's chroot_env and serve's --chroot-env;
	// nil: shellChrootEnv.
	chrootEnv map[string]string
	// docker is the endpoint of the dockerd the docker plugin uses; ""
	// leaves the plugin's default, which the tests never use.
	docker string
	// drivers are the task drivers the test needs healthy before it
	// starts.
	drivers []string
	// persistent runs a server and a client that keep their state in
	// data_dir instead of a dev agent, whose server forgets its jobs when
	// it stops: what a test that restarts the agent needs.
	persistent bool
	// join makes the agent a client alone, one of the nodes of the server
	// agent join (startServer): what a test of more than one node needs.
	join *node
	// name is the agent's node name, which the clients of one server
	// need each of their own; "": the host's name.
	name string
}

// node is one Nomad agent (server and client, -dev) whose alloc_dir is an
// allocfs mount, or a plain directory; or a client alone (nodeOpts.join),
// or a server alone (startServer), which has no alloc_dir.
type node struct {
	top                 string
	allocDir, mountsDir string
	serve               *harness.Daemon // nil on a plain directory
	socket              string
	nomad, addr         string
	// rpc is the agent's RPC address, where the clients of a server
	// agent find it.
	rpc    string
	name   string
	nodeID string // "" on a server alone

	agent     *exec.Cmd
	agentArgs []string
	agentDone chan struct{}
	agentOut  *allocdirtest.SyncBuffer
	hc        *http.Client
	// jobs are the jobs to purge before the agent stops; the agents of
	// one cluster share them, whichever of them a job was run through.
	jobs map[string]bool
	// orphans are what agents killed by restartAgent had started: the
	// next agent takes them over without becoming their parent.
	orphans []proc
}

// startNode starts serve (on the mount backend) and a Nomad agent whose
// client.alloc_dir is its mount, and waits until the node is ready with
// opts.drivers healthy. Cleanup stops the jobs, kills the agent and what
// it started, detaches every mount Nomad left, stops serve and removes
// the directories, whether the test passed or not.
func startNode(t *testing.T, opts nodeOpts) *node {
	t.Helper()
	n := newNode(t, opts)
	if opts.join != nil {
		n.jobs = opts.join.jobs
	}
	if opts.chrootEnv == nil {
		opts.chrootEnv = shellChrootEnv(t)
	}
	top := n.top
	n.allocDir = filepath.Join(top, "alloc")
	n.mountsDir = filepath.Join(top, "mounts")
	if onMount() {
		n.socket = filepath.Join(top, "allocfs.sock")
		n.serve = harness.StartDaemon(t, &harness.Daemon{
			DataDir: filepath.Join(top, "data"),
			Mount:   n.allocDir,
			Socket:  n.socket,
			Args:    []string{"--chroot-env=" + harness.ChrootEnvFlag(opts.chrootEnv)},
		})
	} else if err := os.Mkdir(n.allocDir, 0o711); err != nil {
		t.Fatal(err)
	}
	n.configureAgent(t, opts)
	n.startAgent(t)
	t.Cleanup(func() { n.shutdown(t) })
	n.waitReady(t, opts.drivers)
	return n
}

// startServer starts a Nomad agent that is a server alone, with no
// client and no alloc_dir, and waits until it leads; nodes join it with
// nodeOpts.join. It is started before its clients, so that its cleanup
// runs after theirs: the jobs are purged and the clients stopped while
// it still answers.
func startServer(t *testing.T) *node {
	t.Helper()
	n := newNode(t, nodeOpts{})
	n.configureAgent(t, nodeOpts{})
	n.startAgent(t)
	t.Cleanup(func() { n.shutdown(t) })
	n.waitLeader(t)
	return n
}

// newNode makes the test's directory of an agent, which cleanup removes.
func newNode(t *testing.T, opts nodeOpts) *node {
	t.Helper()
	requireAgentTests(t)
	n := &node{nomad: nomadBinary(t), name: opts.name, hc: &http.Client{Timeout: 30 * time.Second}, jobs: map[string]bool{}}
	top, err := os.MkdirTemp("", "allocfs-nomad-")
	if err != nil {
		t.Fatal(err)
	}
	top, _ = filepath.EvalSymlinks(top)
	// Chroot tasks run as nobody and dockerd's containers as whoever their
	// image says: the way to alloc_dir must be open to them.
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	n.top = top
	t.Cleanup(func() { removeTop(t, top) })
	return n
}

// removeTop removes the test's directory unless something is still
// mounted below it: RemoveAll would walk into the mount and remove what
// it shows.
func removeTop(t *testing.T, top string) {
	if left := mountsBelow(t, top); len(left) != 0 {
		t.Errorf("%s kept: mounts left below it: %v", top, left)
		return
	}
	if err := os.RemoveAll(top); err != nil {
		t.Errorf("remove %s: %v", top, err)
	}
}

// freePorts asks the kernel for n free TCP ports on 127.0.0.1.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// agentConfig is the agent's HCL: a dev agent (server and client in one)
// on 127.0.0.1 only, its state in the test's directory; or a server, a
// client, or both, outside dev mode (nodeOpts.persistent, nodeOpts.join,
// startServer).
func (n *node) agentConfig(opts nodeOpts, ports []int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "data_dir = %q\nbind_addr = \"127.0.0.1\"\ndisable_update_check = true\nlog_level = \"DEBUG\"\n", filepath.Join(n.top, "nomad"))
	fmt.Fprintf(&b, "ports {\n  http = %d\n  rpc = %d\n  serf = %d\n}\n", ports[0], ports[1], ports[2])
	if n.name != "" {
		fmt.Fprintf(&b, "name = %q\n", n.name)
	}
	server, client, dev := n.roles(opts)
	if !dev {
		// Outside dev mode the agent will not advertise a loopback
		// address unless told to.
		b.WriteString("advertise {\n  http = \"127.0.0.1\"\n  rpc = \"127.0.0.1\"\n  serf = \"127.0.0.1\"\n}\n")
		if server {
			b.WriteString("server {\n  enabled = true\n  bootstrap_expect = 1\n}\n")
		}
	}
	if !client {
		return b.String()
	}
	if !dev {
		rpc := n.rpc
		if opts.join != nil {
			rpc = opts.join.rpc
		}
		fmt.Fprintf(&b, "client {\n  enabled = true\n  servers = [%q]\n  network_interface = \"lo\"\n}\n", rpc)
	}
	fmt.Fprintf(&b, "client {\n  alloc_dir = %q\n  alloc_mounts_dir = %q\n", n.allocDir, n.mountsDir)
	// The cloud fingerprinters would ask a metadata service off this
	// machine; the tests keep to 127.0.0.1.
	b.WriteString("  options = {\n    \"fingerprint.denylist\" = \"env_aws,env_gce,env_azure,env_digitalocean\"\n  }\n")
	b.WriteString("  chroot_env = {\n")
	var srcs []string
	for src := range opts.chrootEnv {
		srcs = append(srcs, src)
	}
	sort.Strings(srcs)
	for _, src := range srcs {
		fmt.Fprintf(&b, "    %q = %q\n", src, opts.chrootEnv[src])
	}
	b.WriteString("  }\n}\n")
	b.WriteString("plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n")
	b.WriteString("plugin \"docker\" {\n  config {\n")
	if opts.docker != "" {
		fmt.Fprintf(&b, "    endpoint = %q\n", opts.docker)
	}
	b.WriteString("    gc {\n      image = false\n    }\n  }\n}\n")
	return b.String()
}

// roles says what the agent runs: a server unless it joins another's, a
// client unless it is a server alone (startServer), and both in one -dev
// agent unless it must keep its state (nodeOpts.persistent).
func (n *node) roles(opts nodeOpts) (server, client, dev bool) {
	server, client = opts.join == nil, n.allocDir != ""
	return server, client, server && client && !opts.persistent
}

// configureAgent writes the agent's configuration, on ports it keeps
// across restarts.
func (n *node) configureAgent(t *testing.T, opts nodeOpts) {
	t.Helper()
	ports := freePorts(t, 3)
	n.addr = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	n.rpc = fmt.Sprintf("127.0.0.1:%d", ports[1])
	cfg := filepath.Join(n.top, "agent.hcl")
	if err := os.WriteFile(cfg, []byte(n.agentConfig(opts, ports)), 0o644); err != nil {
		t.Fatal(err)
	}
	n.agentArgs = []string{"agent", "-config", cfg}
	if _, _, dev := n.roles(opts); dev {
		n.agentArgs = []string{"agent", "-dev", "-config", cfg}
	}
	n.agentOut = &allocdirtest.SyncBuffer{}
}

func (n *node) startAgent(t *testing.T) {
	t.Helper()
	cmd := exec.Command(n.nomad, n.agentArgs...)
	cmd.Stdout, cmd.Stderr = n.agentOut, n.agentOut
	cmd.Env = append(agentEnv(), "NOMAD_ADDR="+n.addr)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the Nomad agent: %v", err)
	}
	n.agent = cmd
	n.agentDone = make(chan struct{})
	go func() {
		cmd.Wait()
		close(n.agentDone)
	}()
}

// agentEnv is the test's environment for the agent, without the AWS
// SDK's CA bundle, which the agent's metadata client refuses at start.
func agentEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitReady waits until the agent's client node is ready and every one
// of drivers is detected and healthy.
func (n *node) waitReady(t *testing.T, drivers []string) {
	t.Helper()
	start := time.Now()
	var last string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		select {
		case <-n.agentDone:
			t.Fatalf("the Nomad agent exited early: %v\n%s", n.agent.ProcessState, n.agentOut)
		default:
		}
		var nodes []struct {
			ID, Name, Status string
		}
		code, body := n.get(t, "/v1/nodes", &nodes)
		if n.name != "" {
			// The other clients of the server are on its list too.
			nodes = slices.DeleteFunc(nodes, func(nd struct{ ID, Name, Status string }) bool { return nd.Name != n.name })
		}
		if code != http.StatusOK || len(nodes) != 1 || nodes[0].Status != "ready" {
			last = fmt.Sprintf("/v1/nodes: %d %s", code, body)
			continue
		}
		n.nodeID = nodes[0].ID
		var info struct {
			Drivers map[string]struct {
				Detected, Healthy bool
				HealthDescription string
			}
		}
		n.get(t, "/v1/node/"+n.nodeID, &info)
		ok := true
		for _, d := range drivers {
			if di := info.Drivers[d]; !di.Detected || !di.Healthy {
				ok = false
				last = fmt.Sprintf("driver %s: detected %v, healthy %v: %s", d, di.Detected, di.Healthy, di.HealthDescription)
			}
		}
		if ok {
			t.Logf("the Nomad agent was ready in %v", time.Since(start).Round(time.Millisecond))
			return
		}
	}
	if strings.HasPrefix(last, "driver ") {
		fstest.Lacks(t, "the Nomad agent's %s", last)
	}
	t.Fatalf("the Nomad agent not ready within 90s: %s\n%s", last, n.agentOut)
}

// waitLeader waits until the agent's server has been elected leader.
func (n *node) waitLeader(t *testing.T) {
	t.Helper()
	start := time.Now()
	var code int
	var body string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		select {
		case <-n.agentDone:
			t.Fatalf("the Nomad server agent exited early: %v\n%s", n.agent.ProcessState, n.agentOut)
		default:
		}
		var leader string
		if code, body = n.get(t, "/v1/status/leader", &leader); code == http.StatusOK && leader != "" {
			t.Logf("the Nomad server agent led in %v", time.Since(start).Round(time.Millisecond))
			return
		}
	}
	t.Fatalf("the Nomad server agent has no leader within 90s: /v1/status/leader: %d %s\n%s", code, body, n.agentOut)
}

// shutdown stops every job the test ran and waits for their allocations
// to stop, kills the agent and every process it started (executors,
// logmon, tasks: they outlive an agent on purpose), then detaches what
// Nomad left mounted in alloc_dir and alloc_mounts_dir, deepest first.
// It runs before serve's cleanup, so that the mount is still served.
func (n *node) shutdown(t *testing.T) {
	select {
	case <-n.agentDone:
	default:
		for job := range n.jobs {
			n.do(t, http.MethodDelete, "/v1/job/"+url.PathEscape(job)+"?purge=true", nil, nil)
		}
		n.waitAllStopped(t, 45*time.Second)
		// Deepest first, and the agent last: each process then dies
		// while its parent lives to reap it (this machine's init may
		// not).
		procs := append(n.orphans, descendants(n.agent.Process.Pid)...)
		for i := len(procs) - 1; i >= 0; i-- {
			procs[i].kill()
		}
		n.agent.Process.Kill()
		<-n.agentDone
	}
	if n.allocDir != "" {
		detachBelow(t, n.allocDir, n.mountsDir)
	}
	if t.Failed() {
		t.Logf("Nomad agent output:\n%s", n.agentOut)
	}
}

// waitAllStopped waits until no allocation on the node runs any more:
// those of the other clients of its server are theirs to wait for, and a
// server alone has none.
func (n *node) waitAllStopped(t *testing.T, limit time.Duration) {
	if n.nodeID == "" {
		return
	}
	var running []string
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		var allocs []allocStub
		if code, _ := n.get(t, "/v1/node/"+n.nodeID+"/allocations", &allocs); code != http.StatusOK {
			return
		}
		running = running[:0]
		for _, a := range allocs {
			if a.ClientStatus == "pending" || a.ClientStatus == "running" {
				running = append(running, a.ID)
			}
		}
		if len(running) == 0 {
			return
		}
	}
	t.Errorf("allocations still running %v after their jobs were stopped", running)
}

// restartAgent kills the agent with SIGKILL, as a crash would, and
// starts it again on the same configuration and state; what it had
// started runs on.
func (n *node) restartAgent(t *testing.T, drivers []string) {
	t.Helper()
	n.orphans = append(n.orphans, descendants(n.agent.Process.Pid)...)
	n.agent.Process.Kill()
	<-n.agentDone
	n.startAgent(t)
	n.waitReady(t, drivers)
}

// proc is a process found in /proc, with its start time, so that a
// cleanup never kills another process that took its PID since.
type proc struct {
	pid   int
	start string
}

// kill sends SIGKILL to p if it is still the process it was.
func (p proc) kill() {
	if _, start, ok := readStat(p.pid); ok && start == p.start {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// readStat reads pid's parent and start time from /proc/<pid>/stat.
func readStat(pid int) (ppid int, start string, ok bool) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, "", false
	}
	// The command name in parentheses may hold spaces: the fields after
	// its closing parenthesis are state (field 3), then the parent, and
	// the start time is field 22.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, "", false
	}
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(fields[1])
	return ppid, fields[19], err == nil
}

// descendants lists every process below pid, children before their own
// children, from /proc.
func descendants(pid int) []proc {
	entries, _ := os.ReadDir("/proc")
	children := map[int][]proc{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, start, ok := readStat(p); ok {
			children[ppid] = append(children[ppid], proc{p, start})
		}
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// mountsBelow lists the mount points below dir.
func mountsBelow(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Fatalf("read mountinfo: %v", err)
	}
	var below []string
	for _, m := range mounts {
		if strings.HasPrefix(m.MountPoint, dir+"/") {
			below = append(below, m.MountPoint)
		}
	}
	return below
}

// detachBelow detaches every mount below (not at) each of dirs, deepest
// first, lazily: a mount whose daemon is gone must not block it.
func detachBelow(t *testing.T, dirs ...string) {
	var below []string
	for _, d := range dirs {
		below = append(below, mountsBelow(t, d)...)
	}
	sort.Slice(below, func(i, j int) bool { return len(below[i]) > len(below[j]) })
	for _, p := range below {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Errorf("detach %s: %v", p, err)
		}
	}
}

// do sends a request to the agent's HTTP API; a JSON answer with status
// 200 is decoded into out.
func (n *node) do(t *testing.T, method, path string, in, out any) (int, string) {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatalf("encode %s %s: %v", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, n.addr+path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	resp, err := n.hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err.Error()
	}
	if out != nil && resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("decode the answer of %s %s: %v\n%s", method, path, err, b)
		}
	}
	return resp.StatusCode, string(b)
}

func (n *node) get(t *testing.T, path string, out any) (int, string) {
	t.Helper()
	return n.do(t, http.MethodGet, path, nil, out)
}

// mustDo is do that fails the test unless the agent answers 200.
func (n *node) mustDo(t *testing.T, method, path string, in, out any) string {
	t.Helper()
	code, body := n.do(t, method, path, in, out)
	if code != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, code, body)
	}
	return body
}

// runJob parses hcl with the agent's own parser and registers the job;
// it returns the job's ID.
func (n *node) runJob(t *testing.T, hcl string) string {
	t.Helper()
	var job map[string]any
	n.mustDo(t, http.MethodPost, "/v1/jobs/parse", map[string]any{"JobHCL": hcl, "Canonicalize": true}, &job)
	id, _ := job["ID"].(string)
	n.jobs[id] = true
	n.mustDo(t, http.MethodPost, "/v1/jobs", map[string]any{"Job": job}, nil)
	return id
}

// allocStub is what the tests read of an allocation.
type allocStub struct {
	ID, Name, NodeID, ClientStatus, DesiredStatus string
	PreviousAllocation                            string
	TaskStates                                    map[string]struct {
		State     string
		Failed    bool
		Restarts  int
		StartedAt time.Time
		Events    []struct {
			Type, DisplayMessage string
		}
	}
}

// events is what happened to a's tasks, for a failure's message.
func (a allocStub) events() string {
	var b strings.Builder
	for task, st := range a.TaskStates {
		fmt.Fprintf(&b, "\n  task %s (%s, failed %v):", task, st.State, st.Failed)
		for _, e := range st.Events {
			fmt.Fprintf(&b, "\n    %s: %s", e.Type, e.DisplayMessage)
		}
	}
	return b.String()
}

// waitAlloc waits until an allocation of job, other than those in skip,
// has reached want ("running": every task of it running; "complete"),
// and returns it. A failed one fails the test at once, with its tasks'
// events.
func (n *node) waitAlloc(t *testing.T, job string, skip map[string]bool, want string) allocStub {
	t.Helper()
	start := time.Now()
	var allocs []allocStub
	for deadline := time.Now().Add(allocTimeout); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body := n.get(t, "/v1/job/"+url.PathEscape(job)+"/allocations", &allocs); code != http.StatusOK {
			t.Fatalf("allocations of %s: %d %s", job, code, body)
		}
		for _, a := range allocs {
			if skip[a.ID] {
				continue
			}
			failed := a.ClientStatus == "failed"
			for _, st := range a.TaskStates {
				failed = failed || st.Failed
			}
			if failed {
				t.Fatalf("allocation %s of %s failed after %v (%s):%s", a.ID, job, time.Since(start).Round(time.Millisecond), a.ClientStatus, a.events())
			}
			if a.ClientStatus != want {
				continue
			}
			ok := true
			if want == "running" {
				for _, st := range a.TaskStates {
					ok = ok && st.State == "running"
				}
			}
			if ok && len(a.TaskStates) > 0 {
				t.Logf("allocation %s of %s %s after %v", a.ID, job, want, time.Since(start).Round(time.Millisecond))
				return a
			}
		}
	}
	var b strings.Builder
	for _, a := range allocs {
		fmt.Fprintf(&b, "\n%s: %s/%s%s", a.ID, a.ClientStatus, a.DesiredStatus, a.events())
	}
	t.Fatalf("no allocation of %s %s within %v:%s", job, want, allocTimeout, &b)
	return allocStub{}
}

// logs is what task of alloc wrote to its stream ("stdout", "stderr")
// through the agent's /v1/client/fs/logs, once it holds want.
func (n *node) logs(t *testing.T, alloc, task, stream, want string) string {
	t.Helper()
	path := fmt.Sprintf("/v1/client/fs/logs/%s?task=%s&type=%s&origin=start&offset=0&plain=true", alloc, task, stream)
	var code int
	var body string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		code, body = n.get(t, path, nil)
		if code == http.StatusOK && strings.Contains(body, want) {
			return body
		}
	}
	t.Errorf("%s of %s/%s through the agent's API: %d %q, want it to hold %q", stream, alloc, task, code, body, want)
	return body
}

// stderrOnFailure has a failed test log what task of alloc wrote to
// stderr, where a shell says which of its writes the mount refused. It
// runs before the node's cleanup stops the agent.
func (n *node) stderrOnFailure(t *testing.T, alloc, task string) {
	t.Cleanup(func() {
		if t.Failed() {
			_, body := n.get(t, fmt.Sprintf("/v1/client/fs/logs/%s?task=%s&type=stderr&origin=start&offset=0&plain=true", alloc, task), nil)
			t.Logf("%s/%s's stderr:\n%s", alloc, task, body)
		}
	})
}

// cli runs the Nomad CLI against the agent and fails the test unless it
// exits 0; it returns the command's stdout.
func (n *node) cli(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(n.nomad, args...)
	cmd.Env = append(os.Environ(), "NOMAD_ADDR="+n.addr)
	r := harness.Run(t, cmd, "nomad "+strings.Join(args, " "))
	if r.Code != 0 {
		t.Fatalf("nomad %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.Code, r.Stdout, r.Stderr)
	}
	return r.Stdout
}

// within runs op, which touches alloc_dir, and fails the test if it has
// not returned within opTimeout: a hung mount must not hang the package.
func within[T any](t *testing.T, what string, op func() (T, error)) (T, error) {
	t.Helper()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := op()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-time.After(opTimeout):
		t.Fatalf("%s: no answer within %v", what, opTimeout)
		var zero T
		return zero, nil
	}
}

// path is rel (slash-separated) inside alloc_dir.
func (n *node) path(rel string) string { return filepath.Join(n.allocDir, filepath.FromSlash(rel)) }

// readFile reads rel inside alloc_dir, bounded in time.
func (n *node) readFile(t *testing.T, rel string) (string, error) {
	t.Helper()
	return within(t, "read "+rel, func() (string, error) {
		b, err := os.ReadFile(n.path(rel))
		return string(b), err
	})
}

// wantFile fails the test unless rel inside alloc_dir holds want.
func (n *node) wantFile(t *testing.T, rel, want string) {
	t.Helper()
	if got, err := n.readFile(t, rel); err != nil || got != want {
		t.Errorf("%s on alloc_dir: %q, %v; want %q", rel, got, err, want)
	}
}

// exists reports whether rel inside alloc_dir exists, bounded in time.
func (n *node) exists(t *testing.T, rel string) bool {
	t.Helper()
	ok, err := within(t, "lstat "+rel, func() (bool, error) {
		_, err := os.Lstat(n.path(rel))
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		t.Fatalf("lstat %s: %v", rel, err)
	}
	return ok
}

// store is allocfs's control API on the node's socket.
func (n *node) store() *api.Client { return api.NewClient(n.socket) }

// storeHas reports whether allocfs's store holds a record of id.
func (n *node) storeHas(t *testing.T, id string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	c := n.store()
	defer c.Close()
	allocs, err := c.ListAllocs(ctx)
	if err != nil {
		t.Fatalf("list allocfs's allocations: %v", err)
	}
	for _, a := range allocs {
		if a.ID == id {
			return true
		}
	}
	return false
}
