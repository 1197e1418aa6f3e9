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

// RequestCounts returns how many requests of each kind the mount has
// served since it was made (a FORGET or a BATCH_FORGET counted once per
// message), by the protocol's name of the opcode ("UNKNOWN" for one the
// transport does not know); kinds never seen are left out.
func (m *Mount) RequestCounts() map[string]uint64 {
	out := make(map[string]uint64)
	for op := range m.requests.counts {
		n := m.requests.counts[op].Load()
		if n == 0 {
			continue
		}
		name := transport.OpName(uint32(op))
		if name == "" {
			name = "UNKNOWN"
		}
		out[name] += n
	}
	return out
}
