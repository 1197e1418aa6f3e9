package difftest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"

	"golang.org/x/sys/unix"
)

// Attr is the part of a stat result that two file systems holding the
// same tree must agree on (see the package doc for what is left out and
// why).
type Attr struct {
	Type   string `json:"t"`
	Perm   uint32 `json:"p"` // the 07777 bits: permissions, set-id and sticky
	UID    uint32 `json:"u"`
	GID    uint32 `json:"g"`
	Size   int64  `json:"s"` // 0 for directories
	Nlink  uint64 `json:"n"`
	Rdev   uint64 `json:"r,omitempty"`
	Sparse bool   `json:"h,omitempty"` // a regular file with a hole (SEEK_HOLE before its end)
}

// Result is what one side answered to one operation.
type Result struct {
	Errno string   `json:"e,omitempty"`
	N     int64    `json:"n,omitempty"`
	Data  string   `json:"d,omitempty"`
	Names []string `json:"l,omitempty"`
	Stat  *Attr    `json:"st,omitempty"`
	// FstatErr is the error of the fstat that follows a successful
	// operation on an fd.
	FstatErr string `json:"fe,omitempty"`
	// Ino is the inode number of the object the operation acted on,
	// before it ran (the fd's object for fd operations); it classifies
	// divergences and is never compared.
	Ino uint64 `json:"i,omitempty"`
}

// String shows a result with its stat, for a trace.
func (r Result) String() string {
	st := "-"
	if r.Stat != nil {
		st = fmt.Sprintf("%+v", *r.Stat)
	}
	return fmt.Sprintf("{errno %s, n %d, data %s, names %v, stat %s, fstat errno %s}", orOK(r.Errno), r.N, short(r.Data), r.Names, st, orOK(r.FstatErr))
}

func attrOf(st *unix.Stat_t) *Attr {
	a := &Attr{
		Type:  typeName(st.Mode),
		Perm:  st.Mode & 0o7777,
		UID:   st.Uid,
		GID:   st.Gid,
		Size:  st.Size,
		Nlink: uint64(st.Nlink),
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		a.Size = 0
	case unix.S_IFCHR, unix.S_IFBLK:
		a.Rdev = uint64(st.Rdev)
	}
	return a
}

// hasHole reports whether the regular file open at fd, of size, has a
// hole before its end, leaving the fd's offset where it was.
func hasHole(fd int, size int64) bool {
	if size == 0 {
		return false
	}
	cur, err := unix.Seek(fd, 0, unix.SEEK_CUR)
	if err != nil {
		return false
	}
	hole, err := unix.Seek(fd, 0, unix.SEEK_HOLE)
	unix.Seek(fd, cur, unix.SEEK_SET)
	return err == nil && hole < size
}

func typeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFCHR:
		return "chardev"
	case unix.S_IFBLK:
		return "blockdev"
	case unix.S_IFSOCK:
		return "socket"
	}
	return fmt.Sprintf("type%#o", mode&unix.S_IFMT)
}

// Side is one of the two trees: a directory fd that every operation is
// relative to, and the side's pool of open fds.
type Side struct {
	root int
	fds  [Slots]int
	// Probe makes Exec record the inode number an op acts on, with a
	// stat before the op. Only the reference side probes: a stat on the
	// side under test would warm its caches and hide cold-path bugs.
	probe bool
}

// NewSide returns a side rooted at the directory open at root. probe
// asks it to record Result.Ino.
func NewSide(root int, probe bool) *Side {
	s := &Side{root: root, probe: probe}
	for i := range s.fds {
		s.fds[i] = -1
	}
	return s
}

// Close closes the fds the side's operations left open.
func (s *Side) Close() {
	for i, fd := range s.fds {
		if fd >= 0 {
			unix.Close(fd)
			s.fds[i] = -1
		}
	}
}

