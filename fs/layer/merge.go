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
// one.
type MergeDisk interface {
	// Mkdir creates a directory with mode (the umask applies; Merge sets
	// the final mode itself).
	Mkdir(path string, mode uint32) error
	// Link makes newpath a hard link of oldpath.
	Link(oldpath, newpath string) error
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
// partial merge for the caller to remove.
func Merge(d MergeDisk, dst, upper, lower string, through bool) (MergeStats, error) {
	m := &merger{disk: d, dst: dst}
	srcs := []string{upper}
	opaque := IsOpaque(PathLoc(upper))
	if !opaque {
		srcs = append(srcs, lower)
		opaque = IsOpaque(PathLoc(lower))
	}
	err := m.dir("", srcs, opaque, through)
	return m.stats, err
}

// merger is one Merge under way.
type merger struct {
	disk  MergeDisk
	dst   string
	stats MergeStats
}

// dir fills the directory rel of the merged layer, already created, with
// the entries of the directories rel in srcs (layer roots, upper first: a
// name in the first hides the same name in the second), then gives it
// the attributes of srcs[0]'s, which is the one the pair showed. opaque
// says that nothing below the merged layer may show through rel; through
// that something would, were it not opaque, so the mark is needed.
func (m *merger) dir(rel string, srcs []string, opaque, through bool) error {
	dst := filepath.Join(m.dst, rel)
	childThrough := through && !opaque
	seen := make(map[string]bool)
	for k, src := range srcs {
		entries, err := os.ReadDir(filepath.Join(src, rel))
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := e.Name()
			if seen[name] {
				continue
			}
			seen[name] = true
			child := filepath.Join(rel, name)
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(src, child), &st); err != nil {
				return &os.PathError{Op: "lstat", Path: filepath.Join(src, child), Err: err}
			}
			if !IsDir(&st) {
				if IsWhiteoutAt(PathLoc(filepath.Join(src, child)), &st) && !childThrough {
					continue // hides nothing any more
				}
				if err := m.disk.Link(filepath.Join(src, child), filepath.Join(m.dst, child)); err != nil {
					return err
				}
				m.stats.Links++
				continue
			}
			csrcs, copaque, err := childSources(srcs, k, child)
			if err != nil {
				return err
			}
			if err := m.disk.Mkdir(filepath.Join(m.dst, child), 0o700); err != nil {
				return err
			}
			m.stats.Dirs++
			if err := m.dir(child, csrcs, copaque, childThrough); err != nil {
				return err
			}
		}
	}
	return copyDirAttrs(filepath.Join(srcs[0], rel), dst, opaque && through)
}

// childSources returns, for a directory child found in srcs[k], the
// layers whose directories merge into it and whether it hides everything
// below. The upper's directory merges with the lower's only when it is
// not opaque and the lower holds a directory there too; a whiteout or a
// non-directory in the lower hides the layers below it, so the merged
// directory must then be opaque.
func childSources(srcs []string, k int, child string) ([]string, bool, error) {
	top := filepath.Join(srcs[k], child)
	if IsOpaque(PathLoc(top)) {
		return []string{srcs[k]}, true, nil
	}
	if k+1 >= len(srcs) {
		return []string{srcs[k]}, false, nil
	}
	under := filepath.Join(srcs[k+1], child)
	var st syscall.Stat_t
	switch err := syscall.Lstat(under, &st); {
	case errors.Is(err, syscall.ENOENT):
		return []string{srcs[k]}, false, nil
	case err != nil:
		return nil, false, &os.PathError{Op: "lstat", Path: under, Err: err}
	case IsDir(&st):
		return []string{srcs[k], srcs[k+1]}, IsOpaque(PathLoc(under)), nil
	default:
		return []string{srcs[k]}, true, nil
	}
}

// copyDirAttrs gives the directory dst the extended attributes, owner,
// mode and times of src, in that order: chown may clear set-id bits, so
// the mode follows it, and the times come last because setting anything
// else would move them. The opaque mark is set only when asked, since the
// merged directory may need it where its source had none, or not need it
// where its source had one.
func copyDirAttrs(src, dst string, opaque bool) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if err := CopyXattrs(PathLoc(src), PathLoc(dst)); err != nil {
		return err
	}
	if opaque {
		if err := MarkOpaque(PathLoc(dst)); err != nil {
			return err
		}
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return &os.PathError{Op: "chown", Path: dst, Err: err}
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return &os.PathError{Op: "chmod", Path: dst, Err: err}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: dst, Err: err}
	}
	return nil
}
