package layer

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// OriginXattr records, on an entry copied up into the upper layer, the
// inode number of the lower entry it was copied from: the mount keeps
// showing that number, so st_ino does not change under a task when a
// write copies a file up. It lives under trusted.overlay., so it is
// never shown to a task nor carried by a later copy-up.
const OriginXattr = "trusted.overlay.allocfs.origin"

// Origin returns the lower inode number the upper entry l was copied up
// from, and false for an entry made in the upper layer.
func Origin(l Loc) (uint64, bool) {
	var buf [24]byte
	n, err := l.Getxattr(OriginXattr, buf[:])
	if err != nil {
		return 0, false
	}
	ino, err := strconv.ParseUint(string(buf[:n]), 10, 64)
	return ino, err == nil
}

// CopyUp makes rel, shown from the lower layer at position from, exist in
// the upper layer, with its type, data (holes kept), mode, owner, times
// and extended attributes, and its origin recorded. rel's directory must
// be in the upper layer already; a directory copied up keeps merging with
// its lowers. An entry already in the upper layer is left as it is.
//
// A regular file with more than one name copies up once: every other
// name of it that the stack shows from the same layer is linked to the
// copy (their directories copied up as needed), so that the names stay
// one file with the right link count, as they were below.
func (s *Stack) CopyUp(rel string, from int) error {
	var st syscall.Stat_t
	if err := s.Lstat(from, rel, &st); err != nil {
		return err
	}
	if done, err := s.upperHolds(rel); done || err != nil {
		return err
	}
	if err := s.copyInto(from, rel, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink < 2 || s.Links == nil {
		return nil
	}
	names, err := s.Links.Names(s.Roots[from], st.Ino)
	if err != nil {
		return err
	}
	for _, name := range names {
		if name == rel {
			continue
		}
		layers, other, err := s.Resolve(name)
		if err != nil || layers[0] != from || other.Ino != st.Ino {
			continue // hidden or replaced above: no longer a name of it
		}
		if err := s.EnsureUpperDir(filepath.Dir(name)); err != nil {
			return err
		}
		restoreDir := s.quietly(filepath.Dir(name), true)
		restoreFile := s.quietly(rel, false)
		if err := s.link(rel, name); err != nil {
			return err
		}
		if err := errors.Join(restoreFile(), restoreDir()); err != nil {
			return err
		}
	}
	return nil
}

// copyInto copies rel from the layer at from into the upper layer (see
// copyEntry), leaving the times of the upper directory it lands in as
// they were: a copy-up is not a change a task made to that directory.
func (s *Stack) copyInto(from int, rel string, st *syscall.Stat_t) (err error) {
	if s.CopyUps != nil {
		start := time.Now()
		defer func() {
			if err == nil {
				s.CopyUps.CopiedUp(st.Mode&syscall.S_IFMT, copiedBytes(st), time.Since(start))
			}
		}()
	}
	restore := s.quietly(filepath.Dir(rel), true)
	dst, err := s.Loc(0, rel)
	if err != nil {
		return err
	}
	defer dst.Close()
	if err := s.copyEntry(from, rel, dst, st); err != nil {
		return err
	}
	// The copy shows the lower entry's ctime, as the task saw it.
	return errors.Join(s.Ctimes.seal(dst, st.Ctim), restore())
}

// Lstat stats rel in the layer at position i.
func (s *Stack) Lstat(i int, rel string, st *syscall.Stat_t) error {
	l, err := s.Loc(i, rel)
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Lstat(st)
}

// link gives the upper entry rel the other name to, in the upper layer.
func (s *Stack) link(rel, to string) error {
	from, err := s.Loc(0, rel)
	if err != nil {
		return err
	}
	defer from.Close()
	dst, err := s.Loc(0, to)
	if err != nil {
		return err
	}
	defer dst.Close()
	return Link(from, dst)
}

// upperHolds reports whether the upper layer already holds a copied-up
// entry at rel, and removes a whiteout there.
func (s *Stack) upperHolds(rel string) (bool, error) {
	dst, err := s.Loc(0, rel)
	if err != nil {
		return false, err
	}
	defer dst.Close()
	var st syscall.Stat_t
	if err := dst.Lstat(&st); err != nil {
		return false, nil
	}
	if !IsWhiteoutAt(dst, &st) {
		return true, nil
	}
	return false, dst.Unlink()
}

// Resolve looks rel up from the volume's root, component by component,
// as a lookup through the mount would.
func (s *Stack) Resolve(rel string) ([]int, syscall.Stat_t, error) {
	layers := s.All()
	var st syscall.Stat_t
	if err := s.Lstat(0, "", &st); err != nil {
		return nil, st, err
	}
	if rel == "" || rel == "." {
		return layers, st, nil
	}
	cur := ""
	for _, c := range strings.Split(filepath.Clean(rel), "/") {
		if !IsDir(&st) {
			return nil, st, syscall.ENOTDIR
		}
		cur = filepath.Join(cur, c)
		var err error
		if layers, st, err = s.Visible(cur, layers); err != nil {
			return nil, st, err
		}
	}
	return layers, st, nil
}

// EnsureUpperDir copies the directory rel and its parents up into the
// upper layer where they are only in lower ones.
func (s *Stack) EnsureUpperDir(rel string) error {
	if rel == "" || rel == "." {
		return nil
	}
	layers := s.All()
	cur := ""
	for _, c := range strings.Split(filepath.Clean(rel), "/") {
		cur = filepath.Join(cur, c)
		var err error
		var st syscall.Stat_t
		if layers, st, err = s.Visible(cur, layers); err != nil {
			return err
		}
		if !IsDir(&st) {
			return &os.PathError{Op: "copy up", Path: cur, Err: syscall.ENOTDIR}
		}
		if layers[0] != 0 {
			if err := s.copyInto(layers[0], cur, &st); err != nil {
				return err
			}
			layers = append([]int{0}, layers...)
		}
	}
	return nil
}

// copyEntry copies one entry (not a directory's content) of the layer
// at from, whose lstat is st, to dst in the upper layer.
func (s *Stack) copyEntry(from int, rel string, dst Loc, st *syscall.Stat_t) error {
	perm := st.Mode & 07777
	ino, _ := s.Salted(from, st.Ino)
	if s.Identity != nil {
		ino = s.Identity(from, rel, st)
	}
	origin := strconv.FormatUint(ino, 10)
	src, err := s.Loc(from, rel)
	if err != nil {
		return err
	}
	defer src.Close()
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		// Complete, metadata included, before it gets its name.
		return s.copyFile(from, rel, dst, st, origin)
	case syscall.S_IFDIR:
		if err := dst.Mkdir(perm & 0o777); err != nil {
			return err
		}
	case syscall.S_IFLNK:
		target, err := src.Readlink()
		if err != nil {
			return err
		}
		if err := dst.Symlink(target); err != nil {
			return err
		}
	default:
		if err := dst.Mknod(st.Mode, int(st.Rdev)); err != nil {
			return err
		}
		if IsWhiteout(st) {
			// A visible device 0/0 is a task's own: it stays one.
			if err := MarkRealDevice(dst); err != nil {
				return err
			}
		}
	}
	if err := dst.Chown(int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		// chown cleared set-id bits: put the mode back.
		if err := dst.Chmod(perm); err != nil {
			return err
		}
	}
	// After the chown, which would drop security.capability.
	if err := CopyXattrs(src, dst); err != nil {
		return err
	}
	if err := dst.Setxattr(OriginXattr, []byte(origin), 0); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	return dst.Utimes(ts)
}

