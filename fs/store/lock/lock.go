package lock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Name is the file in the data dir whose flock(2) says a store has it
// open. Two daemons on one data dir would each create allocations the
// other does not know of and collect layers the other still uses, so
// the store's Open takes the lock and a second one fails at once. The
// kernel drops the lock with the last descriptor, so a crashed daemon
// never leaves the data dir locked.
const Name = "lock"

// ErrLocked is returned by Take, and so by the store's Open, when
// another store, in this process or another, has the data dir open.
var ErrLocked = errors.New("data dir is in use by another allocfs")

// Lock is a held lock on a data dir.
type Lock struct {
	f *os.File
}

// Take takes the data dir's lock, or fails with ErrLocked and what the
// holder wrote about itself. The holder writes its PID (and later,
// through Describe, its mount point) into the file, for the message.
func Take(dataDir string) (*Lock, error) {
	p := filepath.Join(dataDir, Name)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open the data dir's lock %q: %w", p, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s); stop it first, or give this one another --data-dir", ErrLocked, holder)
		}
		return nil, fmt.Errorf("failed to lock %q: %w", p, err)
	}
	l := &Lock{f: f}
	if err := l.Describe(""); err != nil {
		return nil, errors.Join(err, l.Release())
	}
	return l, nil
}

// Describe writes who holds the lock: this PID and, once known, the
// mount, so that a second daemon started on the same data dir says where
// the first one serves.
func (l *Lock) Describe(mount string) error {
	text := "pid " + strconv.Itoa(os.Getpid())
	if mount != "" {
		text += ", mount " + mount
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("failed to describe the lock holder: %w", err)
	}
	if _, err := l.f.WriteAt([]byte(text+"\n"), 0); err != nil {
		return fmt.Errorf("failed to describe the lock holder: %w", err)
	}
	return nil
}

// Release drops the lock. The file stays: removing it would let a third
// store lock a new file while a second one waits on the old.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	// Unlocked explicitly, not only by the close: a child forked at this
	// moment (any exec in the process) holds a copy of the descriptor
	// until it execs, and the lock would last as long as that copy.
	err := unix.Flock(int(l.f.Fd()), unix.LOCK_UN)
	if err != nil {
		err = fmt.Errorf("failed to unlock the data dir: %w", err)
	}
	err = errors.Join(err, l.f.Close())
	l.f = nil
	return err
}

// Held reports whether l is a lock still held: not released.
func (l *Lock) Held() bool { return l != nil && l.f != nil }

// readHolder returns what the holder wrote about itself.
func readHolder(f *os.File) string {
	buf := make([]byte, 512)
	n, _ := f.ReadAt(buf, 0)
	text := strings.TrimSpace(string(buf[:n]))
	if text == "" {
		return "holder unknown"
	}
	return "held by " + text
}

// Holder returns the PID and mount point that the store holding
// dataDir's lock wrote about itself (0 and "" where it wrote nothing).
func Holder(dataDir string) (pid int, mount string, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, Name))
	if err != nil {
		return 0, "", fmt.Errorf("failed to read the data dir's lock: %w", err)
	}
	text := strings.TrimSpace(string(b))
	rest, ok := strings.CutPrefix(text, "pid ")
	if !ok {
		return 0, "", nil
	}
	pidText, mount, _ := strings.Cut(rest, ", mount ")
	pid, _ = strconv.Atoi(pidText)
	return pid, mount, nil
}
