//go:build linux

package daemon

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"github.com/allocfs/allocfs/internal/tmpfs"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Checks `allocfs serve` makes before it mounts, each failing with an error
// that says what to do. Paths are variables so tests can point them
// elsewhere.
var (
	devFuse       = "/dev/fuse"
	mountinfoPath = "/proc/self/mountinfo"
)

// FSType is the filesystem type of an allocfs mount in
// /proc/self/mountinfo (go-fuse mounts with the name "allocfs").
const FSType = "fuse.allocfs"

// statTimeout bounds the probe of the mount point: a FUSE server that
// hangs would otherwise hang serve too.
const statTimeout = 5 * time.Second

// checkLayout refuses a mount point that would hide the store from the
// daemon itself, and a socket inside the mount: the daemon must never go
// through its own mount, or it can deadlock.
func checkLayout(cfg Config) error {
	if within(cfg.MountDir, cfg.DataDir) {
		return fmt.Errorf("mount point %q would cover the data dir %q: pass a --mount outside it, or a subdirectory such as %s",
			cfg.MountDir, cfg.DataDir, filepath.Join(cfg.DataDir, "mnt"))
	}
	for _, d := range store.Dirs {
		if p := filepath.Join(cfg.DataDir, d); within(p, cfg.MountDir) {
			return fmt.Errorf("mount point %q is inside the store's %q: pass a --mount outside it, such as %s",
				cfg.MountDir, p, filepath.Join(cfg.DataDir, "mnt"))
		}
	}
	if within(cfg.MountDir, cfg.Socket) {
		return fmt.Errorf("socket %q is inside the mount point %q: pass a --socket outside it", cfg.Socket, cfg.MountDir)
	}
	return nil
}

// within reports whether p is dir or lies below it. Both are clean,
// absolute paths.
func within(dir, p string) bool {
	if dir == "/" {
		return true
	}
	return p == dir || strings.HasPrefix(p, dir+"/")
}

// CheckFUSE checks that the kernel offers FUSE and that this process can
// mount: as root directly, otherwise through fusermount3.
func CheckFUSE() error {
	fi, err := os.Stat(devFuse)
	if err != nil {
		return fmt.Errorf("%s is not available (%v): load the fuse module: modprobe fuse", devFuse, err)
	}
	if fi.Mode().Type() != os.ModeDevice|os.ModeCharDevice {
		return fmt.Errorf("%s is not a character device (%s): load the fuse module: modprobe fuse", devFuse, fi.Mode().Type())
	}
	if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			return fmt.Errorf("not running as root and fusermount3 is not on PATH: install fuse3 or run as root")
		}
	}
	return nil
}

// checkTmpfs makes and closes a tmpfs the way every memory volume is made
// (internal/tmpfs): on a kernel without the new mount API (fsopen, Linux
// 5.2) serve refuses to start, rather than keep secrets anywhere else.
// Without the privilege to make one (a daemon not root), it starts, and
// says that every secrets/ and private/ will be refused.
func checkTmpfs(logger hclog.Logger) error {
	f, err := tmpfs.New(tmpfs.Options{Bytes: 4096, Inodes: 2, Mode: 0o700})
	switch {
	case err == nil:
		return f.Close()
	case errors.Is(err, unix.EPERM):
		logger.Warn("this daemon may not make a tmpfs (CAP_SYS_ADMIN): every task's secrets/ and private/ will be refused with EPERM", "error", err)
		return nil
	}
	return fmt.Errorf("memory volumes (a task's secrets/ and private/) are kernel tmpfs instances, and this kernel cannot make one: %w", err)
}

