package transport

import (
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Notifications are messages to the kernel with no request: an out
// header whose unique is 0 and whose status is the notification's code
// (positive on the wire; go-fuse's NOTIFY_* constants are negated), then
// its struct and name. The kernel acts on one inside the write(2):
// it must not be sent from a handler holding what the kernel's
// invalidation waits for (go-fuse's fs.Inode documents the same rule).

// EntryNotify makes the kernel look the entry name in parent up again
// before its next use. Where the kernel can (FUSE_HAS_EXPIRE_ONLY, Linux
// 6.2), the entry only expires: dropping it from the dcache would detach
// every mount below it (d_invalidate), and Nomad mounts tmpfs, binds and
// proc on the directories of the mount. An expired entry whose lookup
// answers the same node stays, mounts and all; one whose lookup answers
// another node is replaced as a dropped one is.
func (c *Conn) EntryNotify(parent uint64, name string) fuse.Status {
	out := fuse.NotifyInvalEntryOut{Parent: parent, NameLen: uint32(len(name))}
	if c.kernel.Flags64()&fuse.CAP_HAS_EXPIRE_ONLY != 0 {
		out.Flags = fuse.EXPIRE_ONLY
	}
	return c.notify(fuse.NOTIFY_INVAL_ENTRY, unsafe.Pointer(&out), int(unsafe.Sizeof(out)), name)
}

// DropEntry drops the kernel's entry name in parent from the dcache at
// once, and the mounts below it with it: for an entry whose node must go
// although the next lookup answers the same node ID (a volume frozen in
// place), which only the node's FORGET can retire.
func (c *Conn) DropEntry(parent uint64, name string) fuse.Status {
	out := fuse.NotifyInvalEntryOut{Parent: parent, NameLen: uint32(len(name))}
	return c.notify(fuse.NOTIFY_INVAL_ENTRY, unsafe.Pointer(&out), int(unsafe.Sizeof(out)), name)
}

// DeleteNotify tells the kernel the entry name of parent, naming child,
// was removed.
func (c *Conn) DeleteNotify(parent, child uint64, name string) fuse.Status {
	out := fuse.NotifyInvalDeleteOut{Parent: parent, Child: child, NameLen: uint32(len(name))}
	return c.notify(fuse.NOTIFY_DELETE, unsafe.Pointer(&out), int(unsafe.Sizeof(out)), name)
}

// InodeNotify drops the kernel's cached attributes of node, and its cached
// data from off for length bytes (all of it for length 0; none for off
// negative).
func (c *Conn) InodeNotify(node uint64, off, length int64) fuse.Status {
	out := fuse.NotifyInvalInodeOut{Ino: node, Off: off, Length: length}
	return c.notify(fuse.NOTIFY_INVAL_INODE, unsafe.Pointer(&out), int(unsafe.Sizeof(out)), "")
}

// InodeNotifyStoreCache puts data into the kernel's cache of node at
// offset.
func (c *Conn) InodeNotifyStoreCache(node uint64, offset int64, data []byte) fuse.Status {
	out := fuse.NotifyStoreOut{Nodeid: node, Offset: uint64(offset), Size: uint32(len(data))}
	hdr := fuse.OutHeader{Status: -fuse.NOTIFY_STORE_CACHE}
	hdr.Length = uint32(outHeaderSize + int(unsafe.Sizeof(out)) + len(data))
	_, err := unix.Writev(c.fd, [][]byte{asBytes(&hdr), asBytes(&out), data})
	return notifyStatus(err)
}

// InodeRetrieveCache would read back the kernel's cached pages of a node;
// the loop does not route the kernel's answer (NOTIFY_REPLY), and allocfs
// never asks.
func (c *Conn) InodeRetrieveCache(node uint64, offset int64, dest []byte) (int, fuse.Status) {
	return 0, fuse.ENOSYS
}

func (c *Conn) notify(code int32, body unsafe.Pointer, size int, name string) fuse.Status {
	hdr := fuse.OutHeader{Status: -code}
	parts := [][]byte{nil, unsafe.Slice((*byte)(body), size)}
	length := outHeaderSize + size
	if name != "" {
		// The name and its NUL.
		parts = append(parts, []byte(name+"\x00"))
		length += len(name) + 1
	}
	hdr.Length = uint32(length)
	parts[0] = asBytes(&hdr)
	_, err := unix.Writev(c.fd, parts)
	return notifyStatus(err)
}

func notifyStatus(err error) fuse.Status {
	if err == nil {
		return fuse.OK
	}
	if errno, ok := err.(syscall.Errno); ok {
		return fuse.Status(errno)
	}
	return fuse.EIO
}

func asBytes[T any](v *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v))
}

// The passthrough ioctls of /dev/fuse (Linux 6.9): register an open file
// as the backing file of passthrough opens, and drop it.
const (
	iocBackingOpen  = 0x4010e501 // _IOW(229, 1, struct fuse_backing_map)
	iocBackingClose = 0x4004e502 // _IOW(229, 2, uint32_t)
)

// RegisterBackingFd registers m.Fd for passthrough and returns its id.
func (c *Conn) RegisterBackingFd(m *fuse.BackingMap) (int32, syscall.Errno) {
	id, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), iocBackingOpen, uintptr(unsafe.Pointer(m)))
	if errno != 0 {
		return 0, errno
	}
	return int32(id), 0
}

// UnregisterBackingFd drops a registered backing file.
func (c *Conn) UnregisterBackingFd(id int32) syscall.Errno {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), iocBackingClose, uintptr(unsafe.Pointer(&id)))
	return errno
}
