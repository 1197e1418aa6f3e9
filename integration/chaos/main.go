//go:build linux

// Command chaos runs tasks' I/O on a default `allocfs serve` while the
// daemon is killed with SIGKILL and started again, and upgraded (a second
// serve takes the mount over), round after round; then it says what the
// tasks noticed: writes acknowledged and lost or duplicated, every system
// call that failed, and how long the writers stalled around each event
// against their own gaps between events (`make chaos`,
// docs/benchmarks.md "Chaos").
//
// Each allocation has one task, t, and four workers, goroutines of this
// process doing what a task does:
//
//   - an appender: numbered lines to alloc/data/log, O_APPEND, fsync after
//     each; a line is acknowledged once its fsync returned;
//   - a file writer in t/local and one in t/secrets (a memory volume):
//     .tmp.N made with O_CREAT|O_EXCL, written, fsynced, renamed to f.N,
//     the directory fsynced; acknowledged once that fsync returned. Each
//     keeps its last --keep files: an older one is read back (a missing
//     or wrong one is lost) and removed;
//   - a lister: readdir and lstat of every entry of the three, in a loop.
//
// It is no test: a run takes minutes and its figures depend on the
// machine, so `make test` never runs it. Needs root and /dev/fuse.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

var (
	allocs   = flag.Int("allocs", 16, "`number` of allocations, each with its four workers")
	rounds   = flag.Int("rounds", 20, "`number` of events: kills and upgrades")
	upgrades = flag.Int("upgrades", 3, "how many of the rounds are upgrades (spread evenly); the rest are kills")
	minEvery = flag.Duration("every-min", 3*time.Second, "shortest wait between two events")
	maxEvery = flag.Duration("every-max", 6*time.Second, "longest wait between two events")
	interval = flag.Duration("interval", 10*time.Millisecond, "pause between two operations of a writer or passes of a lister")
	keep     = flag.Int("keep", 32, "files each file writer keeps (secrets/ holds 1024 entries)")
	settle   = flag.Duration("settle", 3*time.Second, "load before the first event and after the last")
	bin      = flag.String("allocfs", "bin/allocfs", "the allocfs binary to serve with")
	parent   = flag.String("dir", "/var/tmp", "`directory` to make the run's data dir and mount point in")
	keepDir  = flag.Bool("keep-dir", false, "leave the run's directory (data dir, serve's logs) behind")
	seed     = flag.Int64("seed", 0, "seed of the waits between events (0: the time)")
	verbose  = flag.Bool("v", false, "print every event as it happens")
)

// eventWait bounds how long a serve may take to come up, and a stop.
const eventWait = 60 * time.Second

