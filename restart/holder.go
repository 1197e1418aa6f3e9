//go:build linux

package restart

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// The holder. A FUSE connection lives while any process holds its
// /dev/fuse file; serve starts this small process with a copy, so that a
// crash of the daemon (kill -9, the OOM killer) leaves the mount waiting
// for the next daemon instead of dead: requests wait in the kernel's
// queue, and the next serve takes the file from the holder, and has the
// kernel resend what the dead daemon had read (fs.AdoptMount).
//
// The holder also keeps the memory volumes' tmpfs descriptors (fs's
// MemoryKeeper): a task's secrets live while any descriptor of their
// instance is open, and so outlive the daemon as the connection does.
//
// The holder does nothing else: it never reads the connection, opens no
// data, and answers these requests on a unix socket only its own user
// can reach, one line each (a key is a memory volume's
// "<alloc>/<task>/<secrets|private>", path-escaped):
//
//	version     "allocfs-holder 2"
//	fd          "ok", with the connection's descriptor (SCM_RIGHTS)
//	pid         its PID
//	keep KEY    sent with a descriptor: it keeps it under KEY (closing
//	            one it kept there before); "ok"
//	drop KEY    it closes what it keeps under KEY; "ok"
//	names       the keys it keeps, one per line (none: the stream ends)
//	get KEY     "ok", with the descriptor kept under KEY; "none" if none
//	stop        "ok", and it exits: a full stop whose unmount had to be
//	            lazy ends the connection so, for the files still open
//
// It ends when the connection does (an unmount, an abort), which the
// kernel tells it by polling the file as an error; what it keeps goes
// with it. Version 1 had no memory requests; a serve takes a mount over
// from a holder of either version, and replaces one of version 1.

// Protocol is the version of the holder's requests; a serve that
// finds a holder of a version it does not know refuses to take the mount
// over.
const Protocol = 2

// Version is the answer to "version" of a holder of protocol v.
func Version(v int) string { return fmt.Sprintf("allocfs-holder %d", v) }

// ProtocolOf is the protocol a holder's "version" answer names,
// or 0 for one this allocfs cannot take a mount over from.
func ProtocolOf(version string) int {
	for v := 1; v <= Protocol; v++ {
		if version == Version(v) {
			return v
		}
	}
	return 0
}

// HolderFD is the descriptor the holder gets the connection on.
const HolderFD = 3

// Connection is the mount whose connection a holder keeps (fs.Mount).
type Connection interface {
	// FuseFd returns the connection's /dev/fuse descriptor, which stays
	// the mount's; false when it cannot be held.
	FuseFd() (int, bool)
	// ConnectionEnded reports whether the kernel ended the connection.
	ConnectionEnded() bool
	// KeepMemory hands the memory volumes to k, from now on.
	KeepMemory(k MemoryKeeper) error
}

// MemoryKeeper keeps the memory volumes' descriptors while no daemon
// runs, under the volume's key ("<alloc>/<task>/secrets"): HolderKeeper
// and SystemdKeeper.
type MemoryKeeper interface {
	// Keep stores a copy of fd; fd stays the caller's.
	Keep(key string, fd int) error
	// Drop closes the copy of key's volume, if one is kept.
	Drop(key string) error
}

// HolderSocket is where the holder of dataDir's connection answers.
func HolderSocket(dataDir string) string {
	return StateFile(dataDir, "holder.sock")
}

// ServeHolder is the holder: it keeps the connection it got as HolderFD,
// answers on socket until the connection ends or it is told to stop, and
// returns then; what it keeps goes with it.
func ServeHolder(socket string) error {
	var st unix.Stat_t
	if err := unix.Fstat(HolderFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("fd %d is not the FUSE connection (%v)", HolderFD, err)
	}
	os.Remove(socket)
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", socket)
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", socket, err)
	}
	defer os.Remove(socket)
	go func() {
		// Events 0: only an error or a hang-up is reported, never the
		// requests waiting to be read.
		fds := []unix.PollFd{{Fd: HolderFD}}
		for {
			if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
				break
			}
			if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				break
			}
		}
		ln.Close()
	}()
	kept := make(map[string]int)
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		if serveHolderRequest(c.(*net.UnixConn), kept) {
			return nil
		}
	}
}

