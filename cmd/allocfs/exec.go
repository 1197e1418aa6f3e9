//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/internal/taskproc"
	"github.com/allocfs/allocfs/logmon"
	"github.com/hashicorp/go-hclog"
)

// defaultKillTimeout is Nomad's default kill_timeout.
const defaultKillTimeout = 5 * time.Second

// execDrainGrace is how long, once the task has exited, its output may
// take to end: a process it left behind can hold the FIFOs open forever.
const execDrainGrace = 2 * time.Second

// exitProcess ends allocfs with the task's exit code. The command table
// maps errors to 1 and 2 only; exec must pass on any code, as a shell
// does.
var exitProcess = os.Exit

func runExec(e *env, args []string) error {
	const cmd = "allocfs exec"
	fset := newFlagSet(e, cmd, "ID TASK [flags] -- COMMAND [ARGS...]", `
Run COMMAND as the task TASK of allocation ID, the way Nomad's raw_exec
driver runs a task: in the task directory (<mount>/ID/TASK), with the
caller's environment plus NOMAD_ALLOC_DIR, NOMAD_TASK_DIR,
NOMAD_SECRETS_DIR, NOMAD_ALLOC_ID and NOMAD_TASK_NAME, and stdin from
/dev/null.

Its stdout and stderr go through FIFOs in alloc/logs to rotating files,
alloc/logs/TASK.stdout.N and TASK.stderr.N: a file is rotated at
--max-file-size (or just after, to end a line), and after a rotation only
the newest --max-files files of each stream are kept. A new run appends to
the newest file.

When the task's main process exits, whatever it started is ended too:
SIGTERM to every process left, SIGKILL after --kill-timeout, as Nomad
does with kill_timeout. The processes are found through a cgroup v2 made
for the task, which a double fork or setsid cannot leave, or, where
exec cannot make one, as its descendants (exec is a child subreaper;
ALLOCFS_EXEC_NO_CGROUP=1 forces this). --log-level info shows which.
SIGINT and SIGTERM are passed on to the task's process group; if the
task is still running --kill-timeout later, it is killed.

The exit code is the task's (128+N when signal N ended it), even if some
of its output could not be written to the log files (that is reported on
stderr, with the number of bytes lost); 1 if the task could not be
started, 2 for a wrong command line.`)
	socket := socketFlag(e, fset)
	userName := fset.String("user", "", "run as `USER` (name or uid), with its groups; needs root")
	maxFiles := fset.Int("max-files", logmon.DefaultMaxFiles, "keep the newest `N` log files of each stream")
	maxSizeMB := fset.Int("max-file-size", logmon.DefaultMaxFileSizeMB, "size of a log file, in `MiB`, at which it is rotated")
	killTimeout := fset.Duration("kill-timeout", defaultKillTimeout, "time the task's processes have between SIGTERM and SIGKILL, a `DURATION` (5s, 1m)")
	logLevel := fset.String("log-level", "warn", "log `level` of exec's own messages: trace, debug, info, warn or error")
	if err := parseFlags(fset, args, 0, -1); err != nil {
		return err
	}
	// Without --, the command's own flags would be taken for exec's.
	switch dash := fset.ArgsLenAtDash(); {
	case dash < 0:
		return usageErrorf(cmd, "expected ID TASK -- COMMAND [ARGS...]: the command goes after --")
	case dash != 2:
		return usageErrorf(cmd, "expected ID TASK before --, got %d argument(s)", dash)
	case fset.NArg() == 2:
		return usageErrorf(cmd, "no command after --")
	}
	if *maxFiles < 1 {
		return usageErrorf(cmd, "--max-files must be at least 1, got %d", *maxFiles)
	}
	if *maxSizeMB < 1 {
		return usageErrorf(cmd, "--max-file-size must be at least 1 (MiB), got %d", *maxSizeMB)
	}
	if *killTimeout < 0 {
		return usageErrorf(cmd, "--kill-timeout must not be negative, got %v", *killTimeout)
	}
	level := hclog.LevelFromString(*logLevel)
	if level == hclog.NoLevel {
		return usageErrorf(cmd, "unknown --log-level %q: use trace, debug, info, warn or error", *logLevel)
	}
	id, task, argv := fset.Arg(0), fset.Arg(1), fset.Args()[2:]
	if err := checkAllocID(id); err != nil {
		return err
	}
	if err := allocdir.ValidTaskName(task); err != nil {
		return fmt.Errorf("invalid task name: %w", err)
	}
	var cred *syscall.Credential
	if *userName != "" {
		c, err := lookupCredential(*userName)
		if err != nil {
			return err
		}
		cred = c
	}

	code, err := execTask(e, execRequest{
		socket: *socket,
		id:     id,
		task:   task,
		argv:   argv,
		cred:   cred,
		logs:   logmon.Config{MaxFiles: *maxFiles, MaxFileSizeMB: *maxSizeMB},
		grace:  *killTimeout,
		level:  level,
	})
	if err != nil {
		return err
	}
	if code != exitOK {
		exitProcess(code)
	}
	return nil
}

