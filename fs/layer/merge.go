package layer

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// MergeDisk is how Merge changes its destination: every entry it makes is
// one of these calls, so that a caller can stop a merge at any step, as
// the store's crash tests do, or count and fail them. The store's Disk is
// one. Entries are named fd-relative (Loc), so a tree deeper than
// PATH_MAX merges whole.
type MergeDisk interface {
	// MkdirAt creates a directory with mode (the umask applies; Merge
	// sets the final mode itself).
	MkdirAt(l Loc, mode uint32) error
	// LinkAt makes to a hard link of from.
	LinkAt(from, to Loc) error
}

// MergeStats counts what a merge made.
type MergeStats struct {
	Links, Dirs int
}

// Merge fills dst, an empty directory, with one layer that reads like the
// layer upper stacked on the layer lower. Files and every other
// non-directory are hard links to the pair's own inodes, so no byte is
// copied and an open file stays the same file; directories are made anew
// with their source's mode, owner, times and extended attributes.
//
// through says that layers below the pair may show through the merged
// one, which then keeps the whiteouts and opaque marks needed to hide
// them; without it they hide nothing and are dropped. Nothing is synced:
// the caller syncs dst before anything names it. On error, dst holds a
// partial merge for the caller to remove. It holds up to three
// descriptors per level of depth (the destination and the two sources),
// so a tree thousands of levels deep needs that many of the mount's.
func Merge(d MergeDisk, dst, upper, lower string, through bool) (MergeStats, error) {
	m := &merger{disk: d}
	dstDir, err := openMergeDir(unix.AT_FDCWD, dst, dst)
	if err != nil {
		return m.stats, err
	}
	defer dstDir.Close()
	u, err := openMergeDir(unix.AT_FDCWD, upper, upper)
	if err != nil {
		return m.stats, err
	}
	defer u.Close()
	srcs := []*os.File{u}
	opaque := IsOpaque(dirLoc(u))
	if !opaque {
		l, err := openMergeDir(unix.AT_FDCWD, lower, lower)
		if err != nil {
			return m.stats, err
		}
		defer l.Close()
		srcs = append(srcs, l)
		opaque = IsOpaque(dirLoc(l))
	}
	err = m.dir(dstDir, srcs, opaque, through)
	return m.stats, err
}

// merger is one Merge under way.
type merger struct {
	disk  MergeDisk
	stats MergeStats
}

// openMergeDir opens the directory name of dir for a merge: for listing,
// never through a symbolic link. shown names it in errors.
func openMergeDir(dir int, name, shown string) (*os.File, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: shown, Err: err}
	}
	return os.NewFile(uintptr(fd), shown), nil
}

// openChild opens the directory name in the open directory parent.
func openChild(parent *os.File, name string) (*os.File, error) {
	return openMergeDir(int(parent.Fd()), name, filepath.Join(parent.Name(), name))
}

// dirLoc names the open directory f itself.
func dirLoc(f *os.File) Loc { return Loc{Dir: int(f.Fd()), path: f.Name()} }

// dir fills dst, a directory of the merged layer already created, with
// the entries of the directories srcs (upper first: a name in the first
// hides the same name in the second), then gives it the attributes of
// srcs[0], the one the pair showed. opaque says that nothing below the
// merged layer may show through it; through that something would, were
// it not opaque, so the mark is needed.
func (m *merger) dir(dst *os.File, srcs []*os.File, opaque, through bool) error {
	childThrough := through && !opaque
	seen := make(map[string]bool)
	for k, src := range srcs {
		entries, err := src.ReadDir(-1)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := e.Name()
			if seen[name] {
				continue
			}
			seen[name] = true
			from := dirLoc(src).child(name)
			var st syscall.Stat_t
			if err := from.Lstat(&st); err != nil {
				return err
			}
			to := dirLoc(dst).child(name)
			if !IsDir(&st) {
				if IsWhiteoutAt(from, &st) && !childThrough {
					continue // hides nothing any more
				}
				if err := m.disk.LinkAt(from, to); err != nil {
					return err
				}
				m.stats.Links++
				continue
			}
			if err := m.child(dst, srcs, k, name, childThrough); err != nil {
				return err
			}
		}
	}
	return copyDirAttrs(dirLoc(srcs[0]), dirLoc(dst), opaque && through)
}

// child merges the directory name, found in srcs[k], into a new
// directory of dst.
func (m *merger) child(dst *os.File, srcs []*os.File, k int, name string, through bool) error {
	csrcs, copaque, err := childSources(srcs, k, name)
	for _, f := range csrcs {
		defer f.Close()
	}
	if err != nil {
		return err
	}
	if err := m.disk.MkdirAt(dirLoc(dst).child(name), 0o700); err != nil {
		return err
	}
	m.stats.Dirs++
	cdst, err := openChild(dst, name)
	if err != nil {
		return err
	}
	defer cdst.Close()
	return m.dir(cdst, csrcs, copaque, through)
}

// childSources opens, for a directory name found in srcs[k], the
// directories that merge into it, and says whether it hides everything
// below. The upper's directory merges with the lower's only when it is
// not opaque and the lower holds a directory there too; a whiteout or a
// non-directory in the lower hides the layers below it, so the merged
// directory must then be opaque. The caller closes what it returns, on
// error too.
func childSources(srcs []*os.File, k int, name string) ([]*os.File, bool, error) {
	top, err := openChild(srcs[k], name)
	if err != nil {
		return nil, false, err
	}
	out := []*os.File{top}
	if IsOpaque(dirLoc(top)) {
		return out, true, nil
	}
	if k+1 >= len(srcs) {
		return out, false, nil
	}
	under := dirLoc(srcs[k+1]).child(name)
	var st syscall.Stat_t
	switch err := under.Lstat(&st); {
	case errors.Is(err, syscall.ENOENT):
		return out, false, nil
	case err != nil:
		return out, false, err
	case !IsDir(&st):
		return out, true, nil
	}
	u, err := openChild(srcs[k+1], name)
	if err != nil {
		return out, false, err
	}
	return append(out, u), IsOpaque(dirLoc(u)), nil
}

// copyDirAttrs gives the directory dst the extended attributes, owner,
// mode and times of src, in that order: chown may clear set-id bits, so
// the mode follows it, and the times come last because setting anything
// else would move them. The opaque mark is set only when asked, since the
// merged directory may need it where its source had none, or not need it
// where its source had one.
func copyDirAttrs(src, dst Loc, opaque bool) error {
	var st syscall.Stat_t
	if err := src.Lstat(&st); err != nil {
		return err
	}
	if err := CopyXattrs(src, dst); err != nil {
		return err
	}
	if opaque {
		if err := MarkOpaque(dst); err != nil {
			return err
		}
	}
	if err := dst.Chown(int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := dst.Chmod(st.Mode & 0o7777); err != nil {
		return err
	}
	return dst.Utimes([]unix.Timespec{unix.Timespec(st.Atim), unix.Timespec(st.Mtim)})
}
