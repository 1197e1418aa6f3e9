package nomadreplay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultChrootEnv is Nomad's chroot_env when the client sets none.
var DefaultChrootEnv = map[string]string{
	"/bin": "/bin", "/etc": "/etc", "/lib": "/lib", "/lib32": "/lib32", "/lib64": "/lib64",
	"/run/resolvconf": "/run/resolvconf", "/run/systemd/resolve": "/run/systemd/resolve",
	"/sbin": "/sbin", "/usr": "/usr",
}

// EmbedStats counts what an embed of the chroot_env did.
type EmbedStats struct {
	Dirs, Symlinks, Linked, Copied, Skipped int
	// CopiedBytes is what the copies wrote.
	CopiedBytes int64
}

// BuildTask is the task runner's prestart "task_dir" hook for task of
// allocation id, whose driver isolates by mode; user is the task's user
// (exec2's binds are given to it). It returns what the chroot embed did.
func (c *Client) BuildTask(id, task string, mode Isolation, user int) (EmbedStats, error) {
	var stats EmbedStats
	dir := filepath.Join(c.Dir(id), task)
	if err := allocMkdirAll(dir, 0o777); err != nil {
		return stats, err
	}
	if err := allocMkdirAll(filepath.Join(dir, "local"), 0o777); err != nil {
		return stats, err
	}
	if err := allocMkdirAll(filepath.Join(dir, "tmp"), os.ModeSticky|0o777); err != nil {
		return stats, err
	}
	if mode == Chroot {
		shared := filepath.Join(dir, "alloc")
		if empty, _ := pathEmpty(shared); !exists(shared) || empty {
			if err := linkDir(filepath.Join(c.Dir(id), "alloc"), shared, false); err != nil {
				return stats, fmt.Errorf("failed to mount shared directory for task: %w", err)
			}
			if err := linkDir(filepath.Join(c.Dir(id), "alloc/logs"), filepath.Join(shared, "logs"), true); err != nil {
				return stats, fmt.Errorf("failed to mount shared directory for task: %w", err)
			}
		}
	}
	if err := c.MakeSecretsDirs(id, task); err != nil {
		return stats, err
	}
	if mode == Chroot {
		if err := c.embed(dir, c.ChrootEnv, &stats); err != nil {
			return stats, err
		}
	}
	if mode == Unveil {
		parent := c.mountsDir(id, task)
		if err := os.MkdirAll(parent, 0o710); err != nil {
			return stats, fmt.Errorf("failed to create task mount directory: %w", err)
		}
		if err := os.Chown(parent, user, user); err != nil {
			return stats, fmt.Errorf("failed to chown task mount directory: %w", err)
		}
		if err := mountDir(dir, parent, user, user, 0o710); err != nil {
			return stats, fmt.Errorf("failed to mount task dir: %w", err)
		}
		if err := mountDir(filepath.Join(c.Dir(id), "alloc"), filepath.Join(parent, "alloc"), Nobody, Nobody, 0o777); err != nil {
			return stats, fmt.Errorf("failed to mount alloc dir: %w", err)
		}
		if err := mountDir(filepath.Join(dir, "secrets"), filepath.Join(parent, "secrets"), user, user, 0o710); err != nil {
			return stats, fmt.Errorf("failed to mount secrets dir: %w", err)
		}
	}
	return stats, nil
}

// MakeSecretsDirs gives task's secrets/ and private/ their tmpfs, unless
// the marker says an earlier run did: it runs again for every task on an
// agent restart.
func (c *Client) MakeSecretsDirs(id, task string) error {
	size := c.SecretsMB
	if size == 0 {
		size = 1
	}
	dir := filepath.Join(c.Dir(id), task)
	if err := makeSecretDir(filepath.Join(dir, "secrets"), size); err != nil {
		return err
	}
	return makeSecretDir(filepath.Join(dir, "private"), 1)
}

func makeSecretDir(dir string, sizeMB int) error {
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	marker := filepath.Join(dir, ".nomad-mount")
	if _, err := os.Stat(marker); err != nil {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC, fmt.Sprintf("size=%dm,noswap", sizeMB)); err != nil {
			if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOEXEC, fmt.Sprintf("size=%dm", sizeMB)); err != nil {
				return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
			}
		}
		f, err := os.OpenFile(marker, os.O_RDWR|os.O_CREATE, 0o666)
		if err != nil {
			return err
		}
		f.Close()
	}
	return dropPermissions(dir, 0o777)
}

// linkDir is Nomad's bind of a directory "linked" into a task dir.
func linkDir(src, dst string, ro bool) error {
	if err := os.MkdirAll(dst, 0o777); err != nil {
		return err
	}
	// Nomad asks for a read-only bind in one call, which the kernel
	// answers with a writable one: replayed as it is.
	flags := uintptr(unix.MS_BIND)
	if ro {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(src, dst, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, dst, err)
	}
	return nil
}