// serveHolderRequest answers one request of a peer of the holder's own
// user, and reports whether it was told to stop. kept are the memory
// volumes' descriptors it keeps, by key.
func serveHolderRequest(c *net.UnixConn, kept map[string]int) bool {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if err != nil || cred.Uid != uint32(os.Geteuid()) {
		return false
	}
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return false
	}
	fds := receivedFds(oob[:oobn])
	line, _, _ := strings.Cut(string(buf[:n]), "\n")
	verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	key, kerr := url.PathUnescape(arg)
	if arg != "" && kerr != nil {
		key = ""
	}
	switch verb {
	case "version":
		fmt.Fprintln(c, Version(Protocol))
	case "pid":
		fmt.Fprintf(c, "%d\n", os.Getpid())
	case "fd":
		c.WriteMsgUnix([]byte("ok\n"), unix.UnixRights(HolderFD), nil)
	case "keep":
		if key == "" || len(fds) != 1 {
			io.WriteString(c, "error: keep needs a key and one descriptor\n")
			break
		}
		if old, ok := kept[key]; ok {
			unix.Close(old)
		}
		kept[key] = fds[0]
		fds = nil
		io.WriteString(c, "ok\n")
	case "drop":
		if old, ok := kept[key]; ok {
			unix.Close(old)
			delete(kept, key)
		}
		io.WriteString(c, "ok\n")
	case "names":
		var b strings.Builder
		for k := range kept {
			b.WriteString(url.PathEscape(k) + "\n")
		}
		io.WriteString(c, b.String())
	case "get":
		if fd, ok := kept[key]; ok {
			c.WriteMsgUnix([]byte("ok\n"), unix.UnixRights(fd), nil)
		} else {
			io.WriteString(c, "none\n")
		}
	case "stop":
		io.WriteString(c, "ok\n")
		return true
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	return false
}

// receivedFds are the descriptors a control message carried.
func receivedFds(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// AskHolder sends request to the holder at socket and returns its answer
// line and, for "fd", the descriptor.
func AskHolder(socket, request string) (string, int, error) {
	answer, fd, err := askHolderWith(socket, request, -1)
	return strings.TrimSpace(answer), fd, err
}

// askHolderWith sends request, with descriptor send unless it is -1, and
// returns the whole answer and the descriptor that came with it, or -1.
func askHolderWith(socket, request string, send int) (string, int, error) {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return "", -1, err
	}
	defer c.Close()
	uc := c.(*net.UnixConn)
	uc.SetDeadline(time.Now().Add(5 * time.Second))
	var rights []byte
	if send >= 0 {
		rights = unix.UnixRights(send)
	}
	if _, _, err := uc.WriteMsgUnix([]byte(request+"\n"), rights, nil); err != nil {
		return "", -1, err
	}
	var answer []byte
	fd := -1
	for {
		buf := make([]byte, 64<<10)
		oob := make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
		if fds := receivedFds(oob[:oobn]); len(fds) > 0 {
			for _, extra := range fds[1:] {
				unix.Close(extra)
			}
			if fd < 0 {
				fd = fds[0]
			} else {
				unix.Close(fds[0])
			}
		}
		answer = append(answer, buf[:n]...)
		// The end of the stream comes wrapped in a *net.OpError: an
		// answer may be empty ("names" of a holder that keeps nothing).
		if errors.Is(err, io.EOF) || n == 0 && err == nil {
			return string(answer), fd, nil
		}
		if err != nil {
			// What the holder said stands: Linux ends the stream with
			// ECONNRESET rather than EOF when the holder closed with
			// part of the request unread.
			if len(answer) > 0 {
				return string(answer), fd, nil
			}
			if fd >= 0 {
				unix.Close(fd)
			}
			return "", -1, err
		}
	}
}

// heldConnection returns the FUSE connection a holder keeps for dataDir,
// the holder's PID and its protocol; errNoHolder when none answers.
func heldConnection(dataDir string) (int, int, int, error) {
	socket := HolderSocket(dataDir)
	version, _, err := AskHolder(socket, "version")
	if err != nil {
		return -1, 0, 0, fmt.Errorf("%w: %v", errNoHolder, err)
	}
	v := ProtocolOf(version)
	if v == 0 {
		return -1, 0, 0, fmt.Errorf("the holder of the mount speaks %q; this allocfs takes over from %q and earlier only", version, Version(Protocol))
	}
	pidText, _, err := AskHolder(socket, "pid")
	if err != nil {
		return -1, 0, 0, fmt.Errorf("asking the holder its PID: %w", err)
	}
	pid, _ := strconv.Atoi(pidText)
	answer, fd, err := AskHolder(socket, "fd")
	if err != nil || answer != "ok" || fd < 0 {
		return -1, 0, 0, fmt.Errorf("the holder did not hand the FUSE connection over (%q, %v)", answer, err)
	}
	return fd, pid, v, nil
}

