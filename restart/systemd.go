//go:build linux

package restart

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// systemd. Under a unit of Type=notify (deploy/allocfs.service) systemd
// keeps the FUSE connection instead of the holder: serve stores the
// /dev/fuse descriptor in the unit's file-descriptor store (FDSTORE=1,
// named "fuse"), and systemd hands it to the next start, after a crash
// or a restart, as LISTEN_FDS with LISTEN_FDNAMES. serve also says when
// it is ready, reloading and stopping. The protocol is a datagram of
// newline-separated assignments on the unix socket NOTIFY_SOCKET names
// (sd_notify(3)); no library is needed for it.

// FuseFDName names the connection in the descriptor store.
const FuseFDName = "fuse"

// UnderSystemd reports whether systemd waits for notifications.
func UnderSystemd() bool { return os.Getenv("NOTIFY_SOCKET") != "" }

// Notify sends state to systemd, with fds; without NOTIFY_SOCKET it
// does nothing.
func Notify(state string, fds ...int) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return nil
	}
	// An abstract address ("@name") is one unix.SockaddrUnix takes as is.
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("failed to reach systemd's notification socket: %w", err)
	}
	defer unix.Close(s)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := unix.Sendmsg(s, []byte(state), oob, &unix.SockaddrUnix{Name: addr}, 0); err != nil {
		return fmt.Errorf("failed to notify systemd (%q): %w", strings.ReplaceAll(state, "\n", " "), err)
	}
	return nil
}

// MonotonicUsec is CLOCK_MONOTONIC in microseconds, which RELOADING=1
// carries.
func MonotonicUsec() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() / int64(time.Microsecond)
}

// ListenedFds returns the FUSE connection systemd passed this process
// from its descriptor store, or -1, and the other descriptors it passed
// (the memory volumes', memkeep.go), by name. The LISTEN_* variables are
// for this process only (LISTEN_PID), and are removed, as
// sd_listen_fds(3) does.
func ListenedFds() (int, map[string]int) {
	pid, _ := strconv.Atoi(os.Getenv("LISTEN_PID"))
	count, _ := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	names := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(v)
	}
	others := make(map[string]int)
	if pid != os.Getpid() || count <= 0 {
		return -1, others
	}
	const first = 3 // SD_LISTEN_FDS_START
	fd := -1
	for i := range count {
		unix.CloseOnExec(first + i)
		switch {
		case i < len(names) && names[i] == FuseFDName && fd < 0:
			fd = first + i
		case i < len(names) && strings.HasPrefix(names[i], "mem-"):
			if old, ok := others[names[i]]; ok {
				unix.Close(old)
			}
			others[names[i]] = first + i
		default:
			unix.Close(first + i)
		}
	}
	return fd, others
}
