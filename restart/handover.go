//go:build linux

package restart

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/lock"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Stopping and restarting serve with --live-restart (holder.go):
//
//	SIGTERM, SIGINT  with a running allocation: stop, and leave the mount
//	                 to the holder for the next serve; with none: unmount
//	SIGUSR1          unmount whatever runs (a full stop)
//	SIGUSR2          hand over: stop and leave the mount, whatever runs;
//	                 a serve started on the same data dir and mount sends
//	                 it to the running one (an upgrade)
//
// A serve that finds the data dir locked by a serve of the same mount
// checks that it can take that one's mount over (the holder's protocol,
// the recorded session) before it asks: a mismatch leaves the running
// daemon serving. It then waits for the lock; of two racing, the one
// that gets the lock wins and the other fails.
const (
	SigFullStop = syscall.SIGUSR1
	SigHandOver = syscall.SIGUSR2
)

const (
	// ParkTimeout bounds how long a daemon leaving its mount waits for
	// the requests it is handling.
	ParkTimeout = 10 * time.Second
	// handOverTimeout bounds how long a serve waits for the running one
	// to hand its mount over: its API stops first (shutdownTimeout).
	handOverTimeout = 30 * time.Second
)

// TakeOverRunning asks the serve holding dataDir to hand its mount over,
// and returns the store, opened with opts, once this process holds the
// lock.
func TakeOverRunning(logger hclog.Logger, dataDir string, opts store.Options) (*store.Store, error) {
	pid, mount, err := lock.Holder(dataDir)
	if err != nil {
		return nil, err
	}
	if pid == 0 {
		return nil, fmt.Errorf("%w (its PID unknown): it cannot be asked to hand over", lock.ErrLocked)
	}
	// Whether it can be taken over at all comes first: a refusal leaves
	// the running daemon serving.
	version, _, err := AskHolder(HolderSocket(dataDir), "version")
	if err != nil {
		return nil, fmt.Errorf("%w (pid %d): it keeps no holder of its mount, so it cannot hand over; stop it first", lock.ErrLocked, pid)
	}
	if ProtocolOf(version) == 0 {
		return nil, fmt.Errorf("allocfs (pid %d) keeps serving: its holder speaks %q, this allocfs %q and earlier", pid, version, Version(Protocol))
	}
	if _, err := HeldSession(dataDir); err != nil {
		return nil, fmt.Errorf("allocfs (pid %d) keeps serving: %w", pid, err)
	}
	logger.Info("taking the mount over from the running serve", "pid", pid, "mount", mount)
	// Its end is watched through a pidfd, which its PID being reused
	// cannot fool.
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to watch allocfs (pid %d): %w", pid, err)
	}
	defer unix.Close(pidfd)
	os.Remove(refusalPath(dataDir))
	if err := unix.Kill(pid, SigHandOver); err != nil {
		return nil, fmt.Errorf("failed to ask allocfs (pid %d) to hand over: %w", pid, err)
	}
	deadline := time.Now().Add(handOverTimeout)
	for {
		s, err := store.OpenWith(logger, dataDir, opts)
		if err == nil {
			// Its parked readers take requests until it has exited, and
			// only then are they all there to be resent.
			if werr := waitExit(pidfd, time.Until(deadline)); werr != nil {
				return nil, errors.Join(fmt.Errorf("allocfs (pid %d) released the data dir but did not exit: %w", pid, werr), s.Close())
			}
			return s, nil
		}
		if !errors.Is(err, lock.ErrLocked) {
			return nil, err
		}
		if reason, rerr := os.ReadFile(refusalPath(dataDir)); rerr == nil {
			os.Remove(refusalPath(dataDir))
			return nil, fmt.Errorf("allocfs (pid %d) keeps serving: it refused to hand over: %s", pid, reason)
		}
		if p, _, _ := lock.Holder(dataDir); p != 0 && p != pid {
			return nil, fmt.Errorf("%w: another serve (pid %d) took the mount over first", lock.ErrLocked, p)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("allocfs (pid %d) did not hand its mount over within %v", pid, handOverTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TakeHeld returns the connection a holder keeps for dataDir's mount at
// mountDir, the holder's PID and its protocol; -1 when no holder runs.
func TakeHeld(dataDir, mountDir string) (int, int, int, error) {
	fd, pid, v, err := heldConnection(dataDir)
	if errors.Is(err, errNoHolder) {
		return -1, 0, 0, nil
	}
	if err != nil {
		return -1, 0, 0, err
	}
	if err := CheckHeld(dataDir, mountDir, fd, fmt.Sprintf("the holder (pid %d)", pid)); err != nil {
		return -1, 0, 0, err
	}
	return fd, pid, v, nil
}

// CheckHeld checks that the connection fd, which keeper kept, is the one
// dataDir recorded for the mount point mountDir, and closes it if not.
func CheckHeld(dataDir, mountDir string, fd int, keeper string) error {
	mount, err := HeldSession(dataDir)
	if err == nil && mount != mountDir {
		err = fmt.Errorf("its mount is at %s, not at --mount %s", mount, mountDir)
	}
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("cannot take over the mount %s keeps: %w; serve it as it was, or stop it", keeper, err)
	}
	return nil
}

// AnyRunning reports whether an allocation of s is running: its tasks
// may hold files in the mount.
func AnyRunning(s *store.Store) bool {
	for _, st := range s.List() {
		if st.Status == record.StatusRunning {
			return true
		}
	}
	return false
}

// waitExit waits for the process of pidfd to exit.
func waitExit(pidfd int, timeout time.Duration) error {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for deadline := time.Now().Add(timeout); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return errors.New("timed out")
		}
		n, err := unix.Poll(fds, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
	}
}

// refusalPath is where a serve asked to hand over says why it will not.
func refusalPath(dataDir string) string { return StateFile(dataDir, "handover.refused") }

// RefuseHandOver tells the serve that asked for the mount why it does not
// get it.
func RefuseHandOver(dataDir, reason string) {
	os.WriteFile(refusalPath(dataDir), []byte(reason), 0o600)
}