var errNoHolder = errors.New("no holder answers")

// HolderAlive reports whether the holder of dataDir's connection answers.
func HolderAlive(dataDir string) bool {
	v, _, err := AskHolder(HolderSocket(dataDir), "version")
	return err == nil && v != ""
}

// StartHolder starts a holder of fd for dataDir, in a session of its own
// (so that the terminal's signals, and the daemon's end, leave it be),
// and waits until it answers.
func StartHolder(dataDir string, fd int) (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("failed to find the allocfs binary: %w", err)
	}
	socket := HolderSocket(dataDir)
	// A copy, which the os.File may close: fd stays the mount's.
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("failed to copy the FUSE descriptor for its holder: %w", err)
	}
	f := os.NewFile(uintptr(dup), "fuse")
	defer f.Close()
	cmd := exec.Command(self, "fuse-holder", "--socket", socket)
	cmd.ExtraFiles = []*os.File{f}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("failed to start the FUSE connection's holder: %w", err)
	}
	go cmd.Wait()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if v, _, err := AskHolder(socket, "version"); err == nil && v != "" {
			return cmd.Process.Pid, nil
		}
	}
	cmd.Process.Kill()
	return 0, errors.New("the FUSE connection's holder did not answer within 5 s")
}

// ReplaceHolder stops the holder of dataDir, which m's daemon took the
// connection from, and starts a new one for m's connection, which then
// keeps m's memory volumes too. m holds the connection meanwhile.
func ReplaceHolder(dataDir string, m Connection) (int, error) {
	fd, ok := m.FuseFd()
	if !ok {
		return 0, errors.New("the mount's connection cannot be held")
	}
	socket := HolderSocket(dataDir)
	if _, _, err := AskHolder(socket, "stop"); err != nil {
		return 0, fmt.Errorf("failed to stop the holder being replaced: %w", err)
	}
	for deadline := time.Now().Add(5 * time.Second); HolderAlive(dataDir); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return 0, errors.New("the holder being replaced did not stop within 5 s")
		}
	}
	pid, err := StartHolder(dataDir, fd)
	if err != nil {
		return 0, err
	}
	return pid, m.KeepMemory(HolderKeeper{Socket: socket})
}

// WatchHolder replaces the holder of dataDir, whose PID is pid, when it
// dies while m's daemon runs: without one, a crash of the daemon would
// end the mount and every task's secrets. It says so once per death.
// stop ends the watch; its return waits for the watcher.
func WatchHolder(logger hclog.Logger, dataDir string, m Connection, pid int) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			pidfd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				logger.Error("cannot watch the FUSE connection's holder", "holder_pid", pid, "error", err)
				return
			}
			exited := make(chan struct{})
			go func() {
				fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
				for {
					if _, err := unix.Poll(fds, 200); err != nil && err != unix.EINTR {
						break
					}
					if fds[0].Revents != 0 {
						close(exited)
						return
					}
					select {
					case <-done:
						return
					default:
					}
				}
			}()
			select {
			case <-done:
				unix.Close(pidfd)
				return
			case <-exited:
				unix.Close(pidfd)
			}
			select {
			case <-done:
				return
			default:
			}
			if m.ConnectionEnded() {
				return
			}
			logger.Error("the FUSE connection's holder died: until a new one runs, a crash of this daemon ends the mount and the tasks' secrets; starting another", "holder_pid", pid)
			fd, ok := m.FuseFd()
			if !ok {
				return
			}
			if pid, err = StartHolder(dataDir, fd); err != nil {
				logger.Error("no holder keeps the FUSE connection: a crash of this daemon ends the mount", "error", err)
				return
			}
			if err := m.KeepMemory(HolderKeeper{Socket: HolderSocket(dataDir)}); err != nil {
				logger.Error("the new holder did not take every memory volume: those end with this daemon", "error", err)
			}
			logger.Info("a new holder keeps the FUSE connection and the memory volumes", "holder_pid", pid)
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}
