//go:build linux

package taskproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/internal/mountinfo"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// How a task's processes are found when it ends.
const (
	// trackCgroup: the task starts in a cgroup v2 of its own, which
	// every process it starts inherits and none can leave without
	// privilege.
	trackCgroup = "cgroup"
	// trackSubreaper: exec is a child subreaper, so that whatever the
	// task orphans (a double fork, setsid) becomes exec's child, and the
	// task is every descendant of exec. With a cgroup, exec is a
	// subreaper too: it reaps the orphans it killed, rather than leave
	// their exit to init, and it finds a task that left the cgroup.
	trackSubreaper = "subreaper"
	// trackGroup: neither is available; only the task's process group
	// is known, which setsid leaves.
	trackGroup = "process group"
)

// EnvNoCgroup, set to 1, makes exec track a task as a subreaper even
// where it could use a cgroup: the tests use it to run the fallback on
// machines that have cgroup v2.
const EnvNoCgroup = "ALLOCFS_EXEC_NO_CGROUP"

// killWait bounds the wait for processes to die once SIGKILL was sent:
// only one stuck in the kernel (an unresponsive mount) takes longer.
const killWait = 10 * time.Second

// Tracker finds and ends every process of one task run. Exec's process
// must start no child other than the task: as a subreaper it takes any
// descendant for the task's.
type Tracker struct {
	logger    hclog.Logger
	method    string
	cg        *taskCgroup // for trackCgroup
	subreaper bool
	self      int
	pgid      int // the task's process group, once started
}

// Track prepares to track the processes of a task about to start:
// a cgroup if the kernel and permissions allow, else a subreaper. It
// logs the method it uses and never fails: the process group is the
// last resort.
func Track(logger hclog.Logger) *Tracker {
	p := &Tracker{logger: logger, self: os.Getpid()}
	subreaperErr := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	p.subreaper = subreaperErr == nil
	if !p.subreaper {
		p.logger.Warn("exec cannot be a child subreaper", "error", subreaperErr)
	}
	if os.Getenv(EnvNoCgroup) == "1" {
		p.fallBack(fmt.Errorf("%s=1", EnvNoCgroup))
		return p
	}
	cg, err := newTaskCgroup(fmt.Sprintf("allocfs-exec-%d", p.self))
	if err != nil {
		p.fallBack(err)
		return p
	}
	p.method, p.cg = trackCgroup, cg
	logger.Info("tracking the task's processes", "method", p.method, "cgroup", cg.path, "subreaper", p.subreaper)
	return p
}

// fallBack gives up the cgroup for the subreaper, or for the process
// group alone if exec could not become a subreaper either.
func (p *Tracker) fallBack(why error) {
	if p.cg != nil {
		if err := p.cg.remove(); err != nil {
			p.logger.Warn("cannot remove the task's cgroup", "cgroup", p.cg.path, "error", err)
		}
		p.cg = nil
	}
	if !p.subreaper {
		p.method = trackGroup
		p.logger.Warn("tracking only the task's process group: a process that calls setsid will outlive the task", "no_cgroup", why)
		return
	}
	p.method = trackSubreaper
	p.logger.Info("tracking the task's processes", "method", p.method, "no_cgroup", why)
}

// Prepare makes the task start inside its cgroup: with clone3's
// CLONE_INTO_CGROUP it is in there before it runs a single instruction.
func (p *Tracker) Prepare(attr *syscall.SysProcAttr) {
	attr.UseCgroupFD, attr.CgroupFD = false, 0
	if p.cg != nil {
		attr.UseCgroupFD, attr.CgroupFD = true, int(p.cg.dir.Fd())
	}
}

// RetryStart reports whether a start that failed with err failed because
// of the cgroup, and if so falls back so that the task can be started
// again. clone3 refuses a cgroup that cannot hold processes (EBUSY,
// EOPNOTSUPP) and does not exist before Linux 5.7 (ENOSYS).
func (p *Tracker) RetryStart(err error) bool {
	if p.cg == nil {
		return false
	}
	if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		return false
	}
	p.fallBack(fmt.Errorf("cannot start the task in cgroup %s: %w", p.cg.path, err))
	return true
}