func main() {
	flag.Parse()
	if *allocs < 1 || *rounds < 0 || *upgrades < 0 || *upgrades > *rounds || *minEvery > *maxEvery || *keep < 1 {
		fmt.Fprintln(os.Stderr, "chaos: --allocs >= 1, 0 <= --upgrades <= --rounds, --every-min <= --every-max and --keep >= 1")
		os.Exit(2)
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano()
	}
	code, err := chaos()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

// node is the run's directories and the serve now running.
type node struct {
	root, data, mnt, socket string
	bin                     string
	serve                   *serve
	starts                  int
	cleaned                 sync.Once
}

// serve is one `allocfs serve` process.
type serve struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (n *node) start() (*serve, error) {
	n.starts++
	log := filepath.Join(n.root, fmt.Sprintf("serve-%02d.log", n.starts))
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(n.bin, "serve", "--data-dir", n.data, "--mount", n.mnt, "--socket", n.socket, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = "/"
	// A Ctrl-C of the run is for this process, which cleans up; serve
	// would take it for a stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &serve{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// ready waits until s says it serves: the mount is up, or taken over.
func (s *serve) ready() error {
	for deadline := time.Now().Add(eventWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		select {
		case <-s.done:
			b, _ := os.ReadFile(s.log)
			return fmt.Errorf("serve (pid %d) exited with %v before serving:\n%s", s.cmd.Process.Pid, s.cmd.ProcessState, b)
		default:
		}
		if b, _ := os.ReadFile(s.log); bytes.Contains(b, []byte("serving:")) {
			return nil
		}
	}
	return fmt.Errorf("serve (pid %d) did not serve within %v", s.cmd.Process.Pid, eventWait)
}

func (s *serve) wait(d time.Duration) bool {
	select {
	case <-s.done:
		return true
	case <-time.After(d):
		return false
	}
}

func (s *serve) kill() {
	select {
	case <-s.done:
	default:
		s.cmd.Process.Kill()
		<-s.done
	}
}

// mounted reports whether an allocfs mount is at dir.
func mounted(dir string) bool {
	mounts, err := mountinfo.Read("")
	if err != nil {
		return false
	}
	for _, m := range mounts {
		if m.MountPoint == dir && m.FSType == "fuse.allocfs" {
			return true
		}
	}
	return false
}

// stopHolder tells the holder of the node's connection to stop, if one
// answers: with no daemon serving, the connection ends with it, and so do
// requests still waiting in the kernel.
func (n *node) stopHolder() {
	c, err := net.DialTimeout("unix", filepath.Join(n.data, "fuse", "holder.sock"), time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("stop\n"))
	c.Read(make([]byte, 8))
}

// cleanup leaves nothing behind: the serve killed by PID unless it has
// stopped, the mount detached, the holder stopped, the directory removed.
func (n *node) cleanup() { n.cleaned.Do(n.clean) }

func (n *node) clean() {
	if n.serve != nil {
		n.serve.kill()
	}
	if mounted(n.mnt) {
		unix.Unmount(n.mnt, unix.MNT_DETACH)
	}
	n.stopHolder()
	if *keepDir {
		fmt.Printf("the run's directory is left at %s\n", n.root)
		return
	}
	if err := os.RemoveAll(n.root); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: removing %s: %v\n", n.root, err)
	}
}

// event is a kill or an upgrade: from the signal (or the second serve's
// start) until the next serve says it serves.
type event struct {
	kind       string // "kill" or "upgrade"
	n          int    // its number among events of its kind
	start, end time.Time
}

func (e *event) String() string { return fmt.Sprintf("%s %d", e.kind, e.n) }

// sysErr is one failed system call of a worker.
type sysErr struct {
	worker, op, path string
	errno            string
	at               time.Time
}

// run is the whole run's record.
type run struct {
	mu       sync.Mutex
	errs     []sysErr
	events   []*event
	vanished int // lister: an entry renamed or removed between readdir and lstat
	passes   int // lister passes
}

func (r *run) fail(worker, op, path string, err error) {
	name := err.Error()
	var errno syscall.Errno
	if errors.As(err, &errno) {
		name = unix.ErrnoName(errno)
		if name == "" {
			name = errno.Error()
		}
	}
	r.mu.Lock()
	r.errs = append(r.errs, sysErr{worker: worker, op: op, path: path, errno: name, at: time.Now()})
	r.mu.Unlock()
}

// tally is what a writer's acknowledged writes became.
type tally struct {
	acked, lost, duplicated, corrupt int
	// unacked are writes the writer was told failed that happened
	// anyway: an appended line, a renamed file.
	unacked int
	// leftovers are .tmp.N files of failed attempts.
	leftovers int
	// done are the times its operations completed, for its gaps.
	done []time.Time
}

func (t *tally) add(o *tally) {
	t.acked += o.acked
	t.lost += o.lost
	t.duplicated += o.duplicated
	t.corrupt += o.corrupt
	t.unacked += o.unacked
	t.leftovers += o.leftovers
}

func pause(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return false
	case <-time.After(*interval):
		return true
	}
}

// appender appends numbered lines to path, fsyncing each, until stop;
// then checks the file: every acknowledged line once, and in order.
func (r *run) appender(name, mnt, rel string, stop <-chan struct{}) *tally {
	t := &tally{}
	path := filepath.Join(mnt, rel)
	acked := map[int]bool{}
	var f *os.File
	for i := 1; ; i++ {
		if f == nil {
			var err error
			if f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err != nil {
				r.fail(name, "open O_APPEND", rel, err)
				f = nil
			}
		}
		if f != nil {
			if _, err := fmt.Fprintf(f, "%s %08d\n", name, i); err != nil {
				r.fail(name, "write", rel, err)
			} else if err := f.Sync(); err != nil {
				r.fail(name, "fsync", rel, err)
			} else {
				acked[i] = true
				t.acked++
				t.done = append(t.done, time.Now())
			}
		}
		if !pause(stop) {
			break
		}
	}
	if f != nil {
		if err := f.Close(); err != nil {
			r.fail(name, "close", rel, err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		r.fail(name, "read", rel, err)
		t.lost = t.acked
		return t
	}
	seen := map[int]int{}
	for line := range strings.SplitSeq(strings.TrimSuffix(string(b), "\n"), "\n") {
		var who string
		var i int
		if _, err := fmt.Sscanf(line, "%s %d", &who, &i); err != nil || who != name {
			t.corrupt++
			continue
		}
		seen[i]++
	}
	for i, c := range seen {
		if c > 1 {
			t.duplicated += c - 1
		}
		if !acked[i] {
			t.unacked++
		}
	}
	for i := range acked {
		if seen[i] == 0 {
			t.lost++
		}
	}
	return t
}

// content is what file n of writer name holds.
func content(name string, n int) []byte {
	head := fmt.Sprintf("%s f.%d\n", name, n)
	return []byte(head + strings.Repeat(strconv.Itoa(n%10), 256-len(head)-1) + "\n")
}

// check reads file n of writer name back: it must hold what was written,
// once.
func (r *run) check(t *tally, name, mnt, rel string, n int) {
	b, err := os.ReadFile(filepath.Join(mnt, rel))
	want := content(name, n)
	switch {
	case errors.Is(err, os.ErrNotExist):
		t.lost++
	case err != nil:
		r.fail(name, "read", rel, err)
	case bytes.Equal(b, want):
	case bytes.Count(b, want) > 1:
		t.duplicated++
	default:
		t.corrupt++
	}
}

// writer makes file after file in dir as an application that wants them
// durable does, until stop; then checks the files it kept.
func (r *run) writer(name, mnt, dir string, stop <-chan struct{}) *tally {
	t := &tally{}
	var kept []int
	acked := map[int]bool{}
	d, err := os.Open(filepath.Join(mnt, dir))
	if err != nil {
		r.fail(name, "open dir", dir, err)
	}
	for n := 1; ; n++ {
		if d == nil {
			if d, err = os.Open(filepath.Join(mnt, dir)); err != nil {
				r.fail(name, "open dir", dir, err)
				d = nil
			}
		}
		if d != nil && r.makeFile(name, mnt, dir, n, d) {
			t.acked++
			t.done = append(t.done, time.Now())
			acked[n] = true
			kept = append(kept, n)
			if len(kept) > *keep {
				old := filepath.Join(dir, "f."+strconv.Itoa(kept[0]))
				r.check(t, name, mnt, old, kept[0])
				// A lost file was counted by check; the unlink's ENOENT
				// says the same.
				if err := os.Remove(filepath.Join(mnt, old)); err != nil && !errors.Is(err, os.ErrNotExist) {
					r.fail(name, "unlink", old, err)
				}
				kept = kept[1:]
			}
		}
		if !pause(stop) {
			break
		}
	}
	if d != nil {
		d.Close()
	}
	for _, n := range kept {
		r.check(t, name, mnt, filepath.Join(dir, "f."+strconv.Itoa(n)), n)
	}
	// What failed attempts left.
	entries, err := os.ReadDir(filepath.Join(mnt, dir))
	if err != nil {
		r.fail(name, "readdir", dir, err)
		return t
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp.") {
			t.leftovers++
		} else if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "f.")); err == nil && !acked[n] {
			t.unacked++
		}
	}
	return t
}