// procPath names rel through the root fd, for the calls that have no
// *at form (xattrs, truncate): the magic link resolves to the root
// directory itself, whatever path it was opened by.
func (s *Side) procPath(rel string) string {
	return fmt.Sprintf("/proc/self/fd/%d/%s", s.root, rel)
}

func errnoName(err error) string {
	if err == nil {
		return ""
	}
	var e unix.Errno
	if errors.As(err, &e) {
		if n := unix.ErrnoName(e); n != "" {
			return n
		}
		return fmt.Sprintf("errno%d", int(e))
	}
	return err.Error()
}

func fill(n int64, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (i+seed)%26)
	}
	return b
}

// Exec runs op on the side and returns what it answered. Errors are part
// of the result, never a failure of Exec.
func (s *Side) Exec(op Op) Result {
	var r Result
	if s.probe {
		var st unix.Stat_t
		if op.Path != "" {
			if unix.Fstatat(s.root, op.Path, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
				r.Ino = st.Ino
			}
		} else if fd := s.fds[op.Slot]; fd >= 0 && unix.Fstat(fd, &st) == nil {
			r.Ino = st.Ino
		}
	}
	s.exec(op, &r)
	return r
}

func (s *Side) fstat(fd int, r *Result) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		r.FstatErr = errnoName(err)
		return
	}
	r.Stat = attrOf(&st)
	if st.Mode&unix.S_IFMT == unix.S_IFREG {
		r.Stat.Sparse = hasHole(fd, st.Size)
	}
}

