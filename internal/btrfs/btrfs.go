package btrfs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Magic is the f_type statfs(2) reports for btrfs.
const Magic = 0x9123683e

// ioctl numbers: _IOC(dir, 0x94, nr, size), dir 1 write, 2 read, 3 both.
func ioc(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | 0x94<<8 | nr }

var (
	iocSubvolCreate = ioc(1, 14, unsafe.Sizeof(volArgs{}))
	iocTreeSearch   = ioc(3, 17, unsafe.Sizeof(searchArgs{}))
	iocInoLookup    = ioc(3, 18, unsafe.Sizeof(inoLookupArgs{}))
	iocFSInfo       = ioc(2, 31, unsafe.Sizeof(fsInfoArgs{}))
	iocQuotaCtl     = ioc(3, 40, unsafe.Sizeof(quotaCtlArgs{}))
	iocQgroupAssign = ioc(1, 41, unsafe.Sizeof(qgroupAssignArgs{}))
	iocQgroupCreate = ioc(1, 42, unsafe.Sizeof(qgroupCreateArgs{}))
	iocQgroupLimit  = ioc(2, 43, unsafe.Sizeof(qgroupLimitArgs{}))
	iocQuotaRescan  = ioc(1, 44, unsafe.Sizeof(rescanArgs{}))
	iocRescanWait   = ioc(0, 46, 0)
)

type volArgs struct {
	Fd   int64
	Name [4088]byte
}

type inoLookupArgs struct {
	TreeID   uint64
	ObjectID uint64
	Name     [4080]byte
}

type fsInfoArgs struct {
	MaxID        uint64
	NumDevices   uint64
	FSID         [16]byte
	NodeSize     uint32
	SectorSize   uint32
	CloneAlign   uint32
	CsumType     uint16
	CsumSize     uint16
	Flags        uint64
	Generation   uint64
	MetadataUUID [16]byte
	Reserved     [944]byte
}

type quotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

type qgroupAssignArgs struct {
	Assign, Src, Dst uint64
}

type qgroupCreateArgs struct {
	Create, QgroupID uint64
}

type qgroupLimitArgs struct {
	QgroupID uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

type rescanArgs struct {
	Flags, Progress uint64
	Reserved        [6]uint64
}

type searchKey struct {
	TreeID                 uint64
	MinObjectID, MaxObjID  uint64
	MinOffset, MaxOffset   uint64
	MinTransID, MaxTransID uint64
	MinType, MaxType       uint32
	NrItems                uint32
	unused                 uint32
	unused1, unused2       uint64
	unused3, unused4       uint64
}

type searchArgs struct {
	Key searchKey
	Buf [4096 - 104]byte
}

const (
	quotaCtlEnable = 1
	limitMaxRfer   = 1 << 0

	quotaTreeID      = 8
	qgroupRelationKy = 246
	firstFreeObjID   = 256
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

// withDir runs fn on a descriptor of the directory dir.
func withDir(dir string, fn func(fd int) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	return fn(fd)
}

// Is reports whether dir lies on btrfs.
func Is(dir string) (bool, error) {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		return false, &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	return sfs.Type == Magic, nil
}

// QgroupID is a qgroup's ID as the kernel packs it: level<<48 | id.
type QgroupID uint64

// Qgroup makes the ID of qgroup level/id.
func Qgroup(level uint16, id uint64) QgroupID { return QgroupID(uint64(level)<<48 | id) }

// Level and ID split q.
func (q QgroupID) Level() uint16 { return uint16(q >> 48) }
func (q QgroupID) ID() uint64    { return uint64(q) & (1<<48 - 1) }

func (q QgroupID) String() string { return fmt.Sprintf("%d/%d", q.Level(), q.ID()) }

// CreateSubvolume makes an empty subvolume at path, whose parent must
// exist on btrfs; its root is mode 0755, owned by the caller.
func CreateSubvolume(path string) error {
	dir, name := filepath.Split(filepath.Clean(path))
	var a volArgs
	if len(name) >= len(a.Name) || name == "" {
		return fmt.Errorf("subvolume name %q: %w", name, unix.EINVAL)
	}
	copy(a.Name[:], name)
	return withDir(dir, func(fd int) error {
		if err := ioctl(fd, iocSubvolCreate, unsafe.Pointer(&a)); err != nil {
			return &os.PathError{Op: "create subvolume", Path: path, Err: err}
		}
		return nil
	})
}

// SubvolumeID returns the ID of the subvolume holding dir.
func SubvolumeID(dir string) (uint64, error) {
	var a inoLookupArgs
	a.ObjectID = firstFreeObjID
	err := withDir(dir, func(fd int) error { return ioctl(fd, iocInoLookup, unsafe.Pointer(&a)) })
	if err != nil {
		return 0, fmt.Errorf("subvolume of %s: %w", dir, err)
	}
	return a.TreeID, nil
}

// IsSubvolume reports whether dir is the root of a subvolume.
func IsSubvolume(dir string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	return st.Ino == firstFreeObjID && st.Mode&unix.S_IFMT == unix.S_IFDIR, nil
}

// FSID returns the filesystem's UUID, which names its sysfs directory.
func FSID(dir string) (string, error) {
	var a fsInfoArgs
	err := withDir(dir, func(fd int) error { return ioctl(fd, iocFSInfo, unsafe.Pointer(&a)) })
	if err != nil {
		return "", fmt.Errorf("btrfs filesystem info of %s: %w", dir, err)
	}
	u := a.FSID
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

// EnableQuotas turns full qgroup accounting on for the filesystem of dir
// (a no-op where it is on already); existing data is counted by a rescan
// the kernel starts itself.
func EnableQuotas(dir string) error {
	a := quotaCtlArgs{Cmd: quotaCtlEnable}
	err := withDir(dir, func(fd int) error { return ioctl(fd, iocQuotaCtl, unsafe.Pointer(&a)) })
	if err != nil {
		return fmt.Errorf("failed to enable btrfs quotas on %s: %w", dir, err)
	}
	return nil
}

// CreateQgroup makes qgroup q; an existing one is not an error.
func CreateQgroup(dir string, q QgroupID) error {
	a := qgroupCreateArgs{Create: 1, QgroupID: uint64(q)}
	err := withDir(dir, func(fd int) error { return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a)) })
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("failed to create qgroup %s: %w", q, err)
	}
	return nil
}

