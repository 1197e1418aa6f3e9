package layer

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Every entry the mount serves is reached fd-relative: the directory that
// holds it is opened (O_PATH) beneath its layer's root with openat2, and
// the entry is then named in that directory by an *at() call. Two limits
// of building backing paths go away with it: the kernel's PATH_MAX applies
// to the path a task gives, relative to its own directory, and never to
// the data dir's prefix in front of it; and a symbolic link swapped in by
// a task for a directory on the way is an error (RESOLVE_NO_SYMLINKS),
// never a way out of the layer.

// Loc names one entry the fd-relative way: the directory holding it and
// its name there. An empty Name is the directory itself. A Loc made by
// Stack.Loc holds its Dir until Close; one made by PathLoc names an
// absolute path (the store's own walks, tests) and holds nothing.
type Loc struct {
	Dir  int
	Name string
	// path names the entry in errors and logs; it is never used to
	// reach it.
	path string
	// release gives Dir back: closes it, or unpins a cached layer root.
	release func()
}

// PathLoc names the entry at the absolute path p.
func PathLoc(p string) Loc { return Loc{Dir: unix.AT_FDCWD, Name: p, path: p} }

// FdLoc names the open file fd itself (for a link of a file with no
// name); the Loc owns fd and closes it.
func FdLoc(fd int, path string) Loc {
	return Loc{Dir: fd, path: path, release: func() { unix.Close(fd) }}
}

// String names the entry for errors and logs.
func (l Loc) String() string { return l.path }

// child names the entry name of the directory l (whose Name is empty);
// it shares l's descriptor.
func (l Loc) child(name string) Loc {
	return Loc{Dir: l.Dir, Name: name, path: filepath.Join(l.path, name)}
}

// Close releases the directory descriptor the Loc owns.
func (l *Loc) Close() {
	if l.release != nil {
		l.release()
	}
	l.Dir, l.release = -1, nil
}

// at is the (name, flags) pair of an *at() call on the entry: the
// directory itself is named by AT_EMPTY_PATH.
func (l Loc) at(flags int) (string, int) {
	if l.Name == "" {
		return "", flags | unix.AT_EMPTY_PATH
	}
	return l.Name, flags
}

func (l Loc) fail(op string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: l.path, Err: err}
}

// Lstat stats the entry without following a symbolic link.
func (l Loc) Lstat(st *syscall.Stat_t) error {
	name, flags := l.at(unix.AT_SYMLINK_NOFOLLOW)
	// unix.Stat_t and syscall.Stat_t are the same kernel struct.
	return l.fail("lstat", unix.Fstatat(l.Dir, name, (*unix.Stat_t)(unsafe.Pointer(st)), flags))
}

// Statx is statx(2) of the entry, never following a symbolic link.
func (l Loc) Statx(flags, mask int, st *unix.Statx_t) error {
	name, flags := l.at(flags | unix.AT_SYMLINK_NOFOLLOW)
	return l.fail("statx", unix.Statx(l.Dir, name, flags, mask, st))
}

