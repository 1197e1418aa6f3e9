//go:build linux

package snapshot

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// The final pass over the extracted tree: the links whose targets climb
// are checked through the archive's own links, and each directory gets its
// mode, owner and times once nothing more is created in it.

// walkBatch is how many entries the final pass reads from a directory at
// a time. The pass holds, per level of depth, one open directory and one
// batch, whatever a directory holds: at most PATH_MAX/2 levels of a few
// KiB each.
const walkBatch = 16

// finish walks the extracted tree depth first. It checks, through the
// archive's own links, every link whose target climbs: the lexical check
// of each link alone misses a chain such as a/s -> ../.. (the root, fine)
// and a/t -> s/../../x (fine lexically, but the kernel climbs from where s
// leads, which is out). Links without ".." only descend from where their
// parent really is, so they stay inside when every link they pass through
// does; a loop is not an escape, the kernel gives up on it too. It also
// sets the mode, owner and times of every directory once nothing more
// will be created in it (creating an entry changes the parent's mtime,
// and a read-only mode would stop a non-root caller from filling it):
// children first, so that no parent is locked before they are done.
func (x *extractor) finish() error {
	fd, err := allocdir.OpenBeneath(x.rootfd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("failed to open the extracted tree: %w", err)
	}
	res := allocdir.Resolver{Readlink: func(p string) (string, bool, error) {
		return allocdir.ReadlinkBeneath(x.rootfd, p)
	}}
	return x.walk(fd, "", res)
}

// walk visits the directory fd (named rel, "" for the root), which it
// closes.
func (x *extractor) walk(fd int, rel string, res allocdir.Resolver) error {
	// Named by its host path: where the filesystem does not report entry
	// types, ReadDir lstats each entry by that name. Every component of
	// it was opened without following links.
	d := os.NewFile(uintptr(fd), filepath.Join(x.rootPath, rel))
	defer d.Close()
	for {
		entries, rerr := d.ReadDir(walkBatch)
		for _, e := range entries {
			child := e.Name()
			if rel != "" {
				child = rel + "/" + child
			}
			switch typ := e.Type(); {
			case typ.IsDir():
				cfd, err := allocdir.OpenBeneath(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
				if err != nil {
					return fsError(child, err)
				}
				if err := x.walk(cfd, child, res); err != nil {
					return err
				}
			case typ&fs.ModeSymlink != 0:
				if err := x.checkClimb(fd, e.Name(), child, res); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("failed to list %q: %w", rel, rerr)
		}
	}
	if rel == "" {
		// The root's mode is Extract's to set, once accepted.
		return nil
	}
	return x.applyDirMeta(fd, rel)
}

// checkClimb refuses the link name (in dirfd, named child from the root)
// if its target climbs out of the root through the archive's links.
func (x *extractor) checkClimb(dirfd int, name, child string, res allocdir.Resolver) error {
	n, err := unix.Readlinkat(dirfd, name, x.linkBuf)
	if err != nil {
		return fmt.Errorf("failed to read link %q: %w", child, err)
	}
	target := string(x.linkBuf[:n])
	if !slices.Contains(strings.Split(target, "/"), "..") {
		return nil
	}
	if _, err := res.Resolve(child, true); errors.Is(err, allocdir.ErrEscapes) {
		return refuse(child, "symbolic link target %q leads outside the archive root through other links", target)
	}
	return nil
}

// applyDirMeta gives the directory fd what its entry asked for, or, for a
// directory created only as a parent, the layout's mode.
func (x *extractor) applyDirMeta(fd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("failed to stat %q: %w", name, err)
	}
	m, explicit := x.explicit[st.Ino]
	if !explicit {
		if err := unix.Fchmod(fd, uint32(allocdir.AllocDirMode.Perm())); err != nil {
			return fmt.Errorf("failed to chmod %q: %w", name, err)
		}
		return nil
	}
	delete(x.explicit, st.Ino)
	if x.chown {
		if err := unix.Fchown(fd, int(m.uid), int(m.gid)); err != nil {
			return fmt.Errorf("failed to chown %q: %w", name, err)
		}
	}
	if err := unix.Fchmod(fd, m.mode); err != nil {
		return fmt.Errorf("failed to chmod %q: %w", name, err)
	}
	if m.atime.Nsec == unix.UTIME_OMIT && m.mtime.Nsec == unix.UTIME_OMIT {
		return nil
	}
	if err := unix.UtimesNanoAt(fd, ".", []unix.Timespec{m.atime, m.mtime}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("failed to set times of %q: %w", name, err)
	}
	return nil
}

// setTimes sets the times of name in dirfd without following a link. A
// zero time is left alone rather than set to year 1.
func setTimes(dirfd int, name string, atime, mtime time.Time) error {
	if atime.IsZero() && mtime.IsZero() {
		return nil
	}
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// futimens sets the times of the open file fd, leaving a zero time alone.
func futimens(fd int, atime, mtime time.Time) error {
	if atime.IsZero() && mtime.IsZero() {
		return nil
	}
	ts := [2]unix.Timespec{timespec(atime), timespec(mtime)}
	// utimensat with a NULL path is futimens: it acts on fd itself.
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}
