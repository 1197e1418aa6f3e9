package transport

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The poll probe. Go's runtime hands every file it opens to its netpoller
// with epoll_ctl, a raw system call: the goroutine stays "running" while
// the thread is in the kernel. For a file of a FUSE mount, epoll_ctl
// calls the file's poll method, which sends the daemon a POLL request and
// waits, uninterruptibly, for the answer. A process that serves the mount
// and also opens files in it (the tests do; so could any caller of
// allocfs's packages) then deadlocks as soon as a garbage collection
// starts in that window: the collector's stop-the-world waits for the
// "running" goroutine, which waits for the POLL reply, which waits for a
// reader goroutine, which waits for the world to restart. The kernel asks
// POLL only until a daemon answers one with ENOSYS (then never again on
// that connection), so Serve makes it ask once, itself, before anything
// else can: it opens a name of the root that exists only while Serve
// runs, polls it from a thread in an ordinary system call, and closes it.
// The connection answers for that file itself; the filesystem never sees
// it.

// probeName is the root entry that exists while the probe runs.
const probeName = ".allocfs-poll-probe"

// probeNode is the probe file's node ID: the largest, which go-fuse's
// bridge never hands out (it counts up from the root's 1).
const probeNode = math.MaxUint64

const opPoll = 40

// probePoll opens the probe file in the mount at dir, polls it (the
// kernel sends POLL, answered ENOSYS) and closes it. unix.Open and
// unix.Poll are ordinary system calls: their goroutine is in a syscall
// while it waits, which a stop-the-world does not wait for.
func probePoll(dir string) error {
	fd, err := unix.Open(filepath.Join(dir, probeName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("failed to open the poll probe: %w", err)
	}
	_, perr := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
	cerr := unix.Close(fd)
	if perr != nil {
		return fmt.Errorf("failed to poll the poll probe: %w", perr)
	}
	return cerr
}

// probeRequest answers r if it is for the probe: a LOOKUP of probeName in
// the root while the probe runs, or any request on probeNode. It reports
// whether it did.
func (c *Conn) probeRequest(b *buffers, r request) bool {
	u := r.hdr.Unique
	if r.hdr.Opcode == opPoll {
		c.polls.Add(1)
		c.firstPoll.CompareAndSwap(0, r.hdr.NodeId)
	}
	if r.hdr.NodeId != probeNode {
		if r.hdr.Opcode != opLookup || r.hdr.NodeId != fuse.FUSE_ROOT_ID || !c.probing.Load() {
			return false
		}
		if n, ok := name(r.raw[inHeaderSize:]); !ok || n != probeName {
			return false
		}
		out := (*fuse.EntryOut)(unsafe.Pointer(&b.out[outHeaderSize]))
		// No timeouts: the kernel asks again next time, and the name is
		// the filesystem's then (ENOENT, or whatever it has).
		*out = fuse.EntryOut{NodeId: probeNode, Attr: probeAttr()}
		c.reply(b, u, 0, sizeOf[fuse.EntryOut]())
		return true
	}
	switch r.hdr.Opcode {
	case opForget, opBatchForget:
		// No reply; BATCH_FORGET never names the probe alone, see
		// batchForget.
	case opGetattr:
		out := (*fuse.AttrOut)(unsafe.Pointer(&b.out[outHeaderSize]))
		*out = fuse.AttrOut{Attr: probeAttr()}
		c.reply(b, u, 0, sizeOf[fuse.AttrOut]())
	case opOpen:
		out := (*fuse.OpenOut)(unsafe.Pointer(&b.out[outHeaderSize]))
		*out = fuse.OpenOut{OpenFlags: fuse.FOPEN_DIRECT_IO}
		c.reply(b, u, 0, sizeOf[fuse.OpenOut]())
	case opPoll:
		c.reply(b, u, syscall.ENOSYS, 0)
	case opFlush, opRelease:
		c.reply(b, u, 0, 0)
	case opGetxattr, opListxattr:
		c.reply(b, u, syscall.ENODATA, 0)
	default:
		// Never ENOSYS: the kernel would stop asking the filesystem too.
		c.reply(b, u, syscall.EIO, 0)
	}
	return true
}

// probeAttr is the probe file's attributes: an empty file only root reads.
func probeAttr() fuse.Attr {
	return fuse.Attr{Ino: probeNode, Mode: syscall.S_IFREG | 0o400, Nlink: 1}
}

// errProbe wraps a failed probe for Serve's log.
var errProbe = errors.New("the poll probe failed: a process that serves this mount and opens files in it can deadlock in a garbage collection")