func (s *Side) exec(op Op, r *Result) {
	var err error
	slotFd := s.fds[op.Slot]
	needFd := func() bool {
		if slotFd < 0 {
			r.Errno = "EBADF"
			return false
		}
		return true
	}
	switch op.Kind {
	case "open":
		if s.fds[op.Slot] >= 0 {
			unix.Close(s.fds[op.Slot])
			s.fds[op.Slot] = -1
		}
		// Device nodes are never opened: the mount is nodev by design
		// and the reference is not (see the package doc).
		var st unix.Stat_t
		statFlags := 0
		if op.Flags&oNOFOLLOW != 0 {
			statFlags = unix.AT_SYMLINK_NOFOLLOW
		}
		if unix.Fstatat(s.root, op.Path, &st, statFlags) == nil {
			if t := st.Mode & unix.S_IFMT; t == unix.S_IFCHR || t == unix.S_IFBLK {
				r.Errno = "skipped: device node"
				return
			}
		}
		// O_NONBLOCK so that opening or reading a FIFO never blocks.
		fd, err := unix.Openat(s.root, op.Path, op.Flags|unix.O_NONBLOCK|unix.O_CLOEXEC, op.Mode)
		if err != nil {
			r.Errno = errnoName(err)
			return
		}
		s.fds[op.Slot] = fd
		s.fstat(fd, r)
		return
	case "close":
		if !needFd() {
			return
		}
		err = unix.Close(slotFd)
		s.fds[op.Slot] = -1
	case "write", "pwrite":
		if !needFd() {
			return
		}
		var n int
		if op.Kind == "write" {
			n, err = unix.Write(slotFd, fill(op.Len, int(op.Len)))
		} else {
			n, err = unix.Pwrite(slotFd, fill(op.Len, int(op.Off)), op.Off)
		}
		r.N = int64(n)
		if err == nil {
			s.fstat(slotFd, r)
		}
	case "read", "pread":
		if !needFd() {
			return
		}
		buf := make([]byte, op.Len)
		var n int
		if op.Kind == "read" {
			n, err = unix.Read(slotFd, buf)
		} else {
			n, err = unix.Pread(slotFd, buf, op.Off)
		}
		if n > 0 {
			r.N = int64(n)
			r.Data = string(buf[:n])
		}
	case "fstat":
		if !needFd() {
			return
		}
		s.fstat(slotFd, r)
		return
	case "fchmod":
		if !needFd() {
			return
		}
		if err = unix.Fchmod(slotFd, op.Mode); err == nil {
			s.fstat(slotFd, r)
		}
	case "fchown":
		if !needFd() {
			return
		}
		if err = unix.Fchown(slotFd, op.UID, op.GID); err == nil {
			s.fstat(slotFd, r)
		}
	case "ftruncate":
		if !needFd() {
			return
		}
		if err = unix.Ftruncate(slotFd, op.Off); err == nil {
			s.fstat(slotFd, r)
		}
	case "fallocate":
		if !needFd() {
			return
		}
		if err = unix.Fallocate(slotFd, uint32(op.Flags), op.Off, op.Len); err == nil {
			s.fstat(slotFd, r)
		}
	case "mmap":
		if !needFd() {
			return
		}
		var n int64
		if n, err = mapWrite(slotFd, op); err == nil {
			r.N = n
			s.fstat(slotFd, r)
		}
	case "copy_file_range":
		if !needFd() {
			return
		}
		var st unix.Stat_t
		if unix.Fstatat(s.root, op.Path, &st, 0) == nil {
			if t := st.Mode & unix.S_IFMT; t == unix.S_IFCHR || t == unix.S_IFBLK {
				r.Errno = "skipped: device node"
				return
			}
		}
		var in int
		if in, err = unix.Openat(s.root, op.Path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err != nil {
			break
		}
		roff, woff := op.Off, op.Off2
		var n int
		n, err = unix.CopyFileRange(in, &roff, slotFd, &woff, int(op.Len), 0)
		unix.Close(in)
		r.N = int64(n)
		if err == nil {
			s.fstat(slotFd, r)
		}
	case "fifo":
		if s.fds[op.Slot] >= 0 {
			unix.Close(s.fds[op.Slot])
			s.fds[op.Slot] = -1
		}
		// Only an existing FIFO: O_CREAT would make a regular file, and
		// O_TRUNC truncate one, which the open op does already.
		var st unix.Stat_t
		if err = unix.Fstatat(s.root, op.Path, &st, 0); err != nil {
			break
		}
		if st.Mode&unix.S_IFMT != unix.S_IFIFO {
			r.Errno = "skipped: not a FIFO"
			return
		}
		var fd int
		if fd, err = unix.Openat(s.root, op.Path, op.Flags|unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o644); err != nil {
			break
		}
		s.fds[op.Slot] = fd
		if op.Len > 0 {
			var n int
			n, err = unix.Write(fd, fill(op.Len, int(op.Len)))
			r.N = int64(n)
		}
		if err == nil {
			s.fstat(fd, r)
		}
	case "truncate":
		err = unix.Truncate(s.procPath(op.Path), op.Off)
	case "chmod":
		err = unix.Fchmodat(s.root, op.Path, op.Mode, 0)
	case "chown":
		err = unix.Fchownat(s.root, op.Path, op.UID, op.GID, 0)
	case "lchown":
		err = unix.Fchownat(s.root, op.Path, op.UID, op.GID, unix.AT_SYMLINK_NOFOLLOW)
	case "utimensat":
		ts := []unix.Timespec{timespec(op.Atime), timespec(op.Mtime)}
		err = unix.UtimesNanoAt(s.root, op.Path, ts, op.Flags)
	case "link":
		err = unix.Linkat(s.root, op.Path, s.root, op.Path2, 0)
	case "symlink":
		err = unix.Symlinkat(op.Path2, s.root, op.Path)
	case "readlink":
		buf := make([]byte, 4096)
		var n int
		n, err = unix.Readlinkat(s.root, op.Path, buf)
		if err == nil {
			r.Data = string(buf[:n])
		}
	case "rename":
		err = unix.Renameat(s.root, op.Path, s.root, op.Path2)
	case "renameat2":
		err = unix.Renameat2(s.root, op.Path, s.root, op.Path2, uint(op.Flags))
	case "mkdir":
		err = unix.Mkdirat(s.root, op.Path, op.Mode)
	case "rmdir":
		err = unix.Unlinkat(s.root, op.Path, unix.AT_REMOVEDIR)
	case "unlink":
		err = unix.Unlinkat(s.root, op.Path, 0)
	case "mkfifo":
		err = unix.Mknodat(s.root, op.Path, unix.S_IFIFO|op.Mode, 0)
	case "mknod":
		err = unix.Mknodat(s.root, op.Path, unix.S_IFCHR|op.Mode, 0)
	case "setxattr":
		err = unix.Setxattr(s.procPath(op.Path), op.Name, []byte(op.Value), op.Flags)
	case "getxattr":
		buf := make([]byte, 4096)
		var n int
		n, err = unix.Getxattr(s.procPath(op.Path), op.Name, buf)
		if err == nil {
			r.Data = string(buf[:n])
		}
	case "listxattr":
		r.Names, err = listxattr(s.procPath(op.Path), false)
	case "removexattr":
		err = unix.Removexattr(s.procPath(op.Path), op.Name)
	case "stat":
		var st unix.Stat_t
		if err = unix.Fstatat(s.root, op.Path, &st, op.Flags); err == nil {
			r.Stat = attrOf(&st)
		}
	case "readdir":
		r.Names, err = readdirRaw(s.root, op.Path)
	default:
		panic("difftest: unknown op kind " + op.Kind)
	}
	r.Errno = errnoName(err)
}

// mapWrite writes op.Len bytes at op.Off through a shared mapping of fd,
// the part of them that lies within the file's size (a store past its
// end would raise SIGBUS), and flushes them as op.Flags says. It returns
// how many bytes it stored. A fault on the mapping (the file system
// failing a page) is an error, not a crash of the test.
func mapWrite(fd int, op Op) (n int64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	page := int64(unix.Getpagesize())
	start := op.Off / page * page
	end := min(op.Off+op.Len, st.Size)
	length := max(end-start, 1)
	m, err := unix.Mmap(fd, start, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return 0, err
	}
	defer func() {
		if uerr := unix.Munmap(m); err == nil {
			err = uerr
		}
	}()
	if end > op.Off {
		old := debug.SetPanicOnFault(true)
		defer debug.SetPanicOnFault(old)
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("fault on the mapping: %v", p)
			}
		}()
		n = int64(copy(m[op.Off-start:end-start], fill(end-op.Off, int(op.Off))))
	}
	if op.Flags == MapMsync {
		err = unix.Msync(m, unix.MS_SYNC)
	}
	return n, err
}