// Started records the task's main process, the leader of its group.
func (p *Tracker) Started(pid int) { p.pgid = pid }

// SignalGroup passes sig on to the task's process group.
func (p *Tracker) SignalGroup(sig syscall.Signal) {
	if p.pgid <= 0 {
		return // not started: kill(0) would signal exec's own group
	}
	// ESRCH: the group is gone already.
	if err := syscall.Kill(-p.pgid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		p.logger.Warn("cannot signal the task", "signal", sig, "error", err)
	}
}

// KillAll sends SIGKILL to every process of the task, the main one
// included.
func (p *Tracker) KillAll() {
	p.SignalGroup(syscall.SIGKILL)
	if p.cg != nil && p.cg.kill() {
		return
	}
	for _, pr := range p.remaining(false) {
		pr.signal(syscall.SIGKILL)
	}
}

// Terminate ends what is left of the task once its main process has
// exited and been waited for: SIGTERM to every process, SIGKILL to those
// still there after grace, until none is left.
func (p *Tracker) Terminate(grace time.Duration) error {
	if p.method == trackGroup {
		return p.endGroup(grace)
	}
	deadline := time.Now().Add(grace)
	var killDeadline time.Time
	termed := make(map[int]bool)
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		left := p.remaining(true)
		if len(left) == 0 {
			return nil
		}
		now := time.Now()
		switch {
		case killDeadline.IsZero() && !now.Before(deadline):
			p.logger.Info("killing what is left of the task", "processes", len(left), "kill_timeout", grace)
			p.KillAll()
			killDeadline = now.Add(killWait)
		case !killDeadline.IsZero() && now.After(killDeadline):
			return fmt.Errorf("%d process(es) of the task survived SIGKILL for %v: %v", len(left), killWait, pids(left))
		case !killDeadline.IsZero():
			// New ones: a process that forked while being killed.
			p.KillAll()
		default:
			for _, pr := range left {
				if !termed[pr.pid] && !pr.zombie {
					termed[pr.pid] = true
					pr.signal(syscall.SIGTERM)
				}
			}
		}
		time.Sleep(pause)
	}
}

// endGroup is terminate for a task tracked by its process group alone.
func (p *Tracker) endGroup(grace time.Duration) error {
	alive := func() bool { return syscall.Kill(-p.pgid, 0) == nil }
	if !alive() {
		return nil
	}
	p.SignalGroup(syscall.SIGTERM)
	for _, step := range []struct {
		wait time.Duration
		then func()
	}{{grace, func() { p.SignalGroup(syscall.SIGKILL) }}, {killWait, nil}} {
		end := time.Now().Add(step.wait)
		for pause := time.Millisecond; alive() && time.Now().Before(end); pause = min(2*pause, 100*time.Millisecond) {
			time.Sleep(pause)
		}
		if !alive() {
			return nil
		}
		if step.then != nil {
			p.logger.Info("killing what is left of the task", "process_group", p.pgid, "kill_timeout", grace)
			step.then()
		}
	}
	return fmt.Errorf("process group %d of the task survived SIGKILL for %v", p.pgid, killWait)
}

// remaining lists the processes of the task that still exist: those in
// its cgroup and exec's descendants. With reap set, it first reaps the
// descendants that became exec's children and died: only then are they
// gone.
func (p *Tracker) remaining(reap bool) []proc {
	var left []proc
	if p.cg != nil && p.cg.populated() {
		left = p.cg.members()
	}
	if !p.subreaper {
		return left
	}
	for _, pr := range descendants(p.self) {
		if reap && pr.zombie && pr.ppid == p.self {
			var ws unix.WaitStatus
			if pid, _ := unix.Wait4(pr.pid, &ws, unix.WNOHANG, nil); pid == pr.pid {
				continue
			}
		}
		if !slices.ContainsFunc(left, func(q proc) bool { return q.pid == pr.pid }) {
			left = append(left, pr)
		}
	}
	return left
}

// Close removes the task's cgroup, which must be empty.
func (p *Tracker) Close() error {
	if p.cg == nil {
		return nil
	}
	return p.cg.remove()
}

