//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs"
	"golang.org/x/sys/unix"
)

// The holder. A FUSE connection lives while any process holds its
// /dev/fuse file; serve starts this small process with a copy, so that a
// crash of the daemon (kill -9, the OOM killer) leaves the mount waiting
// for the next daemon instead of dead: requests wait in the kernel's
// queue, and the next serve takes the file from the holder, and has the
// kernel resend what the dead daemon had read (fs.AdoptMount).
//
// The holder does nothing else: it never reads the connection, opens no
// data, and answers three requests on a unix socket only its own user
// can reach, one line each:
//
//	version   "allocfs-holder 1"
//	fd        "ok", with the descriptor (SCM_RIGHTS)
//	pid       its PID
//	stop      "ok", and it exits: a full stop whose unmount had to be
//	          lazy ends the connection so, for the files still open
//
// It ends when the connection does (an unmount, an abort), which the
// kernel tells it by polling the file as an error.

// holderProtocol is the version of the holder's requests; a serve that
// finds a holder of another version refuses to take the mount over.
const holderProtocol = 1

// holderFD is the descriptor the holder gets the connection on.
const holderFD = 3

func holderSocket(dataDir string) string {
	return fs.StateFile(dataDir, "holder.sock")
}

func runHolder(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs fuse-holder", "--socket PATH", `
Hold a FUSE connection (its /dev/fuse descriptor as fd 3) while the daemon
that serves it restarts; started by serve, not by hand.`)
	var socket string
	fset.StringVar(&socket, "socket", "", "unix socket `path` to answer on")
	if err := parseFlags(fset, args, 0, 0); err != nil {
		return err
	}
	if socket == "" {
		return usageErrorf("allocfs fuse-holder", "--socket is required")
	}
	var st unix.Stat_t
	if err := unix.Fstat(holderFD, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("fd %d is not the FUSE connection (%v)", holderFD, err)
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
		fds := []unix.PollFd{{Fd: holderFD}}
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
	for {
		c, err := ln.Accept()
		if err != nil {
			return nil
		}
		if serveHolderRequest(c.(*net.UnixConn)) {
			return nil
		}
	}
}

// serveHolderRequest answers one request of a peer of the holder's own
// user, and reports whether it was told to stop.
func serveHolderRequest(c *net.UnixConn) bool {
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
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return false
	}
	switch strings.TrimSpace(line) {
	case "version":
		fmt.Fprintf(c, "allocfs-holder %d\n", holderProtocol)
	case "pid":
		fmt.Fprintf(c, "%d\n", os.Getpid())
	case "fd":
		c.WriteMsgUnix([]byte("ok\n"), unix.UnixRights(holderFD), nil)
	case "stop":
		io.WriteString(c, "ok\n")
		return true
	}
	return false
}

// askHolder sends request to the holder at socket and returns its answer
// line and, for "fd", the descriptor.
func askHolder(socket, request string) (string, int, error) {
	c, err := net.DialTimeout("unix", socket, time.Second)
	if err != nil {
		return "", -1, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(request + "\n")); err != nil {
		return "", -1, err
	}
	buf := make([]byte, 128)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.(*net.UnixConn).ReadMsgUnix(buf, oob)
	if err != nil {
		return "", -1, err
	}
	fd := -1
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil && len(msgs) == 1 {
			if fds, err := unix.ParseUnixRights(&msgs[0]); err == nil && len(fds) == 1 {
				fd = fds[0]
			}
		}
	}
	return strings.TrimSpace(string(buf[:n])), fd, nil
}

// heldConnection returns the FUSE connection a holder keeps for dataDir,
// and the holder's PID; errNoHolder when none answers.
func heldConnection(dataDir string) (int, int, error) {
	socket := holderSocket(dataDir)
	version, _, err := askHolder(socket, "version")
	if err != nil {
		return -1, 0, fmt.Errorf("%w: %v", errNoHolder, err)
	}
	if version != fmt.Sprintf("allocfs-holder %d", holderProtocol) {
		return -1, 0, fmt.Errorf("the holder of the mount speaks %q; this allocfs takes over from \"allocfs-holder %d\" only", version, holderProtocol)
	}
	pidText, _, err := askHolder(socket, "pid")
	if err != nil {
		return -1, 0, fmt.Errorf("asking the holder its PID: %w", err)
	}
	pid, _ := strconv.Atoi(pidText)
	answer, fd, err := askHolder(socket, "fd")
	if err != nil || answer != "ok" || fd < 0 {
		return -1, 0, fmt.Errorf("the holder did not hand the FUSE connection over (%q, %v)", answer, err)
	}
	return fd, pid, nil
}

var errNoHolder = errors.New("no holder answers")

// holderAlive reports whether the holder of dataDir's connection answers.
func holderAlive(dataDir string) bool {
	v, _, err := askHolder(holderSocket(dataDir), "version")
	return err == nil && v != ""
}

// startHolder starts a holder of fd for dataDir, in a session of its own
// (so that the terminal's signals, and the daemon's end, leave it be),
// and waits until it answers.
func startHolder(dataDir string, fd int) (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("failed to find the allocfs binary: %w", err)
	}
	socket := holderSocket(dataDir)
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
		if v, _, err := askHolder(socket, "version"); err == nil && v != "" {
			return cmd.Process.Pid, nil
		}
	}
	cmd.Process.Kill()
	return 0, errors.New("the FUSE connection's holder did not answer within 5 s")
}
