package fs

import (
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// countingFS counts the requests that reach the filesystem fs, by opcode:
// what a workload costs in round trips through /dev/fuse, which is what
// metadata speed comes down to. Its methods are in opcount_methods.go; the
// counts cost one atomic add per request.
type countingFS struct {
	fs     fuse.RawFileSystem
	counts [numFuseOps]atomic.Uint64
}

// RequestCounts returns how many requests of each kind the mount has
// served since it was made (FORGET counted once per message), by the
// protocol's name of the opcode; kinds never seen are left out.
func (m *Mount) RequestCounts() map[string]uint64 {
	out := make(map[string]uint64)
	for op := range numFuseOps {
		if n := m.requests.counts[op].Load(); n > 0 {
			out[fuseOpNames[op]] = n
		}
	}
	return out
}