// makeFile makes file n of writer name in dir (d open on it), and
// reports whether every step succeeded.
func (r *run) makeFile(name, mnt, dir string, n int, d *os.File) bool {
	tmp := filepath.Join(dir, ".tmp."+strconv.Itoa(n))
	final := filepath.Join(dir, "f."+strconv.Itoa(n))
	f, err := os.OpenFile(filepath.Join(mnt, tmp), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		r.fail(name, "open O_CREAT|O_EXCL", tmp, err)
		return false
	}
	if _, err := f.Write(content(name, n)); err != nil {
		r.fail(name, "write", tmp, err)
		f.Close()
		return false
	}
	if err := f.Sync(); err != nil {
		r.fail(name, "fsync", tmp, err)
		f.Close()
		return false
	}
	if err := f.Close(); err != nil {
		r.fail(name, "close", tmp, err)
		return false
	}
	if err := os.Rename(filepath.Join(mnt, tmp), filepath.Join(mnt, final)); err != nil {
		r.fail(name, "rename", tmp+" -> "+final, err)
		return false
	}
	if err := d.Sync(); err != nil {
		r.fail(name, "fsync dir", dir, err)
		return false
	}
	return true
}

// churn matches the names the writers make, rename and remove.
var churn = regexp.MustCompile(`^(\.tmp\.|f\.)[0-9]+$`)