func mountDir(old, next string, uid, gid int, mode os.FileMode) error {
	if err := os.MkdirAll(next, mode); err != nil {
		return err
	}
	if err := unix.Mount(old, next, "", unix.MS_BIND|unix.MS_NOSUID|unix.MS_NOATIME, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", old, next, err)
	}
	if err := os.Chmod(next, mode); err != nil {
		return err
	}
	return os.Chown(next, uid, gid)
}

func pathEmpty(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && err != io.EOF {
		return false, err
	}
	return len(names) == 0, nil
}

// Embed runs Nomad's embed of env into dir alone, as the chroot build
// does; a benchmark times it.
func Embed(dir string, env map[string]string) (EmbedStats, error) {
	var stats EmbedStats
	err := (&Client{}).embed(dir, env, &stats)
	return stats, err
}

// embed is Nomad's: breadth first over the entries (a map, so in no
// order Nomad promises; sorted here for a repeatable replay), each
// directory re-created with its host counterpart's mode and owner, from
// the task dir (whose counterpart is /) down; each file skipped if it is
// there, else hard-linked, else copied and chowned; symlinks re-created;
// anything else skipped.
func (c *Client) embed(dir string, entries map[string]string, stats *EmbedStats) error {
	for len(entries) > 0 {
		subdirs := map[string]string{}
		sources := make([]string, 0, len(entries))
		for s := range entries {
			sources = append(sources, s)
		}
		sort.Strings(sources)
		for _, source := range sources {
			dest := entries[source]
			s, err := os.Stat(source)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return err
			}
			if !s.IsDir() {
				if err := createDir(dir, filepath.Dir(dest), stats); err != nil {
					return fmt.Errorf("couldn't create destination directory %v: %w", dest, err)
				}
				if err := linkOrCopy(source, filepath.Join(dir, dest), s, stats); err != nil {
					return err
				}
				continue
			}
			destDir := filepath.Join(dir, dest)
			if err := createDir(dir, dest, stats); err != nil {
				return fmt.Errorf("couldn't create destination directory %v: %w", destDir, err)
			}
			list, err := os.ReadDir(source)
			if err != nil {
				return fmt.Errorf("couldn't read directory %v: %w", source, err)
			}
			for _, de := range list {
				fi, err := de.Info()
				if err != nil {
					return fmt.Errorf("couldn't read the file information of %v: %w", de.Name(), err)
				}
				hostEntry := filepath.Join(source, fi.Name())
				taskEntry := filepath.Join(destDir, fi.Name())
				if fi.IsDir() {
					subdirs[hostEntry] = filepath.Join(dest, fi.Name())
					continue
				}
				if _, err := os.Lstat(taskEntry); err == nil {
					stats.Skipped++
					continue
				}
				if !fi.Mode().IsRegular() {
					if fi.Mode()&os.ModeSymlink == 0 {
						continue
					}
					link, err := os.Readlink(hostEntry)
					if err != nil {
						return fmt.Errorf("couldn't resolve symlink for %v: %w", hostEntry, err)
					}
					if err := os.Symlink(link, taskEntry); err != nil && !errors.Is(err, os.ErrExist) {
						return fmt.Errorf("couldn't create symlink: %w", err)
					}
					stats.Symlinks++
					continue
				}
				if err := linkOrCopy(hostEntry, taskEntry, fi, stats); err != nil {
					return err
				}
			}
		}
		entries = subdirs
	}
	return nil
}

// createDir re-creates rel and each of its parents below base, root
// first, with the mode and owner of the host's path of the same name.
func createDir(base, rel string, stats *EmbedStats) error {
	var chain []string
	for p := filepath.Clean(rel); ; p = filepath.Dir(p) {
		chain = append(chain, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	for i := len(chain) - 1; i >= 0; i-- {
		host := chain[i]
		mode, uid, gid := os.FileMode(0o777), -1, -1
		if fi, err := os.Stat(host); err == nil {
			mode = fi.Mode()
			st := fi.Sys().(*syscall.Stat_t)
			uid, gid = int(st.Uid), int(st.Gid)
		}
		dest := filepath.Join(base, host)
		if err := os.MkdirAll(dest, mode); err != nil {
			return err
		}
		if uid >= 0 {
			if err := os.Chown(dest, uid, gid); err != nil {
				return err
			}
		}
		stats.Dirs++
	}
	return nil
}

func linkOrCopy(src, dst string, fi os.FileInfo, stats *EmbedStats) error {
	if _, err := os.Stat(dst); err == nil {
		stats.Skipped++
		return nil
	}
	if err := os.Link(src, dst); err == nil {
		stats.Linked++
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("couldn't open src file %v: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE, fi.Mode().Perm())
	if err != nil {
		return fmt.Errorf("couldn't create destination file %v: %w", dst, err)
	}
	defer out.Close()
	n, err := io.Copy(out, in)
	stats.CopiedBytes += n
	if err != nil {
		return fmt.Errorf("couldn't copy %q to %q: %w", src, dst, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if err := out.Chown(int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("couldn't copy %q to %q: %w", src, dst, err)
	}
	stats.Copied++
	return nil
}
