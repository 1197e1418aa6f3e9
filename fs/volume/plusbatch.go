package volume

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// With READDIRPLUS_AUTO (the tree's mount.go) the kernel asks for attributes with
// the first batch of every listing, and with a later batch only once an
// entry was looked up in between. For a large directory that first batch
// is the whole cost of a names-only listing: as many entries as fit the
// lister's getdents buffer (~200 for glibc's 32 KiB on this kernel; older
// kernels ask a page at a time), each a cold stat of the backing file and
// a node the daemon keeps until the kernel forgets it (find over 1,000
// directories of 1,000 files made 200,000 nodes). So the first batch of a
// listing of more than PlusAttrsMax names (besides "." and "..") goes
// without attributes: an entry whose EntryOut has node ID 0 is, to the
// kernel, a name the server chose not to describe (fuse_direntplus_link),
// and a later stat of it is an ordinary LOOKUP. A lister that stats as it
// reads (ls -l) pays those lookups for the first batch, which also tell
// the kernel to ask for attributes with every batch after it; one that
// reads the whole directory before it stats (du, cp -a) looks up every
// entry beyond the first batch either way. Directories of up to
// PlusAttrsMax names, most of any source tree, keep their attributes in
// the batch.
const PlusAttrsMax = 256

// plusBatch decides, for one open directory, which READDIRPLUS entries
// come with attributes. go-fuse's bridge serves a READDIRPLUS request by
// calling Readdirent and then Lookup for each entry with one request
// context, so the context of the listing's first Readdirent names its
// first batch.
type plusBatch struct {
	node  *Node
	large bool
	first context.Context
}

// started records the request that reads the first entry of the listing;
// large says whether the listing has more than PlusAttrsMax names besides
// "." and "..".
func (p *plusBatch) started(ctx context.Context, large bool) {
	if p.first == nil {
		p.first, p.large = ctx, large
	}
}

// restart forgets the first request: a seek to the start (rewinddir)
// begins a new listing, whose first batch is decided anew.
func (p *plusBatch) restart() { p.first = nil }

// isDots reports whether name is "." or "..".
func isDots(name string) bool { return name == "." || name == ".." }

var _ = (gofs.FileLookuper)((*plusBatch)(nil))

// Lookup describes an entry of a READDIRPLUS batch: as a LOOKUP would,
// except in the first batch of a large listing, where it leaves the
// entry undescribed.
func (p *plusBatch) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if p.large && ctx == p.first {
		return nil, syscall.ENOENT
	}
	return p.node.Lookup(ctx, name, out)
}