// lister lists dirs and lstats every entry, over and over, until stop.
func (r *run) lister(name, mnt string, dirs []string, stop <-chan struct{}) {
	for {
		for _, dir := range dirs {
			entries, err := os.ReadDir(filepath.Join(mnt, dir))
			if err != nil {
				r.fail(name, "readdir", dir, err)
				continue
			}
			for _, e := range entries {
				rel := filepath.Join(dir, e.Name())
				var st unix.Stat_t
				err := unix.Lstat(filepath.Join(mnt, rel), &st)
				if err == unix.ENOENT && churn.MatchString(e.Name()) {
					// The writer renamed or removed it since the
					// readdir, as it may.
					r.mu.Lock()
					r.vanished++
					r.mu.Unlock()
					continue
				}
				if err != nil {
					r.fail(name, "lstat", rel, err)
				}
			}
		}
		r.mu.Lock()
		r.passes++
		r.mu.Unlock()
		if !pause(stop) {
			return
		}
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func chaos() (int, error) {
	binary, err := filepath.Abs(*bin)
	if err != nil {
		return 0, err
	}
	if _, err := os.Stat(binary); err != nil {
		return 0, fmt.Errorf("the allocfs binary: %w (make chaos builds it)", err)
	}
	root, err := os.MkdirTemp(*parent, "allocfs-chaos-")
	if err != nil {
		return 0, err
	}
	// mountinfo shows resolved paths.
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return 0, err
	}
	n := &node{root: root, data: filepath.Join(root, "data"), mnt: filepath.Join(root, "mnt"), socket: filepath.Join(root, "allocfs.sock"), bin: binary}
	defer n.cleanup()
	interrupted := make(chan os.Signal, 1)
	signal.Notify(interrupted, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-interrupted
		fmt.Fprintln(os.Stderr, "chaos: interrupted; cleaning up")
		// Workers blocked on a dead mount get ENOTCONN once neither a
		// serve nor the holder keeps its connection.
		n.cleanup()
		os.Exit(130)
	}()

	loadBefore := loadavg()
	if n.serve, err = n.start(); err != nil {
		return 0, err
	}
	if err := n.serve.ready(); err != nil {
		return 0, err
	}
	names := make([]string, *allocs)
	for i := range names {
		names[i] = fmt.Sprintf("c%02d", i+1)
		cmd := exec.Command(binary, "alloc", "create", names[i], "--task", "t")
		cmd.Env = append(os.Environ(), "ALLOCFS_SOCKET="+n.socket)
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("allocfs alloc create %s: %v\n%s", names[i], err, out)
		}
	}

	r := &run{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var tmu sync.Mutex
	tallies := map[string][]*tally{}
	collect := func(kind string, t *tally) {
		tmu.Lock()
		tallies[kind] = append(tallies[kind], t)
		tmu.Unlock()
	}
	for _, a := range names {
		data, local, secrets := a+"/alloc/data", a+"/t/local", a+"/t/secrets"
		wg.Add(4)
		go func() { defer wg.Done(); collect("appends", r.appender(a+"/append", n.mnt, data+"/log", stop)) }()
		go func() { defer wg.Done(); collect("local", r.writer(a+"/local", n.mnt, local, stop)) }()
		go func() { defer wg.Done(); collect("secrets", r.writer(a+"/secrets", n.mnt, secrets, stop)) }()
		go func() { defer wg.Done(); r.lister(a+"/lister", n.mnt, []string{data, local, secrets}, stop) }()
	}
	began := time.Now()
	fmt.Printf("chaos: %d allocations on %s (%s), %d rounds (%d kills, %d upgrades) every %v-%v, seed %d, load %s, %d CPUs\n",
		*allocs, n.root, fsType(n.root), *rounds, *rounds-*upgrades, *upgrades, *minEvery, *maxEvery, *seed, loadBefore, runtime.NumCPU())

	rng := rand.New(rand.NewSource(*seed))
	isUpgrade := map[int]bool{}
	for k := 1; k <= *upgrades; k++ {
		isUpgrade[k*(*rounds+1)/(*upgrades+1)] = true
	}
	time.Sleep(*settle)
	kills, ups := 0, 0
	var failure error
	for round := 1; round <= *rounds; round++ {
		if round > 1 {
			time.Sleep(*minEvery + time.Duration(rng.Int63n(int64(*maxEvery-*minEvery)+1)))
		}
		if isUpgrade[round] {
			ups++
			failure = n.upgrade(r, ups)
		} else {
			kills++
			failure = n.kill(r, kills)
		}
		if failure != nil {
			break
		}
		if *verbose {
			e := r.events[len(r.events)-1]
			fmt.Printf("  %s: serving again after %v\n", e, e.end.Sub(e.start).Round(time.Millisecond))
		}
	}
	time.Sleep(*settle)
	close(stop)
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(eventWait):
		return 0, errors.Join(failure, errors.New("the workers did not finish within a minute of the end: some wait on the mount"))
	}
	elapsed := time.Since(began)
	loadAfter := loadavg()

	// A full stop: it must unmount and exit 0.
	n.serve.cmd.Process.Signal(unix.SIGUSR1)
	if !n.serve.wait(eventWait) {
		failure = errors.Join(failure, errors.New("serve did not stop within a minute of SIGUSR1"))
	} else if code := n.serve.cmd.ProcessState.ExitCode(); code != 0 {
		failure = errors.Join(failure, fmt.Errorf("serve exited %d after SIGUSR1", code))
	}
	if mounted(n.mnt) {
		failure = errors.Join(failure, errors.New("the full stop left the mount"))
	}

	report(r, tallies, elapsed, loadBefore, loadAfter)
	daemonAlarms(n.root)
	if failure != nil {
		return 0, failure
	}
	bad := len(r.errs) > 0
	for _, ts := range tallies {
		for _, t := range ts {
			bad = bad || t.lost > 0 || t.duplicated > 0 || t.corrupt > 0
		}
	}
	if bad {
		fmt.Println("FAIL: the tasks noticed")
		return 1, nil
	}
	fmt.Println("PASS: no task noticed")
	return 0, nil
}