func timespec(ns int64) unix.Timespec {
	switch ns {
	case TimeNow:
		return unix.Timespec{Nsec: unix.UTIME_NOW}
	case TimeOmit:
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.NsecToTimespec(ns)
}

// listxattr lists the xattr names of path, sorted, without following a
// final symlink when nofollow is set.
func listxattr(path string, nofollow bool) ([]string, error) {
	list := unix.Listxattr
	if nofollow {
		list = unix.Llistxattr
	}
	buf := make([]byte, 64<<10)
	n, err := list(path, buf)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range bytes.Split(buf[:n], []byte{0}) {
		if len(name) > 0 {
			out = append(out, string(name))
		}
	}
	sort.Strings(out)
	return out, nil
}

// readdirRaw lists a directory with getdents64, "." and ".." included
// (Go's own readers drop them, and their absence is a divergence), sorted,
// each name with its d_type.
func readdirRaw(root int, rel string) ([]string, error) {
	fd, err := unix.Openat(root, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:18]))
			dtype := b[18]
			name := b[19:reclen]
			if i := bytes.IndexByte(name, 0); i >= 0 {
				name = name[:i]
			}
			out = append(out, fmt.Sprintf("%s:%d", name, dtype))
			b = b[reclen:]
		}
	}
	sort.Strings(out)
	return out, nil
}
