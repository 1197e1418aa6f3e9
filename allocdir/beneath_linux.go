//go:build linux

package allocdir

import (
	"errors"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// unix.Stat_t and syscall.Stat_t are both generated from the kernel's
// struct stat for the running architecture; this fails to compile if they
// ever differ in size.
var _ [unsafe.Sizeof(unix.Stat_t{}) - unsafe.Sizeof(syscall.Stat_t{})]byte
var _ [unsafe.Sizeof(syscall.Stat_t{}) - unsafe.Sizeof(unix.Stat_t{})]byte

// sysStat views a unix.Stat_t as the syscall.Stat_t that fs.FileInfo.Sys
// consumers (archive/tar, os.SameFile) expect.
func sysStat(st *unix.Stat_t) *syscall.Stat_t {
	return (*syscall.Stat_t)(unsafe.Pointer(st))
}

// beneathFlags make openat2 refuse any symbolic link and anything that
// leaves the directory it starts from. Every path handed to openBeneath
// has already been resolved, so a link found now was planted since, and
// the open fails (ELOOP or EXDEV) instead of following it.
const beneathFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// OpenBeneath opens the symlink-free path p (relative to dirfd; "" or "."
// for dirfd itself) with flags, refusing any symbolic link on the way and
// anything outside dirfd: a link planted since p was resolved makes the
// open fail instead of being followed. O_CLOEXEC is always added, so no
// child inherits the fd by accident. A path longer than PATH_MAX (a tree
// made deep through the mount, which resolves each name on its own) is
// opened in steps, each beneath the directory the last one opened.
func OpenBeneath(dirfd int, p string, flags int, mode uint32) (int, error) {
	if p == "" {
		p = "."
	}
	rest, step := p, -1
	defer func() {
		if step >= 0 {
			unix.Close(step)
		}
	}()
	for len(rest) > unix.PathMax-1 {
		cut := strings.LastIndexByte(rest[:unix.PathMax-1], '/')
		if cut <= 0 {
			return -1, &fs.PathError{Op: "open", Path: p, Err: unix.ENAMETOOLONG}
		}
		next, err := openat2Beneath(dirfd, rest[:cut], unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: p, Err: err}
		}
		if step >= 0 {
			unix.Close(step)
		}
		step, dirfd, rest = next, next, rest[cut+1:]
	}
	fd, err := openat2Beneath(dirfd, rest, flags, mode)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return fd, nil
}