// DestroyQgroup removes qgroup q; a missing one is not an error. The
// kernel refuses (EBUSY) while q has members.
func DestroyQgroup(dir string, q QgroupID) error {
	a := qgroupCreateArgs{Create: 0, QgroupID: uint64(q)}
	err := withDir(dir, func(fd int) error { return ioctl(fd, iocQgroupCreate, unsafe.Pointer(&a)) })
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("failed to destroy qgroup %s: %w", q, err)
	}
	return nil
}

// Assign makes child a member of parent (or, with assign false, no
// longer one). Asking for what already holds is not an error. It
// reports whether the kernel said it could not keep the counters exact;
// Inconsistent, read once after a batch of changes, says so too.
func Assign(dir string, child, parent QgroupID, assign bool) (inconsistent bool, err error) {
	a := qgroupAssignArgs{Src: uint64(child), Dst: uint64(parent)}
	if assign {
		a.Assign = 1
	}
	var r uintptr
	err = withDir(dir, func(fd int) error {
		var e unix.Errno
		r, _, e = unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocQgroupAssign, uintptr(unsafe.Pointer(&a)))
		if e != 0 {
			return e
		}
		return nil
	})
	switch {
	case err == nil:
	case assign && errors.Is(err, unix.EEXIST), !assign && errors.Is(err, unix.ENOENT):
		err = nil
	default:
		verb := "assign"
		if !assign {
			verb = "unassign"
		}
		return false, fmt.Errorf("failed to %s qgroup %s to %s: %w", verb, child, parent, err)
	}
	return r > 0, nil
}

// Limit sets the limit of q's referenced bytes; 0 removes it.
func Limit(dir string, q QgroupID, maxBytes uint64) error {
	a := qgroupLimitArgs{QgroupID: uint64(q), Flags: limitMaxRfer, MaxRfer: maxBytes}
	if maxBytes == 0 {
		a.MaxRfer = ^uint64(0)
	}
	err := withDir(dir, func(fd int) error { return ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)) })
	if err != nil {
		return fmt.Errorf("failed to limit qgroup %s to %d bytes: %w", q, maxBytes, err)
	}
	return nil
}

// Rescan recounts every qgroup from the extent tree and waits for it.
func Rescan(dir string) error {
	return withDir(dir, func(fd int) error {
		var a rescanArgs
		if err := ioctl(fd, iocQuotaRescan, unsafe.Pointer(&a)); err != nil && !errors.Is(err, unix.EINPROGRESS) {
			return fmt.Errorf("failed to start a qgroup rescan on %s: %w", dir, err)
		}
		if err := ioctl(fd, iocRescanWait, nil); err != nil {
			return fmt.Errorf("qgroup rescan on %s: %w", dir, err)
		}
		return nil
	})
}

