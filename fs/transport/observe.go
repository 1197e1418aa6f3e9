package transport

import (
	"syscall"
	"time"
)

// Observer is told of every request the connection handled: its opcode,
// how long it took from the moment the request was in the daemon's
// buffer to the moment its reply was written (to /dev/fuse, or into its
// ring entry, which the kernel takes with the thread's next wait), and
// the errno of the reply (0 for success, and for the requests that take
// no reply: FORGET, BATCH_FORGET, INTERRUPT).
//
// It runs on the goroutine that served the request, once per request,
// so it must be cheap and never block: package metrics resolves one
// histogram per opcode once, and indexes them by opcode after that.
// Keeping the interface here rather than taking a Prometheus type keeps
// this package free of any metrics library, and a connection without an
// Observer does not even read the clock.
type Observer interface {
	Request(op uint32, d time.Duration, errno syscall.Errno)
}

// ArrivalObserver is an Observer that is also told of each request as it
// arrives, before it is served: a count kept there is complete once the
// system call that caused the request has returned, which one kept in
// Request, after the reply went, is not.
type ArrivalObserver interface {
	Observer
	Arrived(op uint32)
}

// opNames are the protocol's names of its opcodes (include/uapi/linux/fuse.h),
// including those the loop answers ENOSYS, so that an observer can tell
// the kernel asked for them.
var opNames = [...]string{
	opLookup:        "LOOKUP",
	opForget:        "FORGET",
	opGetattr:       "GETATTR",
	opSetattr:       "SETATTR",
	opReadlink:      "READLINK",
	opSymlink:       "SYMLINK",
	opMknod:         "MKNOD",
	opMkdir:         "MKDIR",
	opUnlink:        "UNLINK",
	opRmdir:         "RMDIR",
	opRename:        "RENAME",
	opLink:          "LINK",
	opOpen:          "OPEN",
	opRead:          "READ",
	opWrite:         "WRITE",
	opStatfs:        "STATFS",
	opRelease:       "RELEASE",
	opFsync:         "FSYNC",
	opSetxattr:      "SETXATTR",
	opGetxattr:      "GETXATTR",
	opListxattr:     "LISTXATTR",
	opRemovexattr:   "REMOVEXATTR",
	opFlush:         "FLUSH",
	opInit:          "INIT",
	opOpendir:       "OPENDIR",
	opReaddir:       "READDIR",
	opReleasedir:    "RELEASEDIR",
	opFsyncdir:      "FSYNCDIR",
	31:              "GETLK",
	32:              "SETLK",
	33:              "SETLKW",
	opAccess:        "ACCESS",
	opCreate:        "CREATE",
	opInterrupt:     "INTERRUPT",
	37:              "BMAP",
	opDestroy:       "DESTROY",
	opIoctl:         "IOCTL",
	opPoll:          "POLL",
	41:              "NOTIFY_REPLY",
	opBatchForget:   "BATCH_FORGET",
	opFallocate:     "FALLOCATE",
	opReaddirplus:   "READDIRPLUS",
	opRename2:       "RENAME2",
	opLseek:         "LSEEK",
	opCopyFileRange: "COPY_FILE_RANGE",
	48:              "SETUPMAPPING",
	49:              "REMOVEMAPPING",
	50:              "SYNCFS",
	opTmpfile:       "TMPFILE",
	opStatx:         "STATX",
	53:              "COPY_FILE_RANGE_64",
}

// NumOpcodes bounds the opcodes OpName knows: an observer can keep what it
// needs per opcode in an array of this size, and put every opcode at or
// above it in one slot.
const NumOpcodes = len(opNames)

// OpName returns the protocol's name of opcode op, or "" for one this
// package does not know.
func OpName(op uint32) string {
	if op >= uint32(len(opNames)) {
		return ""
	}
	return opNames[op]
}

// observe sets the connection's observer.
func (c *Conn) observe(o Observer) {
	c.obs = o
	c.arr, _ = o.(ArrivalObserver)
}