// proc is a process found by a scan, with what identified it as the
// task's, so that a signal reaches it only if it still is.
type proc struct {
	pid    int
	ppid   int  // when found as a descendant
	zombie bool // exited, not yet reaped
	// still reports whether the process now numbered pid is the one the
	// scan found.
	still func() bool
}

// signal sends sig through a pidfd, after checking that the pid still
// names the task's process: a pid read from /proc may be reused by the
// time it is signalled, while a pidfd always names the process it was
// opened on.
func (pr proc) signal(sig syscall.Signal) {
	fd, err := unix.PidfdOpen(pr.pid, 0)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) && pr.still() {
			// Before Linux 5.3: the check narrows the race, no more.
			syscall.Kill(pr.pid, sig)
		}
		return
	}
	defer unix.Close(fd)
	if pr.still() {
		unix.PidfdSendSignal(fd, sig, nil, 0)
	}
}

func pids(ps []proc) []int {
	out := make([]int, len(ps))
	for i, pr := range ps {
		out[i] = pr.pid
	}
	return out
}

// descendants scans /proc for every descendant of pid.
func descendants(pid int) []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := make(map[int][]proc)
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ppid, state, err := procStat(n)
		if err != nil {
			continue // gone since the listing
		}
		pr := proc{pid: n, ppid: ppid, zombie: state == 'Z'}
		pr.still = func() bool {
			now, _, err := procStat(pr.pid)
			return err == nil && now == pr.ppid
		}
		children[ppid] = append(children[ppid], pr)
	}
	var out []proc
	for queue := []int{pid}; len(queue) > 0; queue = queue[1:] {
		for _, c := range children[queue[0]] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// procStat reads the parent and state of a process from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state byte, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields that follow start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, b)
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0][0], err
}

// taskCgroup is the cgroup v2 a task runs in: a leaf made for it below
// exec's own cgroup, so that the task stays under whatever limits exec
// was given.
type taskCgroup struct {
	path string   // in the cgroup2 mount: /sys/fs/cgroup/<exec's>/allocfs-exec-<pid>
	rel  string   // as /proc/<pid>/cgroup names it: /<exec's>/allocfs-exec-<pid>
	dir  *os.File // for CLONE_INTO_CGROUP
}