// execRequest is what `allocfs exec` was asked to run.
type execRequest struct {
	socket   string
	id, task string
	argv     []string
	cred     *syscall.Credential // nil: as the caller
	logs     logmon.Config
	grace    time.Duration // between SIGTERM and SIGKILL
	level    hclog.Level   // of exec's own log
}

// execTask runs the task to its end and returns its exit code. Every
// resource it took is released before it returns, so that the caller may
// exit at once.
func execTask(e *env, req execRequest) (int, error) {
	// Registered before anything else: a signal that arrives while the
	// task is being set up must not kill allocfs with the FIFOs in place.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	allocPath, err := lookupTask(req.socket, req.id, req.task)
	if err != nil {
		return 0, err
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "allocfs", Output: e.stderr, Level: req.level}).
		Named("exec").With("alloc_id", req.id, "task", req.task)
	return runTask(logger, allocPath, req, sigs)
}

// runTask runs the task in the allocation mounted at allocPath, passing
// on the signals that arrive on sigs, and ends every process the task
// started once its main process has exited.
func runTask(logger hclog.Logger, allocPath string, req execRequest, sigs <-chan os.Signal) (int, error) {
	logDir := path.Join(allocdir.SharedAllocName, allocdir.LogDirName)
	dir, err := logmon.OpenDir(allocPath, logDir)
	if err != nil {
		return 0, err
	}
	defer dir.Close()
	mon, err := logmon.Start(logger, dir, req.task, req.logs)
	if err != nil {
		return 0, fmt.Errorf("failed to set up the logs of task %s: %w", req.task, err)
	}
	procs := taskproc.Track(logger)
	defer func() {
		if cerr := procs.Close(); cerr != nil {
			logger.Warn("cannot clean up after the task", "error", cerr)
		}
	}()

	taskDir := filepath.Join(allocPath, req.task)
	newCmd := func() *exec.Cmd {
		cmd := exec.Command(req.argv[0], req.argv[1:]...)
		cmd.Dir = taskDir
		cmd.Env = taskEnv(os.Environ(), allocPath, req.id, req.task)
		cmd.Stdout, cmd.Stderr = mon.Stdout(), mon.Stderr()
		// Its own process group: signals reach everything the task
		// started, and a Ctrl-C on the terminal reaches the task once,
		// through us.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: req.cred}
		procs.Prepare(cmd.SysProcAttr)
		return cmd
	}

	select {
	case sig := <-sigs:
		mon.CloseWriters()
		return 0, errors.Join(fmt.Errorf("interrupted by %v before task %s started", sig, req.task), mon.Stop(execDrainGrace))
	default:
	}
	cmd := newCmd()
	startErr := cmd.Start()
	if startErr != nil && procs.RetryStart(startErr) {
		cmd = newCmd()
		startErr = cmd.Start()
	}
	mon.CloseWriters()
	if startErr != nil {
		if req.cred != nil && errors.Is(startErr, syscall.EACCES) {
			// The child reports a failed chdir as its exec failing.
			startErr = fmt.Errorf("%w (can uid %d reach %s and the command?)", startErr, req.cred.Uid, taskDir)
		}
		return 0, errors.Join(fmt.Errorf("failed to start task %s of allocation %q: %w", req.task, req.id, startErr), mon.Stop(execDrainGrace))
	}
	procs.Started(cmd.Process.Pid)

	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var waitErr error
	// Armed by the first signal: a task that does not exit by then is
	// killed, as Nomad does after kill_timeout.
	var killTimer <-chan time.Time
wait:
	for {
		select {
		case sig := <-sigs:
			procs.SignalGroup(sig.(syscall.Signal))
			if killTimer == nil {
				killTimer = time.After(req.grace)
			}
		case <-killTimer:
			logger.Warn("the task is still running after the kill timeout: killing it", "kill_timeout", req.grace)
			procs.KillAll()
		case waitErr = <-waited:
			break wait
		}
	}
	// Whatever the task left running is ended before its output is
	// drained: then the FIFOs end with it and nothing is cut off.
	if err := procs.Terminate(req.grace); err != nil {
		logger.Error("processes of the task are left running", "error", err)
	}
	logErr := mon.Stop(execDrainGrace)
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		return 0, errors.Join(fmt.Errorf("failed to wait for task %s: %w", req.task, waitErr), logErr)
	}
	if logErr != nil {
		// The exit code is the task's: a lost log line does not make a
		// task that succeeded fail, nor hide why one failed.
		logger.Error("the task's logs are incomplete", "lost_bytes", mon.Lost(), "error", logErr)
	}
	return exitCode(cmd.ProcessState), nil
}

