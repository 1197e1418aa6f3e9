package nomadreplay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Isolation is a task driver's filesystem isolation mode.
type Isolation string

const (
	// Chroot is exec's and java's: the task runs chrooted in its directory.
	Chroot Isolation = "chroot"
	// Image is docker's, podman's and qemu's: the driver binds directories
	// into its own root.
	Image Isolation = "image"
	// Unveil is exec2's: binds into alloc_mounts_dir.
	Unveil Isolation = "unveil"
	// None is raw_exec's: the task runs in its directory on the host.
	None Isolation = "none"
)

// Nobody is the uid and gid Nomad gives its directories (nobody on this
// machine kind's distributions).
const Nobody = 65534

// Client is one Nomad client's view of its directories.
type Client struct {
	// AllocDir is client.alloc_dir; MountsDir is client.alloc_mounts_dir.
	AllocDir, MountsDir string
	// ChrootEnv is client.chroot_env: host path to path in the task.
	ChrootEnv map[string]string
	// SecretsMB is each task's resources.secrets (Nomad's default 1).
	SecretsMB int
	// Rename is the rename(2) of the Move: os.Rename unless a test
	// replaces it.
	Rename func(oldpath, newpath string) error
	// Logf, when set, hears what Nomad would log as a warning.
	Logf func(format string, args ...any)
}

func (c *Client) logf(format string, args ...any) {
	if c.Logf != nil {
		c.Logf(format, args...)
	}
}

// Dir is an allocation's directory.
func (c *Client) Dir(id string) string { return filepath.Join(c.AllocDir, id) }

