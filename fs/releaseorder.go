package fs

import (
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// releaseOrder makes the release of a file handle complete, for its
// inode, before an open of that inode can start.
//
// go-fuse's bridge finishes a RELEASE after the node's Release method
// has returned: it then drops a reference on the inode's passthrough
// backing id, whether or not the released handle took one. A handle the
// daemon serves took none, and its Release method has already told the
// node it is closed, so an OPEN that runs in that gap chooses
// passthrough and registers a backing id, which the late drop then
// unregisters. The kernel fails that open (its id is gone) or the next
// passthrough open of the inode (a second backing file for one inode),
// both with EIO.
//
// Opens of an inode run in parallel with each other; a release of it
// waits for them and they for it. Inodes share locks by their node id's
// stripe: what another inode's release can delay is one open.
type releaseOrder struct {
	fuse.RawFileSystem
	stripes [256]sync.RWMutex
}

func (r *releaseOrder) stripe(node uint64) *sync.RWMutex {
	return &r.stripes[node%uint64(len(r.stripes))]
}

func (r *releaseOrder) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	s := r.stripe(input.NodeId)
	s.RLock()
	defer s.RUnlock()
	return r.RawFileSystem.Open(cancel, input, out)
}

func (r *releaseOrder) Release(cancel <-chan struct{}, input *fuse.ReleaseIn) {
	s := r.stripe(input.NodeId)
	s.Lock()
	defer s.Unlock()
	r.RawFileSystem.Release(cancel, input)
}