// newTaskCgroup makes the leaf name in exec's own cgroup v2. It fails
// when there is no cgroup v2 (a v1-only host), when exec may not write
// there (a container's read-only /sys/fs/cgroup, a user without
// delegation), or when the new cgroup cannot hold processes (in a
// threaded subtree).
//
// cgroup v2 lets processes live only in cgroups that pass no controller
// down ("no internal processes"), the root excepted. Exec's own cgroup
// holds exec, so it passes none down, and a new leaf below it can take
// the task. Should the kernel refuse all the same, clone3 fails and
// RetryStart falls back.
func newTaskCgroup(name string) (_ *taskCgroup, err error) {
	own, err := readOwnCgroup("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	mounts, err := mountinfo.Read("")
	if err != nil {
		return nil, err
	}
	parent, err := cgroupDir(mounts, own)
	if err != nil {
		return nil, err
	}
	cg := &taskCgroup{path: filepath.Join(parent, name), rel: filepath.Join(own, name)}
	err = os.Mkdir(cg.path, 0o755)
	if errors.Is(err, os.ErrExist) {
		// Left by an exec that had the same pid and was killed; if it
		// still holds processes, it is not ours to take.
		if err := os.Remove(cg.path); err != nil {
			return nil, fmt.Errorf("failed to remove stale cgroup %q: %w", cg.path, err)
		}
		err = os.Mkdir(cg.path, 0o755)
	}
	if err != nil {
		return nil, fmt.Errorf("failed to make cgroup %q: %w", cg.path, err)
	}
	defer func() {
		if err != nil {
			cg.remove()
		}
	}()
	// A cgroup in a threaded subtree is "domain invalid" or "threaded":
	// it cannot hold a process, only threads.
	typ, err := os.ReadFile(filepath.Join(cg.path, "cgroup.type"))
	if err != nil {
		return nil, fmt.Errorf("failed to read the type of cgroup %q: %w", cg.path, err)
	}
	if t := strings.TrimSpace(string(typ)); t != "domain" {
		return nil, fmt.Errorf("cgroup %q is %q: it cannot hold processes", cg.path, t)
	}
	if cg.dir, err = os.Open(cg.path); err != nil {
		return nil, fmt.Errorf("failed to open cgroup %q: %w", cg.path, err)
	}
	return cg, nil
}

// readOwnCgroup returns the process's cgroup v2 path from a file in
// the format of /proc/self/cgroup: the "0::" line.
func readOwnCgroup(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("failed to read own cgroup: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path, ok := strings.CutPrefix(sc.Text(), "0::")
		if !ok {
			continue
		}
		// Outside the reader's cgroup namespace the kernel shows the
		// path relative to it, starting with "/..": no mount of ours
		// reaches it.
		if !strings.HasPrefix(path, "/") || path == "/.." || strings.HasPrefix(path, "/../") || strings.HasSuffix(path, " (deleted)") {
			return "", fmt.Errorf("own cgroup %q is outside this cgroup namespace", path)
		}
		return path, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("failed to read own cgroup: %w", err)
	}
	return "", errors.New("no cgroup v2 hierarchy in /proc/self/cgroup")
}

// cgroupDir finds the directory of cgroup v2 path own among mounts: the
// cgroup2 mount whose root holds it. On a unified host that is
// /sys/fs/cgroup, on a hybrid one /sys/fs/cgroup/unified; a container may
// mount only its own subtree.
func cgroupDir(mounts []mountinfo.Entry, own string) (string, error) {
	var found []string
	for _, m := range mounts {
		if m.FSType != "cgroup2" {
			continue
		}
		found = append(found, m.MountPoint)
		rel, ok := strings.CutPrefix(own, m.Root)
		if m.Root == "/" {
			rel, ok = own, true
		}
		if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
			continue
		}
		dir := filepath.Join(m.MountPoint, rel)
		if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err == nil {
			return dir, nil
		}
	}
	if len(found) == 0 {
		return "", errors.New("no cgroup2 filesystem is mounted")
	}
	return "", fmt.Errorf("own cgroup %q is not under the cgroup2 mount(s) %s", own, strings.Join(found, ", "))
}

// populated reports whether a process is left in the cgroup or below.
// An unreadable cgroup.events answers yes: terminate then goes on to
// members, which tells.
func (c *taskCgroup) populated() bool {
	b, err := os.ReadFile(filepath.Join(c.path, "cgroup.events"))
	if err != nil {
		return true
	}
	return !bytes.Contains(b, []byte("populated 0\n"))
}

// members lists the processes in the cgroup and in any a task made
// below it.
func (c *taskCgroup) members() []proc {
	var out []proc
	filepath.WalkDir(c.path, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			out = append(out, proc{pid: pid, still: func() bool { return c.holds(pid) }})
		}
		return nil
	})
	return out
}

// holds reports whether process pid is in the cgroup or below.
func (c *taskCgroup) holds(pid int) bool {
	own, err := readOwnCgroup("/proc/" + strconv.Itoa(pid) + "/cgroup")
	return err == nil && (own == c.rel || strings.HasPrefix(own, c.rel+"/"))
}

// kill sends SIGKILL to every process in the cgroup's subtree at once,
// forks in flight included. It reports false before Linux 5.14, which
// has no cgroup.kill.
func (c *taskCgroup) kill() bool {
	return os.WriteFile(filepath.Join(c.path, "cgroup.kill"), []byte("1"), 0) == nil
}

// remove removes the cgroup and any a task made below it, deepest first,
// and closes its fd.
func (c *taskCgroup) remove() error {
	var dirs []string
	filepath.WalkDir(c.path, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	slices.Reverse(dirs)
	var errs []error
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("failed to remove cgroup %q: %w", d, err))
		}
	}
	if c.dir != nil {
		c.dir.Close()
		c.dir = nil
	}
	return errors.Join(errs...)
}