// copyFile copies a regular file into an unnamed file (O_TMPFILE) in
// dst's directory, gives it owner, mode, extended attributes, origin and
// times, and links it in under dst only then, so that a crash never
// leaves a partial file, or a temporary name, behind. Its bytes are
// cloned where the filesystem can (FICLONE), else copied segment by
// segment around holes.
func (s *Stack) copyFile(from int, rel string, dst Loc, st *syscall.Stat_t, origin string) error {
	fd, err := s.Open(from, rel, unix.O_RDONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	dir := Loc{Dir: dst.Dir, path: filepath.Dir(dst.path)}
	tfd, err := dir.Open(unix.O_TMPFILE|unix.O_WRONLY, st.Mode&0o777)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err := fillCopy(tfd, fd, st); err != nil {
		return &os.PathError{Op: "copy up", Path: dst.path, Err: err}
	}
	if err := unix.Fsetxattr(tfd, OriginXattr, []byte(origin), 0); err != nil {
		return &os.PathError{Op: "setxattr " + OriginXattr, Path: dst.path, Err: err}
	}
	return Link(Loc{Dir: tfd, path: "copy of " + dst.path}, dst)
}

// CopyAnonymous copies the open lower file fd into an unnamed file of the
// upper layer, with its owner, mode, extended attributes and times, and
// returns it open for reading and writing. It is the copy-up of a lower
// file whose last name is gone while a task still has it open: the task
// may change it through its fd, the lower file must stay as it is, and no
// name may show the copy. The copy lives as long as a descriptor of it.
func (s *Stack) CopyAnonymous(fd int) (int, error) {
	start := time.Now()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return -1, &os.PathError{Op: "fstat", Path: "lower file", Err: err}
	}
	root, err := s.Loc(0, "")
	if err != nil {
		return -1, err
	}
	defer root.Close()
	tfd, err := root.Open(unix.O_TMPFILE|unix.O_RDWR, st.Mode&0o777)
	if err != nil {
		return -1, err
	}
	err = fillCopy(tfd, fd, &st)
	if err != nil {
		unix.Close(tfd)
		return -1, &os.PathError{Op: "copy up", Path: "open unlinked lower file", Err: err}
	}
	if s.CopyUps != nil {
		s.CopyUps.CopiedUp(st.Mode&syscall.S_IFMT, copiedBytes(&st), time.Since(start))
	}
	return tfd, nil
}