// prepareMountPoint makes dir ready to be mounted on: it detaches a stale
// mount left by a crashed daemon, creates dir if it is missing, checks it is
// a directory, and refuses if a live allocfs is mounted there, or if the
// directory holds anything the mount would hide, unless allowNonEmpty.
func prepareMountPoint(logger hclog.Logger, dir, table string, allowNonEmpty bool) error {
	fi, err := probe(dir, statTimeout)
	if StaleMount(err) {
		// The daemon that served this mount died: the kernel still holds
		// the mount but nothing answers it.
		logger.Warn("stale mount left by a crashed allocfs; detaching it", "mountpoint", dir)
		if err := detach(dir); err != nil {
			return fmt.Errorf("mount point %q holds a stale mount that could not be detached: %w; run: umount -l %s", dir, err, dir)
		}
		logger.Info("detached stale mount", "mountpoint", dir)
		fi, err = probe(dir, statTimeout)
	}
	if errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("failed to create mount point %q: %w", dir, err)
		}
		logger.Info("created mount point", "mountpoint", dir)
		fi, err = probe(dir, statTimeout)
	}
	if err != nil {
		return fmt.Errorf("cannot use mount point %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return notADirectory(dir, fi)
	}

	mounts, err := mountinfo.Read(table)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if m.MountPoint != dir {
			continue
		}
		if m.FSType == FSType {
			return fmt.Errorf("another allocfs is serving %s; stop it first", dir)
		}
		logger.Warn("mount point already has a mount; allocfs will hide it", "mountpoint", dir, "fstype", m.FSType, "source", m.Source)
	}
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cannot use mount point %q: %w", dir, err)
	}
	names, err := f.Readdirnames(3)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("cannot list mount point %q: %w", dir, err)
	}
	if len(names) > 0 {
		if !allowNonEmpty {
			return fmt.Errorf("mount point %q is not empty (%s): the mount would hide what is there; empty it, pass another --mount, or pass --allow-non-empty", dir, strings.Join(names, ", "))
		}
		logger.Warn("mount point is not empty; allocfs hides what is there", "mountpoint", dir, "entries", strings.Join(names, ", "))
	}
	return nil
}

// StaleMount reports whether err is what a FUSE mount whose daemon died
// answers: ENOTCONN once the last /dev/fuse descriptor closed, or
// ECONNABORTED when the connection was aborted, which is how the kernel
// ends one served over io_uring when the daemon's rings go (and what
// writing to fusectl's abort gives).
func StaleMount(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED)
}

// probe stats p, giving up after d. It calls statfs(2) first: after a
// FUSE daemon died, stat can still answer from the kernel's attribute
// cache, but statfs always asks the daemon, so it is what reports a
// stale mount. The goroutine of a probe that hangs is left behind:
// serve is about to exit anyway.
func probe(p string, d time.Duration) (os.FileInfo, error) {
	type result struct {
		fi  os.FileInfo
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var sfs unix.Statfs_t
		if err := unix.Statfs(p, &sfs); err != nil {
			ch <- result{nil, &os.PathError{Op: "statfs", Path: p, Err: err}}
			return
		}
		fi, err := os.Stat(p)
		ch <- result{fi, err}
	}()
	select {
	case r := <-ch:
		return r.fi, r.err
	case <-time.After(d):
		return nil, fmt.Errorf("no answer within %s: a hung FUSE server may hold %s; detach it with: umount -l %s", d, p, p)
	}
}

// detach lazily unmounts dir: directly as root, through fusermount3
// otherwise.
func detach(dir string) error {
	if os.Geteuid() == 0 {
		return unix.Unmount(dir, unix.MNT_DETACH)
	}
	out, err := exec.Command("fusermount3", "-u", "-z", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fusermount3 -u -z: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// describeType names the type of a file for an error message.
func describeType(m os.FileMode) string {
	switch t := m.Type(); {
	case t == 0:
		return "a regular file"
	case t&os.ModeSymlink != 0:
		return "a symbolic link"
	case t&os.ModeNamedPipe != 0:
		return "a FIFO"
	case t&os.ModeSocket != 0:
		return "a socket"
	case t&os.ModeDevice != 0:
		return "a device"
	default:
		return t.String()
	}
}

// notADirectory is the error for a mount point that exists and is not a
// directory.
func notADirectory(dir string, fi os.FileInfo) error {
	return fmt.Errorf("mount point %q is not a directory (%s): pass a directory, or a path that does not exist yet, as --mount",
		dir, describeType(fi.Mode()))
}
