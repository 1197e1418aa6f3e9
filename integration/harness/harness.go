// Package harness runs the real allocfs binary for tests: it builds it
// once per test binary, starts `allocfs serve` on directories a test
// chooses, waits until the daemon listens and its mount is up, and always
// cleans up (kill by PID, lazy unmount) however the test ends. The mount
// tests of cmd/allocfs and of package integration share it.
package harness

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// FSType is the type /proc/self/mountinfo and df show for an allocfs
// mount.
const FSType = "fuse.allocfs"

// Timeout bounds how long a daemon may take to come up or go down, and
// how long one command may run: a hung mount must fail the test, not hang
// the package.
const Timeout = 60 * time.Second

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// Main runs the tests and removes the binary built for them. Call it from
// TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// RaceEnabled reports whether the test binary was built with -race; the
// daemon is then built with it too.
func RaceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// Binary builds ./cmd/allocfs once per test binary run and returns its
// path.
func Binary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "allocfs-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "allocfs")
		args := []string{"build", "-o", binPath}
		if RaceEnabled() {
			args = append(args, "-race")
		}
		args = append(args, "github.com/allocfs/allocfs/cmd/allocfs")
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if binErr != nil {
		t.Fatalf("cannot build allocfs: %v", binErr)
	}
	return binPath
}

// Result is what a finished command left.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Run runs cmd to completion, bounded by Timeout, and returns what it
// left; what names the command in logs. On timeout the command's whole
// process group is killed: a script's children may hold its pipes open.
func Run(t testing.TB, cmd *exec.Cmd, what string) Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(Timeout):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-waited
		t.Fatalf("%s: still running after %v\nstdout:\n%s\nstderr:\n%s", what, Timeout, &stdout, &stderr)
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		t.Fatalf("%s: %v", what, err)
	}
	r := Result{Stdout: stdout.String(), Stderr: stderr.String(), Code: cmd.ProcessState.ExitCode()}
	if testing.Verbose() {
		t.Logf("%s\nexit %d\nstdout:\n%s\nstderr:\n%s", what, r.Code, r.Stdout, r.Stderr)
	}
	return r
}

// Daemon is an `allocfs serve` process started by a test.
type Daemon struct {
	DataDir, Mount, Socket string
	// Out is the daemon's stdout and stderr, across restarts.
	Out *allocdirtest.SyncBuffer
	// Prefix runs the daemon under another command (nsenter into a
	// network namespace, say); Args are extra flags of serve.
	Prefix, Args []string
	// Env are extra environment variables ("K=V") and ExtraFiles extra
	// descriptors (from 3 on), as systemd passes them.
	Env        []string
	ExtraFiles []*os.File

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start runs `allocfs serve` on dataDir and mnt with its control socket
// at socket, and waits until the socket answers and an allocfs mount is
// at mnt. Cleanup kills the daemon by PID unless it has exited, detaches
// the mount lazily, and fails the test if a daemon built with -race
// reported a data race (one killed by SIGKILL cannot say so in its exit
// code).
func Start(t testing.TB, dataDir, mnt, socket string) *Daemon {
	t.Helper()
	return StartDaemon(t, &Daemon{DataDir: dataDir, Mount: mnt, Socket: socket})
}

// StartDaemon is Start for a daemon with a Prefix or extra Args.
func StartDaemon(t testing.TB, d *Daemon) *Daemon {
	t.Helper()
	d.Out = &allocdirtest.SyncBuffer{}
	mnt := d.Mount
	t.Cleanup(func() {
		d.Kill()
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Logf("detach %s: %v", mnt, err)
		}
		StopHolder(d.DataDir)
		if strings.Contains(d.Out.String(), "WARNING: DATA RACE") {
			t.Errorf("the race detector found a data race in allocfs serve")
		}
		if t.Failed() {
			t.Logf("allocfs serve output:\n%s", d.Out)
		}
	})
	d.start(t)
	return d
}