// copiedBytes is what a copy-up of the entry whose lstat is st copies:
// a regular file's size, nothing for the rest.
func copiedBytes(st *syscall.Stat_t) int64 {
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	return st.Size
}

// fillCopy gives the empty file tfd the bytes (cloned where the
// filesystem can, else copied around holes), owner, mode, extended
// attributes and times of the file open at fd, whose fstat is st. Both
// descriptors stay the caller's.
func fillCopy(tfd, fd int, st *syscall.Stat_t) error {
	inFd, err := unix.Dup(fd)
	if err != nil {
		return err
	}
	in := os.NewFile(uintptr(inFd), "lower file")
	defer in.Close()
	outFd, err := unix.Dup(tfd)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(outFd), "anonymous copy")
	defer out.Close()
	if unix.IoctlFileClone(tfd, fd) != nil {
		if err := copySparse(out, in); err != nil {
			return err
		}
	}
	if err := unix.Fchown(tfd, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(tfd, st.Mode&07777); err != nil {
		return err
	}
	names, err := fdXattrs(fd)
	err = copyXattrs(names, err, func(name string) ([]byte, error) { return fdXattr(fd, name) },
		func(name string, val []byte) error { return unix.Fsetxattr(tfd, name, val, 0) })
	if err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", tfd), ts, 0)
}

// copySparse copies in's bytes into out, the empty file of a copy-up,
// segment by segment between holes (SEEK_DATA, SEEK_HOLE), so that a
// sparse file stays sparse and the copy costs what the file holds, not
// its size; the size is set at the end, which keeps a trailing hole.
// Segments go by copy_file_range, which the filesystem may turn into a
// copy without reading the data through user space.
func copySparse(out, in *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			// No SEEK_DATA here: everything is data.
			data = off
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		if err := copyRange(ofd, ifd, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyRange copies n bytes at off of ifd to the same offset of ofd, by
// copy_file_range where the kernel can, else through a buffer.
func copyRange(ofd, ifd int, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeBuffered(ofd, ifd, roff, n)
			}
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF // the file shrank under the copy
		}
		n -= int64(c)
	}
	return nil
}

func copyRangeBuffered(ofd, ifd int, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		r, err := unix.Pread(ifd, buf[:min(n, int64(len(buf)))], off)
		if err != nil {
			return err
		}
		if r == 0 {
			return io.ErrUnexpectedEOF
		}
		if _, err := unix.Pwrite(ofd, buf[:r], off); err != nil {
			return err
		}
		off += int64(r)
		n -= int64(r)
	}
	return nil
}

// Materialize copies into the upper layer every entry visible at rel (a
// directory present in the upper layer and merged over layers[1:]),
// recursively, and marks each directory opaque: it is about to move
// away from the lower paths it merged with.
func (s *Stack) Materialize(rel string, layers []int) error {
	entries, err := s.List(rel, layers)
	if err != nil {
		return err
	}
	for _, e := range entries {
		childRel := filepath.Join(rel, e.Name)
		childLayers, _, err := s.Visible(childRel, layers)
		if err != nil {
			return err
		}
		if childLayers[0] != 0 {
			if err := s.CopyUp(childRel, childLayers[0]); err != nil {
				return err
			}
			if e.Mode == syscall.S_IFDIR {
				childLayers = append([]int{0}, childLayers...)
			}
		}
		if e.Mode == syscall.S_IFDIR && len(childLayers) > 1 {
			if err := s.Materialize(childRel, childLayers); err != nil {
				return err
			}
		}
	}
	return s.MarkOpaque(rel)
}

// MarkOpaque makes the upper directory rel hide the lower layers at its
// path, without a change a task could see in its ctime.
func (s *Stack) MarkOpaque(rel string) error {
	restore := s.quietly(rel, false)
	l, err := s.Loc(0, rel)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := MarkOpaque(l); err != nil {
		return err
	}
	return restore()
}
