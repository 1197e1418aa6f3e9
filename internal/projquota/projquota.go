package projquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	iocFSGetXattr = 0x801c581f // _IOR('X', 31, struct fsxattr)
	iocFSSetXattr = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	// FlagInherit is FS_XFLAG_PROJINHERIT.
	flagInherit = 0x200

	prjQuota   = 2
	qGetQuota  = 0x800007
	qSetQuota  = 0x800008
	qGetNext   = 0x800009
	qXGetStatV = 'X'<<8 | 8

	qifBLimits = 1
	qifILimits = 4

	pdqAcct = 1 << 4
	pdqEnfd = 1 << 5
)

type fsxattr struct {
	XFlags     uint32
	ExtSize    uint32
	NExtents   uint32
	ProjID     uint32
	CowExtSize uint32
	Pad        [8]byte
}

type dqblk struct {
	BHardLimit uint64
	BSoftLimit uint64
	CurSpace   uint64
	IHardLimit uint64
	ISoftLimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
	_          uint32
}

type qfilestatv struct {
	Ino      uint64
	NBlks    uint64
	NExtents uint32
	Pad      uint32
}

type quotaStatv struct {
	Version    int8
	Pad1       uint8
	Flags      uint16
	IncoreDqs  uint32
	UQuota     qfilestatv
	GQuota     qfilestatv
	PQuota     qfilestatv
	BTimeLimit int32
	ITimeLimit int32
	RTBTimeLim int32
	BWarnLimit uint16
	IWarnLimit uint16
	RTBWarnLim uint16
	Pad3       uint16
	Pad4       uint32
	Pad2       [7]uint64
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

func quotactl(fd int, cmd, id uint32, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), uintptr(cmd<<8|prjQuota), uintptr(id), uintptr(arg), 0, 0); e != 0 {
		return e
	}
	return nil
}

func withDir(dir string, fn func(fd int) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return fn(fd)
}

// Enforced reports whether the filesystem of dir enforces project
// quotas: accounted and enforced (xfs pquota, ext4 prjquota).
func Enforced(dir string) (bool, error) {
	var st quotaStatv
	st.Version = 1
	err := withDir(dir, func(fd int) error { return quotactl(fd, qXGetStatV, 0, unsafe.Pointer(&st)) })
	switch {
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ESRCH):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("quota state of %s: %w", dir, err)
	}
	return st.Flags&pdqAcct != 0 && st.Flags&pdqEnfd != 0, nil
}

// Project returns the project ID of the file fd is open on, and whether
// it passes it on (PROJINHERIT).
func Project(fd int) (id uint32, inherit bool, err error) {
	var x fsxattr
	if err := ioctl(fd, iocFSGetXattr, unsafe.Pointer(&x)); err != nil {
		return 0, false, err
	}
	return x.ProjID, x.XFlags&flagInherit != 0, nil
}

// SetProject gives the file fd is open on project id; a directory also
// passes it on to what is made in it.
func SetProject(fd int, id uint32, dir bool) error {
	var x fsxattr
	if err := ioctl(fd, iocFSGetXattr, unsafe.Pointer(&x)); err != nil {
		return err
	}
	x.ProjID = id
	if dir {
		x.XFlags |= flagInherit
	}
	return ioctl(fd, iocFSSetXattr, unsafe.Pointer(&x))
}

// ProjectOf returns the project ID of the directory dir.
func ProjectOf(dir string) (uint32, error) {
	var id uint32
	err := withDir(dir, func(fd int) error {
		var err error
		id, _, err = Project(fd)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("project of %s: %w", dir, err)
	}
	return id, nil
}

// SetTree gives every file and directory under root, and root itself,
// project id, root last: a tree whose root has the project is whole,
// whatever instant a crash stopped an earlier SetTree at. Symbolic links
// and other files no descriptor can be opened on for the ioctl keep
// theirs (a few bytes each). It never follows a link.
func SetTree(root string, id uint32) error {
	var walk func(dir string) error
	walk = func(dir string) error {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return err
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			switch e.Type() {
			case os.ModeDir:
				if err := walk(p); err != nil {
					return err
				}
			case 0:
				if err := setPath(p, id, false); err != nil {
					return err
				}
			}
		}
		return setPath(dir, id, true)
	}
	if err := walk(root); err != nil {
		return fmt.Errorf("failed to give %s project %d: %w", root, id, err)
	}
	return nil
}

func setPath(p string, id uint32, dir bool) error {
	flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK | unix.O_NOATIME
	if dir {
		flags |= unix.O_DIRECTORY
	}
	fd, err := unix.Open(p, flags, 0)
	if errors.Is(err, unix.EPERM) {
		fd, err = unix.Open(p, flags&^unix.O_NOATIME, 0)
	}
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	if err := SetProject(fd, id, dir); err != nil {
		return &os.PathError{Op: "set project", Path: p, Err: err}
	}
	return nil
}

// Usage is what a project holds and its limits; zero limits are none.
type Usage struct {
	Bytes, Inodes           uint64
	LimitBytes, LimitInodes uint64
}

// Get reads project id's usage and limits on the filesystem of dir. A
// project the kernel has no record of holds nothing.
func Get(dir string, id uint32) (Usage, error) {
	var q dqblk
	err := withDir(dir, func(fd int) error { return quotactl(fd, qGetQuota, id, unsafe.Pointer(&q)) })
	if errors.Is(err, unix.ENOENT) {
		return Usage{}, nil
	}
	if err != nil {
		return Usage{}, fmt.Errorf("quota of project %d: %w", id, err)
	}
	return Usage{Bytes: q.CurSpace, Inodes: q.CurInodes, LimitBytes: q.BHardLimit << 10, LimitInodes: q.IHardLimit}, nil
}

// Limit sets project id's hard limits (0: none): bytes, rounded up to
// the kernel's 1 KiB blocks, and inodes.
func Limit(dir string, id uint32, bytes, inodes uint64) error {
	q := dqblk{BHardLimit: (bytes + 1023) >> 10, IHardLimit: inodes, Valid: qifBLimits | qifILimits}
	err := withDir(dir, func(fd int) error { return quotactl(fd, qSetQuota, id, unsafe.Pointer(&q)) })
	if err != nil {
		return fmt.Errorf("failed to limit project %d to %d bytes and %d inodes: %w", id, bytes, inodes, err)
	}
	return nil
}

// nextdqblk is struct if_nextdqblk: if_dqblk's fields, and the ID in
// what is if_dqblk's padding.
type nextdqblk struct {
	BHardLimit uint64
	BSoftLimit uint64
	CurSpace   uint64
	IHardLimit uint64
	ISoftLimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
	ID         uint32
}

// Next returns the first project from id up that the filesystem of dir
// keeps a record of (limits or usage), and false when there is none.
func Next(dir string, id uint32) (uint32, Usage, bool, error) {
	var q nextdqblk
	err := withDir(dir, func(fd int) error { return quotactl(fd, qGetNext, id, unsafe.Pointer(&q)) })
	if errors.Is(err, unix.ENOENT) {
		return 0, Usage{}, false, nil
	}
	if err != nil {
		return 0, Usage{}, false, fmt.Errorf("next project from %d: %w", id, err)
	}
	return q.ID, Usage{Bytes: q.CurSpace, Inodes: q.CurInodes, LimitBytes: q.BHardLimit << 10, LimitInodes: q.IHardLimit}, true, nil
}
