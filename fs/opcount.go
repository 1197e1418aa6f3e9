package fs

import (
	"sync/atomic"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs/transport"
)

// requestCounter counts the requests the kernel sends, by opcode: what a
// workload costs in round trips through /dev/fuse, which is what metadata
// speed comes down to. It is the observer of the mount's own loop
// (transport.ArrivalObserver), in front of the one the caller gave (next,
// which may be nil), and counts a request as it arrives, so that a count
// read after a system call returns has that call's requests; go-fuse's
// server (MountOptions.GoFuseServer, Debug) has no observer, and a mount
// it serves counts nothing.
type requestCounter struct {
	next transport.Observer
	// counts are by opcode; the last slot holds every opcode the
	// transport has no name for.
	counts [transport.NumOpcodes + 1]atomic.Uint64
}

func (c *requestCounter) Arrived(op uint32) {
	c.counts[min(op, uint32(transport.NumOpcodes))].Add(1)
}

func (c *requestCounter) Request(op uint32, d time.Duration, errno syscall.Errno) {
	if c.next != nil {
		c.next.Request(op, d, errno)
	}
}