// kill kills the serving daemon with SIGKILL and starts another.
func (n *node) kill(r *run, k int) error {
	e := &event{kind: "kill", n: k, start: time.Now()}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	n.serve.kill()
	s, err := n.start()
	if err != nil {
		return err
	}
	n.serve = s
	if err := s.ready(); err != nil {
		return fmt.Errorf("%s: %w", e, err)
	}
	e.end = time.Now()
	return nil
}

// upgrade starts a second serve, which takes the mount over from the
// running one; the old one must exit 0.
func (n *node) upgrade(r *run, k int) error {
	e := &event{kind: "upgrade", n: k, start: time.Now()}
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	old := n.serve
	s, err := n.start()
	if err != nil {
		return err
	}
	if err := s.ready(); err != nil {
		s.kill()
		return fmt.Errorf("%s: %w", e, err)
	}
	n.serve = s
	if !old.wait(eventWait) {
		return fmt.Errorf("%s: the old serve did not exit within %v of handing over", e, eventWait)
	}
	e.end = time.Now()
	if code := old.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("%s: the serve that handed over exited %d", e, code)
	}
	return nil
}

func fsType(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "?"
	}
	switch st.Type {
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	}
	return fmt.Sprintf("fs 0x%x", st.Type)
}

// pct is the p-th percentile of sorted (nearest rank).
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

func dist(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s (n=%d)", ms(pct(ds, 0.5)), ms(pct(ds, 0.99)), ms(ds[len(ds)-1]), len(ds))
}

// after is where t falls: the time since the last event that started
// before it.
func after(events []*event, t time.Time) string {
	var last *event
	for _, e := range events {
		if !e.start.After(t) {
			last = e
		}
	}
	if last == nil {
		return "before any event"
	}
	return fmt.Sprintf("%s %+.3fs", last, t.Sub(last.start).Seconds())
}

// maxListed bounds the failed calls listed one by one.
const maxListed = 500

// recovery is how long after an event's end a gap still counts as the
// event's tail, not as the load's own.
const recovery = time.Second