// lookupTask asks the daemon where allocation id is mounted, and checks
// that it is running and has task.
func lookupTask(socket, id, task string) (string, error) {
	ctx, c, done := dial(socket)
	defer done()
	st, err := c.AllocStatus(ctx, id)
	if err != nil {
		if errors.Is(err, allocdir.ErrUnknownAlloc) {
			return "", fmt.Errorf("cannot run task %s: %w", task, err)
		}
		return "", err
	}
	if st.Status != api.StatusRunning {
		return "", fmt.Errorf("allocation %q is %s: its directories no longer take new output", id, st.Status)
	}
	for _, t := range st.Tasks {
		if t.Name == task {
			return st.Mount, nil
		}
	}
	return "", fmt.Errorf("allocation %q has no task %q; its tasks: %s", id, task, strings.Join(st.TaskNames(), ", "))
}

// taskEnv is environ with the variables raw_exec gives a task, which
// replace any the caller had.
func taskEnv(environ []string, allocPath, id, task string) []string {
	taskDir := filepath.Join(allocPath, task)
	set := [][2]string{
		{"NOMAD_ALLOC_DIR", filepath.Join(allocPath, allocdir.SharedAllocName)},
		{"NOMAD_TASK_DIR", filepath.Join(taskDir, allocdir.TaskLocal)},
		{"NOMAD_SECRETS_DIR", filepath.Join(taskDir, allocdir.TaskSecrets)},
		{"NOMAD_ALLOC_ID", id},
		{"NOMAD_TASK_NAME", task},
	}
	out := make([]string, 0, len(environ)+len(set))
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "NOMAD_") || !isSet(set, k) {
			out = append(out, kv)
		}
	}
	for _, kv := range set {
		out = append(out, kv[0]+"="+kv[1])
	}
	return out
}

func isSet(set [][2]string, key string) bool {
	for _, kv := range set {
		if kv[0] == key {
			return true
		}
	}
	return false
}

// lookupCredential resolves a user name or uid to the identity the task
// runs with: uid, primary gid and every group the user is a member of.
// The groups are always set, so that the task never keeps the caller's
// (root's) supplementary groups.
func lookupCredential(name string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("--user %s: running a task as another user needs root", name)
	}
	o, err := allocdir.LookupUser(name)
	if err != nil {
		return nil, err
	}
	cred := &syscall.Credential{Uid: uint32(o.UID), Gid: uint32(o.GID), Groups: []uint32{uint32(o.GID)}}
	u, err := user.LookupId(strconv.Itoa(o.UID))
	if err != nil {
		return cred, nil
	}
	ids, err := u.GroupIds()
	if err != nil {
		return nil, fmt.Errorf("failed to look up the groups of user %q: %w", name, err)
	}
	for _, id := range ids {
		gid, err := strconv.ParseUint(id, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("user %q is in group %q, which is not numeric", name, id)
		}
		if uint32(gid) != cred.Gid {
			cred.Groups = append(cred.Groups, uint32(gid))
		}
	}
	return cred, nil
}

// exitCode is the code a shell would report for the finished task.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