// Start is what the agent does to its directories when it starts: it
// creates them (a mode of an existing one is left) and fingerprints the
// node's disk from a statfs of alloc_dir, which must show real counts:
// blocks (its fingerprint, df -kP, reads only those); inodes may be 0,
// as btrfs, which numbers none, reports with or without allocfs.
func (c *Client) Start() error {
	for _, d := range []string{c.AllocDir, c.MountsDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return fmt.Errorf("agent start: %w", err)
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(c.AllocDir, &st); err != nil {
		return fmt.Errorf("agent start: fingerprint of %s: %w", c.AllocDir, err)
	}
	if st.Blocks == 0 || st.Bsize == 0 || st.Files < st.Ffree {
		return fmt.Errorf("agent start: statfs of %s shows no disk (%d blocks of %d bytes, %d inodes)", c.AllocDir, st.Blocks, st.Bsize, st.Files)
	}
	return nil
}

// allocMkdirAll is Nomad's: MkdirAll, then chmod to the mode with 0777
// added and chown to nobody.
func allocMkdirAll(path string, mode os.FileMode) error {
	if err := os.MkdirAll(path, mode); err != nil {
		return err
	}
	return dropPermissions(path, mode)
}

func dropPermissions(path string, mode os.FileMode) error {
	if err := os.Chmod(path, mode|0o777); err != nil {
		return fmt.Errorf("chmod(%v) failed: %w", path, err)
	}
	if err := os.Chown(path, Nobody, Nobody); err != nil {
		return fmt.Errorf("couldn't change owner of %v to nobody: %w", path, err)
	}
	return nil
}

// Build is the alloc runner's prerun hook "alloc_dir": it runs on every
// start of an allocation and again for each live one after an agent
// restart, so it must find its own work and go on.
func (c *Client) Build(id string) error {
	dir := c.Dir(id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("failed to make the alloc directory %v: %w", dir, err)
	}
	shared := filepath.Join(dir, "alloc")
	if err := allocMkdirAll(shared, 0o755); err != nil {
		return err
	}
	for _, sub := range []string{"logs", "tmp", "data"} {
		if err := allocMkdirAll(filepath.Join(shared, sub), 0o777); err != nil {
			return err
		}
	}
	return nil
}

// ErrMigrationLost is what Move returns when a rename failed and Nomad's
// fallback rebuilt the new allocation empty.
var ErrMigrationLost = errors.New("the previous allocation's data is lost to the new one: Nomad destroyed and rebuilt it")

// Move is the local migration of a sticky or migrate ephemeral disk from
// prev to next, run after next's Build and before any of its task dirs.
// Nomad has no copy fallback: on any error it logs a warning, destroys
// next's directory and builds it again.
func (c *Client) Move(prev, next string, tasks []string) error {
	rename := c.Rename
	if rename == nil {
		rename = os.Rename
	}
	err := func() error {
		from := filepath.Join(c.Dir(prev), "alloc/data")
		to := filepath.Join(c.Dir(next), "alloc/data")
		if fi, err := os.Stat(from); err == nil && fi != nil {
			os.Remove(to)
			if err := rename(from, to); err != nil {
				return fmt.Errorf("error moving data dir: %w", err)
			}
		}
		for _, task := range tasks {
			from := filepath.Join(c.Dir(prev), task, "local")
			if fi, err := os.Stat(from); err != nil || fi == nil {
				continue
			}
			taskDir := filepath.Join(c.Dir(next), task)
			if err := os.MkdirAll(taskDir, 0o777); err != nil {
				return fmt.Errorf("error creating task %q dir: %w", task, err)
			}
			to := filepath.Join(taskDir, "local")
			os.Remove(to)
			if err := rename(from, to); err != nil {
				return fmt.Errorf("error moving task %q local dir: %w", task, err)
			}
		}
		return nil
	}()
	if err == nil {
		return nil
	}
	c.logf("failed to move alloc dir into alloc %q: %v", next, err)
	if derr := c.Destroy(next, tasks); derr != nil {
		return fmt.Errorf("%w (%v), and destroying %s failed: %v", ErrMigrationLost, err, next, derr)
	}
	if berr := c.Build(next); berr != nil {
		return fmt.Errorf("%w (%v), and building %s again failed: %v", ErrMigrationLost, err, next, berr)
	}
	return fmt.Errorf("%w (%v)", ErrMigrationLost, err)
}

// Destroy is the client GC's: every task's mounts are detached (flags 0:
// a busy one stays) and removed, then os.RemoveAll of the allocation.
// tasks are the task names the allocation had; every error is returned.
func (c *Client) Destroy(id string, tasks []string) error {
	var errs []error
	for _, task := range tasks {
		errs = append(errs, c.unmountTask(id, task))
	}
	if err := os.RemoveAll(c.Dir(id)); err != nil {
		errs = append(errs, fmt.Errorf("failed to remove alloc dir %q: %w", c.Dir(id), err))
	}
	return errors.Join(errs...)
}

// unlinkDir detaches the mount at dir; one that is not there is no error.
func unlinkDir(dir string) error {
	if err := unix.Unmount(dir, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", dir, err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil || !errors.Is(err, os.ErrNotExist)
}

func (c *Client) unmountTask(id, task string) error {
	var errs []error
	dir := filepath.Join(c.Dir(id), task)
	shared := filepath.Join(dir, "alloc")
	if exists(shared) {
		errs = append(errs, unlinkDir(filepath.Join(shared, "logs")))
		if err := unlinkDir(shared); err != nil {
			errs = append(errs, err)
		} else if err := os.RemoveAll(shared); err != nil {
			errs = append(errs, fmt.Errorf("failed to delete shared alloc dir %q: %w", shared, err))
		}
	}
	// exec2's binds: alloc/ and secrets/ over the task directory, which
	// is itself bound on the unique directory.
	mounts := c.mountsDir(id, task)
	for _, p := range []string{filepath.Join(mounts, "alloc"), filepath.Join(mounts, "secrets"), mounts} {
		if exists(p) {
			errs = append(errs, unlinkDir(p))
		}
	}
	if exists(mounts) {
		if err := os.RemoveAll(mounts); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove the task alloc mounts dir %q: %w", mounts, err))
		}
	}
	for _, sub := range []string{"secrets", "private"} {
		if p := filepath.Join(dir, sub); exists(p) {
			errs = append(errs, unlinkDir(p))
			if err := os.RemoveAll(p); err != nil {
				errs = append(errs, fmt.Errorf("failed to remove the %s dir %q: %w", sub, p, err))
			}
		}
	}
	for _, sub := range []string{"dev", "proc"} {
		if p := filepath.Join(dir, sub); exists(p) {
			errs = append(errs, unlinkDir(p))
		}
	}
	return errors.Join(errs...)
}

func (c *Client) mountsDir(id, task string) string {
	return filepath.Join(c.MountsDir, id+"-"+task)
}