// Open opens the entry; a symbolic link there is an error (O_NOFOLLOW).
func (l Loc) Open(flags int, mode uint32) (int, error) {
	name := l.Name
	if name == "" {
		name = "."
	}
	for {
		fd, err := unix.Openat(l.Dir, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err == unix.EINTR {
			continue
		}
		return fd, l.fail("open", err)
	}
}

// Readlink returns the target of the symbolic link.
func (l Loc) Readlink() (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(l.Dir, l.Name, buf)
		if err != nil {
			return "", l.fail("readlink", err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// Mkdir makes the directory.
func (l Loc) Mkdir(mode uint32) error { return l.fail("mkdir", unix.Mkdirat(l.Dir, l.Name, mode)) }

// Mknod makes a device, FIFO or socket node.
func (l Loc) Mknod(mode uint32, dev int) error {
	return l.fail("mknod", unix.Mknodat(l.Dir, l.Name, mode, dev))
}

// Symlink makes a symbolic link to target.
func (l Loc) Symlink(target string) error {
	return l.fail("symlink", unix.Symlinkat(target, l.Dir, l.Name))
}

// Unlink removes a non-directory.
func (l Loc) Unlink() error { return l.fail("unlink", unix.Unlinkat(l.Dir, l.Name, 0)) }

// Rmdir removes an empty directory.
func (l Loc) Rmdir() error { return l.fail("rmdir", unix.Unlinkat(l.Dir, l.Name, unix.AT_REMOVEDIR)) }

// Chown changes the owner without following a symbolic link; -1 keeps
// an id.
func (l Loc) Chown(uid, gid int) error {
	name, flags := l.at(unix.AT_SYMLINK_NOFOLLOW)
	return l.fail("chown", unix.Fchownat(l.Dir, name, uid, gid, flags))
}

// Chmod changes the mode without following a symbolic link
// (fchmodat2, Linux 6.6): a link swapped in for the entry is refused,
// never followed to its target.
func (l Loc) Chmod(mode uint32) error {
	name, flags := l.at(unix.AT_SYMLINK_NOFOLLOW)
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return l.fail("chmod", err)
	}
	_, _, e := unix.Syscall6(unix.SYS_FCHMODAT2, uintptr(l.Dir), uintptr(unsafe.Pointer(p)), uintptr(mode), uintptr(flags), 0, 0)
	if e != 0 {
		return l.fail("chmod", e)
	}
	return nil
}

// Utimes sets the access and modification times (UTIME_OMIT and
// UTIME_NOW allowed), without following a symbolic link.
func (l Loc) Utimes(ts []unix.Timespec) error {
	name, flags := l.at(unix.AT_SYMLINK_NOFOLLOW)
	return l.fail("utimes", unix.UtimesNanoAt(l.Dir, name, ts, flags))
}

// Link gives the entry from another name, to.
func Link(from, to Loc) error {
	dir, name, flags := from.Dir, from.Name, 0
	if name == "" {
		// An open unnamed file (O_TMPFILE): linkat's AT_EMPTY_PATH
		// would need CAP_DAC_READ_SEARCH, its /proc link does not.
		dir, name, flags = unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(from.Dir), unix.AT_SYMLINK_FOLLOW
	}
	if err := unix.Linkat(dir, name, to.Dir, to.Name, flags); err != nil {
		return &os.LinkError{Op: "link", Old: from.path, New: to.path, Err: err}
	}
	return nil
}

// Rename is renameat2(2) of from to to.
func Rename(from, to Loc, flags uint) error {
	if err := unix.Renameat2(from.Dir, from.Name, to.Dir, to.Name, flags); err != nil {
		return &os.LinkError{Op: "rename", Old: from.path, New: to.path, Err: err}
	}
	return nil
}

// The *xattrat system calls (Linux 6.13) reach a symbolic link's own
// attributes, and a directory's through its O_PATH descriptor, without a
// path: unix has their numbers but no wrappers.

// xattrArgs is struct xattr_args of include/uapi/linux/xattr.h.
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

// xattrAt is the (directory, name, flags) triple of an *xattrat call on
// the entry. The *xattrat calls refuse an O_PATH descriptor with an empty
// path (EBADF), so the directory itself (never a symbolic link) is named
// by its /proc/self/fd link, followed.
func (l Loc) xattrAt() (int, string, int) {
	if l.Name == "" {
		return unix.AT_FDCWD, "/proc/self/fd/" + strconv.Itoa(l.Dir), 0
	}
	return l.Dir, l.Name, unix.AT_SYMLINK_NOFOLLOW
}

func xattrSyscall(trap uintptr, l Loc, attr string, args *xattrArgs) (int, error) {
	dir, name, flags := l.xattrAt()
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	r, _, e := unix.Syscall6(trap, uintptr(dir), uintptr(unsafe.Pointer(p)), uintptr(flags),
		uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

func bufArgs(buf []byte, flags int) *xattrArgs {
	args := &xattrArgs{size: uint32(len(buf)), flags: uint32(flags)}
	if len(buf) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&buf[0])))
	}
	return args
}

// Getxattr reads the attribute attr into dest (its size with an empty
// dest). Errors are bare errnos: ENODATA is an answer, not a failure.
func (l Loc) Getxattr(attr string, dest []byte) (int, error) {
	n, err := xattrSyscall(unix.SYS_GETXATTRAT, l, attr, bufArgs(dest, 0))
	runtime.KeepAlive(dest)
	return n, err
}

// Setxattr sets the attribute attr (flags XATTR_CREATE, XATTR_REPLACE).
func (l Loc) Setxattr(attr string, val []byte, flags int) error {
	_, err := xattrSyscall(unix.SYS_SETXATTRAT, l, attr, bufArgs(val, flags))
	runtime.KeepAlive(val)
	return l.fail("setxattr "+attr, err)
}

// Removexattr removes the attribute attr; a bare errno (ENODATA).
func (l Loc) Removexattr(attr string) error {
	dir, name, flags := l.xattrAt()
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return err
	}
	_, _, e := unix.Syscall6(unix.SYS_REMOVEXATTRAT, uintptr(dir), uintptr(unsafe.Pointer(p)), uintptr(flags), uintptr(unsafe.Pointer(a)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

// Listxattr lists the stored attribute names, NUL-terminated, into dest
// (their size with an empty dest); a bare errno.
func (l Loc) Listxattr(dest []byte) (int, error) {
	dir, name, flags := l.xattrAt()
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	var buf unsafe.Pointer
	if len(dest) > 0 {
		buf = unsafe.Pointer(&dest[0])
	}
	r, _, e := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dir), uintptr(unsafe.Pointer(p)), uintptr(flags), uintptr(buf), uintptr(len(dest)), 0)
	runtime.KeepAlive(dest)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// maxResolve is the longest path handed to one openat2: the kernel's
// PATH_MAX with room for the terminating NUL. A deeper path is opened
// in steps, each beneath the directory the last one opened.
const maxResolve = unix.PathMax - 1

// openBeneath opens rel beneath the directory dir with openat2: no
// symbolic link is followed on the way or at the end, and nothing
// outside dir is reached. rel may be longer than PATH_MAX.
func openBeneath(dir int, rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	owned := -1
	defer func() {
		if owned >= 0 {
			unix.Close(owned)
		}
	}()
	for len(rel) > maxResolve {
		cut := strings.LastIndexByte(rel[:maxResolve], '/')
		if cut <= 0 {
			return -1, unix.ENAMETOOLONG
		}
		next, err := openat2(dir, rel[:cut], unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return -1, err
		}
		if owned >= 0 {
			unix.Close(owned)
		}
		owned, dir, rel = next, next, rel[cut+1:]
	}
	return openat2(dir, rel, flags)
}

func openat2(dir int, rel string, flags int) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(dir, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// Loc names rel, a path inside the volume, in the layer at position i:
// its directory opened beneath the layer's root. The caller closes it.
func (s *Stack) Loc(i int, rel string) (Loc, error) {
	base, rel, err := s.where(i, rel)
	if err != nil {
		return Loc{Dir: -1}, &os.PathError{Op: "lookup", Path: s.Path(i, rel), Err: err}
	}
	root, done, err := s.rootAt(base)
	if err != nil {
		return Loc{Dir: -1}, err
	}
	path := filepath.Join(base, rel)
	k := strings.LastIndexByte(rel, '/')
	if k < 0 {
		// An entry of the root: the root's own descriptor, pinned
		// until Close.
		return Loc{Dir: root, Name: rel, path: path, release: done}, nil
	}
	defer done()
	if s.Dirs != nil && !s.IsHost(i) && !s.held(base) {
		dir, release, err := s.Dirs.open(base, root, rel[:k])
		if err != nil {
			return Loc{Dir: -1}, err
		}
		return Loc{Dir: dir, Name: rel[k+1:], path: path, release: release}, nil
	}
	dir, err := openBeneath(root, rel[:k], unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return Loc{Dir: -1}, &os.PathError{Op: "open directory", Path: filepath.Dir(path), Err: err}
	}
	return Loc{Dir: dir, Name: rel[k+1:], path: path, release: func() { unix.Close(dir) }}, nil
}

// Open opens rel, inside the volume, in the layer at position i, beneath
// the layer's root (see openBeneath).
func (s *Stack) Open(i int, rel string, flags int) (int, error) {
	base, rel, err := s.where(i, rel)
	if err != nil {
		return -1, &os.PathError{Op: "openat2", Path: s.Path(i, rel), Err: err}
	}
	root, done, err := s.rootAt(base)
	if err != nil {
		return -1, err
	}
	defer done()
	fd, err := openBeneath(root, rel, flags)
	if err != nil {
		return -1, &os.PathError{Op: "openat2", Path: filepath.Join(base, rel), Err: err}
	}
	return fd, nil
}

// cleanRel turns a path inside the volume into the form the *at calls
// take: no leading slash, "" for the root.
func cleanRel(rel string) string {
	rel = strings.TrimPrefix(filepath.Clean("/"+rel), "/")
	return rel
}