func report(r *run, tallies map[string][]*tally, elapsed time.Duration, loadBefore, loadAfter string) {
	fmt.Printf("\n%v of load; load average %s before, %s after\n", elapsed.Round(time.Second), loadBefore, loadAfter)
	fmt.Println("\nwrites                     acknowledged  lost  duplicated  corrupt  failed-but-done  leftover .tmp")
	for _, kind := range []string{"appends", "local", "secrets"} {
		var sum tally
		for _, t := range tallies[kind] {
			sum.add(t)
		}
		label := map[string]string{"appends": "lines appended (alloc/data)", "local": "files renamed in local/", "secrets": "files renamed in secrets/"}[kind]
		fmt.Printf("%-27s %12d %5d %11d %8d %16d %14d\n", label, sum.acked, sum.lost, sum.duplicated, sum.corrupt, sum.unacked, sum.leftovers)
	}

	// Pauses: for each event, the longest gap of any writer that overlaps
	// it; the load's own gaps are those that overlap no event nor its
	// recovery.
	pauses := map[*event]time.Duration{}
	var own []time.Duration
	for _, ts := range tallies {
		for _, t := range ts {
			for i := 1; i < len(t.done); i++ {
				from, to := t.done[i-1], t.done[i]
				gap := to.Sub(from)
				quiet := true
				for _, e := range r.events {
					if from.Before(e.end) && to.After(e.start) {
						pauses[e] = max(pauses[e], gap)
					}
					if from.Before(e.end.Add(recovery)) && to.After(e.start) {
						quiet = false
					}
				}
				if quiet {
					own = append(own, gap)
				}
			}
		}
	}
	fmt.Println("\npause: the longest gap between two completed operations of any writer across each event")
	for _, kind := range []string{"kill", "upgrade"} {
		var ds, up []time.Duration
		for _, e := range r.events {
			if e.kind == kind {
				ds = append(ds, pauses[e])
				up = append(up, e.end.Sub(e.start))
			}
		}
		fmt.Printf("  per %-8s %s\n", kind+":", dist(ds))
		fmt.Printf("    (until the next serve served: %s)\n", dist(up))
	}
	fmt.Printf("  the load's own gaps (no event): %s\n", dist(own))
	var each []string
	for _, e := range r.events {
		each = append(each, fmt.Sprintf("%s %.0f", e, float64(pauses[e])/float64(time.Millisecond)))
	}
	fmt.Printf("  each event, ms: %s\n", strings.Join(each, ", "))

	fmt.Printf("\nlister: %d passes; %d entries renamed or removed by their writer between readdir and lstat (not errors)\n", r.passes, r.vanished)
	fmt.Printf("\nsystem calls that failed: %d\n", len(r.errs))
	byKind := map[string]int{}
	for _, e := range r.errs {
		byKind[e.op+" "+e.errno]++
	}
	var kinds []string
	for k := range byKind {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool {
		return byKind[kinds[i]] > byKind[kinds[j]] || byKind[kinds[i]] == byKind[kinds[j]] && kinds[i] < kinds[j]
	})
	for _, k := range kinds {
		fmt.Printf("  %4d  %s\n", byKind[k], k)
	}
	sort.Slice(r.errs, func(i, j int) bool { return r.errs[i].at.Before(r.errs[j].at) })
	for i, e := range r.errs {
		if i == maxListed {
			fmt.Printf("  ... and %d more\n", len(r.errs)-maxListed)
			break
		}
		fmt.Printf("  %-18s %-20s %-8s %s  (%s)\n", after(r.events, e.at), e.op, e.errno, e.path, e.worker)
	}
}

// levelLine matches a WARN or ERROR line of serve's log, and its message.
var levelLine = regexp.MustCompile(`\[(WARN|ERROR)\] +[a-z.]+: (.*?)(?:: [a-z_]+=|$)`)

// daemonAlarms prints what the serves logged at WARN and ERROR, by
// message.
func daemonAlarms(root string) {
	logs, _ := filepath.Glob(filepath.Join(root, "serve-*.log"))
	count := map[string]int{}
	total := 0
	for _, l := range logs {
		f, err := os.Open(l)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if m := levelLine.FindStringSubmatch(sc.Text()); m != nil {
				count[m[1]+" "+m[2]]++
				total++
			}
		}
		f.Close()
	}
	fmt.Printf("\nserve's log (%d starts): %d lines at WARN or ERROR\n", len(logs), total)
	var msgs []string
	for m := range count {
		msgs = append(msgs, m)
	}
	sort.Strings(msgs)
	for _, m := range msgs {
		fmt.Printf("  %4d  %s\n", count[m], m)
	}
}