func openat2Beneath(dirfd int, p string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: beneathFlags}
	for {
		fd, err := unix.Openat2(dirfd, p, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// LstatBeneath stats p without following a final symbolic link.
func LstatBeneath(dirfd int, p string) (*syscall.Stat_t, error) {
	fd, err := OpenBeneath(dirfd, p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return nil, &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	return &st, nil
}

// ReadlinkBeneath returns the target of p if it is a symbolic link.
func ReadlinkBeneath(dirfd int, p string) (string, bool, error) {
	fd, err := OpenBeneath(dirfd, p, unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", false, &fs.PathError{Op: "fstat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		return "", false, nil
	}
	target, err := readlinkFd(fd)
	if err != nil {
		return "", false, &fs.PathError{Op: "readlink", Path: p, Err: err}
	}
	return target, true, nil
}

// readlinkFd reads the target of the symbolic link an O_PATH fd refers to.
func readlinkFd(fd int) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(fd, "", buf)
		if err != nil {
			return "", err
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, len(buf)*4)
	}
}

// statInfo adapts a stat result to fs.FileInfo. Sys returns the
// *syscall.Stat_t, which archive/tar uses for owners.
type statInfo struct {
	name string
	st   syscall.Stat_t
}

// NewStatInfo wraps a stat result as an fs.FileInfo named name.
func NewStatInfo(name string, st *syscall.Stat_t) fs.FileInfo {
	return &statInfo{name: name, st: *st}
}

func (s *statInfo) Name() string       { return s.name }
func (s *statInfo) Size() int64        { return s.st.Size }
func (s *statInfo) Mode() fs.FileMode  { return UnixMode(s.st.Mode) }
func (s *statInfo) ModTime() time.Time { return time.Unix(s.st.Mtim.Unix()) }
func (s *statInfo) IsDir() bool        { return s.st.Mode&syscall.S_IFMT == syscall.S_IFDIR }
func (s *statInfo) Sys() any           { return &s.st }

// UnixMode converts a stat st_mode to an fs.FileMode.
func UnixMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		mode |= fs.ModeDir
	case syscall.S_IFLNK:
		mode |= fs.ModeSymlink
	case syscall.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		mode |= fs.ModeSocket
	case syscall.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&syscall.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// beneathFS is an fs.FS over a directory fd in which every open refuses
// symbolic links, so a snapshot walk cannot be redirected by a link
// planted while it runs. It implements fs.ReadDirFS and fs.ReadLinkFS.
type beneathFS struct {
	fd int
}

var (
	_ fs.ReadDirFS  = beneathFS{}
	_ fs.ReadLinkFS = beneathFS{}
)

func (b beneathFS) check(op, name string) error {
	if !fs.ValidPath(name) {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return nil
}

// Open opens a file for reading; a FIFO does not block the open.
func (b beneathFS) Open(name string) (fs.File, error) {
	fd, err := b.OpenFd(name)
	if err != nil {
		return nil, err
	}
	return fdFile(fd, name), nil
}

// ReadDir lists a directory with lstat information, sorted by name.
func (b beneathFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if err := b.check("readdir", name); err != nil {
		return nil, err
	}
	infos, err := readDirBeneath(b.fd, name)
	if err != nil {
		return nil, err
	}
	out := make([]fs.DirEntry, len(infos))
	for i, fi := range infos {
		out[i] = fs.FileInfoToDirEntry(fi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

// Lstat stats name without following a final link.
func (b beneathFS) Lstat(name string) (fs.FileInfo, error) {
	if err := b.check("lstat", name); err != nil {
		return nil, err
	}
	st, err := LstatBeneath(b.fd, name)
	if err != nil {
		return nil, err
	}
	return NewStatInfo(path.Base(name), st), nil
}

// ReadLink returns a link's raw target.
func (b beneathFS) ReadLink(name string) (string, error) {
	if err := b.check("readlink", name); err != nil {
		return "", err
	}
	target, isLink, err := ReadlinkBeneath(b.fd, name)
	if err != nil {
		return "", err
	}
	if !isLink {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	return target, nil
}

// NewBeneathFS returns a ReadFS over the directory fd: every open refuses
// symbolic links and stays beneath fd. The caller keeps fd open while the
// ReadFS is in use and closes it afterwards.
func NewBeneathFS(fd int) ReadFS { return beneathFS{fd: fd} }

// OpenFd opens name for reading as Open does, as a raw fd, which the
// snapshot writer (allocdir/snapshot) reads without the cost of an
// *os.File; a FIFO does not block the open.
func (b beneathFS) OpenFd(name string) (int, error) {
	if err := b.check("open", name); err != nil {
		return -1, err
	}
	return OpenBeneath(b.fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
}

// fdFile wraps a raw fd as an *os.File named for error messages.
func fdFile(fd int, name string) *os.File { return os.NewFile(uintptr(fd), name) }

// readDirBeneath lists dir with lstat information, sorted by name. An
// entry removed between the listing and its lstat is left out.
func readDirBeneath(rootFd int, dir string) ([]fs.FileInfo, error) {
	fd, err := OpenBeneath(rootFd, dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	f := fdFile(fd, dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	sort.Strings(names)
	out := make([]fs.FileInfo, 0, len(names))
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, &fs.PathError{Op: "lstat", Path: path.Join(dir, name), Err: err}
		}
		out = append(out, NewStatInfo(name, sysStat(&st)))
	}
	return out, nil
}