func (d *Daemon) start(t testing.TB) {
	t.Helper()
	level := "info"
	if testing.Verbose() {
		level = "debug"
	}
	args := []string{Binary(t), "serve", "--data-dir", d.DataDir, "--mount", d.Mount, "--socket", d.Socket}
	if !slices.ContainsFunc(d.Args, func(a string) bool { return a == "--config" || strings.HasPrefix(a, "--config=") }) {
		// A daemon with a --config file takes its level from the file:
		// the command line's would win over it.
		args = append(args, "--log-level", level)
	}
	args = append(args, d.Args...)
	args = append(append([]string(nil), d.Prefix...), args...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = d.Out, d.Out
	cmd.Env = append(os.Environ(), d.Env...)
	cmd.ExtraFiles = d.ExtraFiles
	if err := cmd.Start(); err != nil {
		t.Fatalf("start allocfs serve: %v", err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	d.cmd, d.done = cmd, done
	d.waitReady(t)
}

// waitReady waits until the socket answers and the mount point carries an
// allocfs mount; a stale mount alone, left by a killed daemon, does not
// pass, because the new daemon only listens once it has started mounting.
func (d *Daemon) waitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for time.Now().Before(deadline) {
		select {
		case <-d.done:
			t.Fatalf("allocfs serve exited early with %v:\n%s", d.cmd.ProcessState, d.Out)
		default:
		}
		if conn, err := net.Dial("unix", d.Socket); err == nil {
			conn.Close()
			if MountsAt(t, d.Mount) >= 1 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("allocfs serve not ready (socket %s, mount %s) within %v:\n%s", d.Socket, d.Mount, Timeout, d.Out)
}

// StopHolder ends the holder of the FUSE connection of dataDir, if one
// runs (restart/holder.go): the connection ends with it, unless a
// daemon serves it.
func StopHolder(dataDir string) {
	c, err := net.DialTimeout("unix", filepath.Join(dataDir, "fuse", "holder.sock"), time.Second)
	if err != nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write([]byte("stop\n"))
	c.Read(make([]byte, 8))
}

// Wait waits for the daemon to exit by itself and returns its exit code.
func (d *Daemon) Wait(t testing.TB) int {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(Timeout):
		t.Fatalf("allocfs serve did not exit within %v:\n%s", Timeout, d.Out)
	}
	return d.cmd.ProcessState.ExitCode()
}

// Exited is closed once the daemon has exited.
func (d *Daemon) Exited() <-chan struct{} { return d.done }

// Pid is the daemon's process ID.
func (d *Daemon) Pid() int { return d.cmd.Process.Pid }

// Kill kills the daemon by PID unless it has exited, and waits for it.
func (d *Daemon) Kill() {
	if d.cmd == nil {
		return
	}
	select {
	case <-d.done:
	default:
		d.cmd.Process.Kill()
		<-d.done
	}
}

// Signal sends sig, waits for the daemon to exit and returns its exit
// code (-1 when a signal ended it).
func (d *Daemon) Signal(t testing.TB, sig os.Signal) int {
	t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to allocfs serve: %v", sig, err)
	}
	select {
	case <-d.done:
	case <-time.After(Timeout):
		t.Fatalf("allocfs serve did not exit within %v of %v:\n%s", Timeout, sig, d.Out)
	}
	return d.cmd.ProcessState.ExitCode()
}

// Restart starts the daemon again on the same directories, killing the
// running one first.
func (d *Daemon) Restart(t testing.TB) {
	t.Helper()
	d.Kill()
	d.start(t)
}

// Upgrade starts a second serve on the same directories and flags while
// this one runs, as an upgrade of the binary does: the new one takes the
// live mount over and the old one exits. It returns the old one's exit
// code. The Daemon is the new one from then on, so that the cleanup
// StartDaemon registered, in its place among the test's cleanups, stops
// it; should the new one fail, it is the old one again.
func (d *Daemon) Upgrade(t testing.TB) int {
	t.Helper()
	old, oldDone := d.cmd, d.done
	upgraded := false
	defer func() {
		if !upgraded {
			d.Kill()
			d.cmd, d.done = old, oldDone
		}
	}()
	d.start(t)
	// The old daemon answers on the socket until it hands over: start's
	// wait may end before the new one serves, the old one's exit does
	// not.
	select {
	case <-oldDone:
	case <-time.After(Timeout):
		t.Fatalf("allocfs serve did not hand its mount over within %v:\n%s", Timeout, d.Out)
	}
	upgraded = true
	return old.ProcessState.ExitCode()
}

// MountsAt counts the allocfs mounts at dir.
func MountsAt(t testing.TB, dir string) int {
	t.Helper()
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, m := range mounts {
		if m.MountPoint == dir && m.FSType == FSType {
			count++
		}
	}
	return count
}

// ChrootEnvFlag is env, a Nomad chroot_env, in serve's --chroot-env form:
// SRC, or SRC=DEST where they differ, sorted and comma-separated.
func ChrootEnvFlag(env map[string]string) string {
	var parts []string
	for src, dst := range env {
		if src == dst {
			parts = append(parts, src)
		} else {
			parts = append(parts, src+"="+dst)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