// Relations returns every relation of the filesystem of dir, as a map
// from each member qgroup to its parents.
func Relations(dir string) (map[QgroupID][]QgroupID, error) {
	out := make(map[QgroupID][]QgroupID)
	err := withDir(dir, func(fd int) error {
		var a searchArgs
		a.Key = searchKey{
			TreeID:     quotaTreeID,
			MaxObjID:   ^uint64(0),
			MaxOffset:  ^uint64(0),
			MaxTransID: ^uint64(0),
			MinType:    qgroupRelationKy,
			MaxType:    qgroupRelationKy,
		}
		for {
			a.Key.NrItems = 4096
			if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
				return fmt.Errorf("failed to search the quota tree of %s: %w", dir, err)
			}
			if a.Key.NrItems == 0 {
				return nil
			}
			var last struct{ obj, off uint64 }
			pos := 0
			for range a.Key.NrItems {
				h := a.Buf[pos : pos+32]
				obj := binary.LittleEndian.Uint64(h[8:])
				off := binary.LittleEndian.Uint64(h[16:])
				typ := binary.LittleEndian.Uint32(h[24:])
				n := binary.LittleEndian.Uint32(h[28:])
				pos += 32 + int(n)
				last.obj, last.off = obj, off
				// Each relation is stored both ways; the member is the
				// lower level.
				if typ == qgroupRelationKy && obj < off {
					out[QgroupID(obj)] = append(out[QgroupID(obj)], QgroupID(off))
				}
			}
			// Resume after the last key seen.
			a.Key.MinObjectID, a.Key.MinOffset = last.obj, last.off+1
			if last.off == ^uint64(0) {
				if last.obj == ^uint64(0) {
					return nil
				}
				a.Key.MinObjectID, a.Key.MinOffset = last.obj+1, 0
			}
		}
	})
	return out, err
}

// Usage is what a qgroup holds, as sysfs tells.
type Usage struct {
	// Referenced counts the bytes of every extent the qgroup references,
	// as of the last transaction commit; Reserved what writes since have
	// reserved.
	Referenced, Reserved uint64
	// MaxReferenced is the limit, 0 for none.
	MaxReferenced uint64
}

// Bytes is what the qgroup holds or will once reservations commit.
func (u Usage) Bytes() uint64 { return u.Referenced + u.Reserved }

// ReadUsage reads qgroup q of the filesystem fsid from sysfs.
func ReadUsage(fsid string, q QgroupID) (Usage, error) {
	dir := fmt.Sprintf("/sys/fs/btrfs/%s/qgroups/%d_%d", fsid, q.Level(), q.ID())
	var u Usage
	var err error
	read := func(name string) uint64 {
		if err != nil {
			return 0
		}
		b, e := os.ReadFile(filepath.Join(dir, name))
		if e != nil {
			err = fmt.Errorf("usage of qgroup %s: %w", q, e)
			return 0
		}
		v, e := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if e != nil {
			err = fmt.Errorf("usage of qgroup %s: %s: %w", q, name, e)
		}
		return v
	}
	u.Referenced = read("referenced")
	u.Reserved = read("rsv_data")
	u.MaxReferenced = read("max_referenced")
	if u.MaxReferenced == ^uint64(0) {
		u.MaxReferenced = 0
	}
	return u, err
}

// Inconsistent reports whether the accounting of the filesystem of dir
// needs a rescan.
func Inconsistent(dir string) (bool, error) {
	fsid, err := FSID(dir)
	if err != nil {
		return false, err
	}
	b, err := os.ReadFile("/sys/fs/btrfs/" + fsid + "/qgroups/inconsistent")
	if err != nil {
		return false, fmt.Errorf("qgroup state of %s: %w", dir, err)
	}
	return strings.TrimSpace(string(b)) == "1", nil
}

// Qgroups lists the qgroups of level of the filesystem fsid, as sysfs
// shows them.
func Qgroups(fsid string, level uint16) ([]QgroupID, error) {
	entries, err := os.ReadDir("/sys/fs/btrfs/" + fsid + "/qgroups")
	if err != nil {
		return nil, fmt.Errorf("qgroups of %s: %w", fsid, err)
	}
	var out []QgroupID
	for _, e := range entries {
		l, id, ok := strings.Cut(e.Name(), "_")
		if !ok {
			continue
		}
		lv, err1 := strconv.ParseUint(l, 10, 16)
		n, err2 := strconv.ParseUint(id, 10, 48)
		if err1 == nil && err2 == nil && uint16(lv) == level {
			out = append(out, Qgroup(level, n))
		}
	}
	return out, nil
}
