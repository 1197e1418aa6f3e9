package restart

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
)

// TakeoverFS stands in front of go-fuse's bridge in a daemon that
// adopted its connection: it resolves the node IDs and handles the
// kernel got from earlier daemons. Every method of go-fuse's
// fuse.RawFileSystem (v2.12.1) is spelled out, so that the compiler says
// when go-fuse adds one.
type TakeoverFS struct {
	fs  fuse.RawFileSystem
	log hclog.Logger
	// paths says where an inherited node may be (fs: Mount.pathsOfNode).
	paths func(id uint64) ([][]string, syscall.Errno)
	// Found, when set, is told the path an inherited node was found at.
	Found func(path []string)
	// Forgotten, when set, is told of an inherited node the kernel
	// forgot before this daemon ever resolved it: what was kept for it
	// (a record of its file, unlinked while open) can go, before its
	// inode number is another file's.
	Forgotten func(id uint64)
	// gen is this daemon's generation, in the high 32 bits of every
	// handle it hands out.
	gen uint64

	mu sync.Mutex
	// handles maps a handle of an earlier daemon to the one this daemon
	// opened for it on first use.
	handles map[uint64]uint64
	// resolved and lost count the inherited nodes found and not found.
	resolved, lost atomic.Int64
}

// Inherited returns how many nodes of earlier daemons were found, and
// how many were not.
func (t *TakeoverFS) Inherited() (resolved, lost int64) { return t.resolved.Load(), t.lost.Load() }

// NewTakeoverFS returns fs behind a TakeoverFS of daemon generation gen;
// paths says where an inherited node may be, most likely first.
func NewTakeoverFS(fs fuse.RawFileSystem, log hclog.Logger, gen uint32, paths func(uint64) ([][]string, syscall.Errno)) *TakeoverFS {
	return &TakeoverFS{fs: fs, log: log, gen: uint64(gen), paths: paths, handles: make(map[uint64]uint64)}
}

// unknownNode reports the node ID of a panic of go-fuse's bridge over a
// node it does not know: "unknown node N", raised before the request
// changed anything, or "detachFile: unknown node N", raised by a release
// of a handle whose node the bridge let go of, with nothing left to do.
func unknownNode(r any) (uint64, bool) {
	s, ok := r.(string)
	if !ok {
		return 0, false
	}
	s = strings.TrimPrefix(s, "detachFile: ")
	var id uint64
	if n, err := fmt.Sscanf(s, "unknown node %d", &id); n != 1 || err != nil {
		return 0, false
	}
	return id, true
}

// try runs op and reports the node the bridge did not know, if that is
// why it failed; any other panic goes on.
func try(op func()) (unknown uint64, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			id, known := unknownNode(r)
			if !known {
				panic(r)
			}
			unknown, ok = id, true
		}
	}()
	op()
	return 0, false
}

// call runs op, resolving each inherited node the bridge does not know
// first: a request names at most two nodes.
func (t *TakeoverFS) call(cancel <-chan struct{}, op func()) fuse.Status {
	for range 3 {
		id, unknown := try(op)
		if !unknown {
			return fuse.OK
		}
		if st := t.resolve(cancel, id); st != fuse.OK {
			return st
		}
	}
	return fuse.Status(syscall.ESTALE)
}

// resolve has the bridge find node id: the path its inode number leads
// to (fs: Mount.pathsOfNode) is looked up through the bridge, name by name
// from the root, as the kernel would, so that every node on the way is
// registered and attached where it is. The bridge counts those lookups,
// which the kernel did not make: an inherited node's count is never the
// kernel's (see Forget), and a directory on the way stays known to the
// bridge for the connection's life.
func (t *TakeoverFS) resolve(cancel <-chan struct{}, id uint64) fuse.Status {
	paths, errno := t.paths(id)
	if errno != 0 {
		t.lost.Add(1)
		t.log.Warn("a node the kernel holds from an earlier daemon cannot be found", "node", id, "error", errno)
		return fuse.Status(errno)
	}
	for _, p := range paths {
		node := uint64(fuse.FUSE_ROOT_ID)
		for _, name := range p {
			var out fuse.EntryOut
			if st := t.fs.Lookup(cancel, &fuse.InHeader{NodeId: node}, name, &out); st != fuse.OK || out.NodeId == 0 {
				node = 0
				break
			}
			node = out.NodeId
		}
		if node == id {
			t.resolved.Add(1)
			if t.Found != nil {
				t.Found(p)
			}
			return fuse.OK
		}
	}
	t.lost.Add(1)
	t.log.Warn("a node the kernel holds from an earlier daemon is not where its file is", "node", id, "paths", fmt.Sprint(paths))
	return fuse.Status(syscall.ESTALE)
}

// ours reports whether fh was handed out by this daemon, and its number
// in the bridge.
func (t *TakeoverFS) ours(fh uint64) (uint64, bool) {
	return fh & (1<<32 - 1), fh>>32 == t.gen
}

// out turns the bridge's number of a handle into the kernel's.
func (t *TakeoverFS) out(fh uint64) uint64 { return fh | t.gen<<32 }

// handle returns the bridge's handle for fh; one of an earlier daemon is
// opened again with open, once. 0 means there is none and open was nil.
func (t *TakeoverFS) handle(fh, node uint64, open func() (uint64, bool, fuse.Status)) (uint64, fuse.Status) {
	if h, ok := t.ours(fh); ok || fh == 0 {
		return h, fuse.OK
	}
	t.mu.Lock()
	h, ok := t.handles[fh]
	t.mu.Unlock()
	if ok || open == nil {
		return h, fuse.OK
	}
	h, dir, st := open()
	if st != fuse.OK {
		return 0, st
	}
	t.mu.Lock()
	if prev, ok := t.handles[fh]; ok {
		t.mu.Unlock()
		// Another request opened it first: this open goes.
		in := &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: node}, Fh: h}
		if dir {
			t.fs.ReleaseDir(in)
		} else {
			t.fs.Release(nil, in)
		}
		return prev, fuse.OK
	}
	t.handles[fh] = h
	t.mu.Unlock()
	return h, fuse.OK
}

// attrHandle maps *fh for a request that names a handle only if it has
// one (getattr, setattr, statx): an earlier daemon's handle that this one
// never opened again becomes none, and the node answers alone. It
// reports whether a handle is left.
func (t *TakeoverFS) attrHandle(fh *uint64, node uint64) bool {
	*fh, _ = t.handle(*fh, node, nil)
	return *fh != 0
}

// forgetHandle drops the mapping of an inherited handle, and returns the
// bridge's handle to release (0: none).
func (t *TakeoverFS) forgetHandle(fh uint64) uint64 {
	if h, ok := t.ours(fh); ok {
		return h
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.handles[fh]
	delete(t.handles, fh)
	return h
}

// writable is the open flags of a handle that writes: a write from the
// page cache (a shared mapping's writeback) carries none.
func writable(flags uint32) uint32 {
	return flags&^syscall.O_ACCMODE | syscall.O_RDWR
}

// reopen opens node again as the kernel had it open, with flags.
func (t *TakeoverFS) reopen(cancel <-chan struct{}, node uint64, flags uint32, dir bool) func() (uint64, bool, fuse.Status) {
	return func() (uint64, bool, fuse.Status) {
		in := &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: node}, Flags: flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC)}
		var out fuse.OpenOut
		var st fuse.Status
		cst := t.call(cancel, func() {
			if dir {
				st = t.fs.OpenDir(cancel, in, &out)
			} else {
				st = t.fs.Open(cancel, in, &out)
			}
		})
		if cst != fuse.OK {
			return 0, dir, cst
		}
		return out.Fh, dir, st
	}
}

func (t *TakeoverFS) String() string      { return t.fs.String() }
func (t *TakeoverFS) SetDebug(debug bool) { t.fs.SetDebug(debug) }
func (t *TakeoverFS) Init(s *fuse.Server) { t.fs.Init(s) }
func (t *TakeoverFS) OnUnmount()          { t.fs.OnUnmount() }
func (t *TakeoverFS) status(call, st fuse.Status) fuse.Status {
	if call != fuse.OK {
		return call
	}
	return st
}

func (t *TakeoverFS) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Lookup(cancel, header, name, out) }), st)
}

// Forget applies an inherited node's count one at a time: the bridge's
// count of it is not the kernel's, and the bridge's own check of a count
// too large panics with the node locked. Once the bridge has let go of
// it, the rest of the count is moot; a node it never had needs nothing.
func (t *TakeoverFS) Forget(nodeid uint64, nlookup uint64) {
	for i := range nlookup {
		if _, unknown := try(func() { t.fs.Forget(nodeid, 1) }); unknown {
			if i == 0 && t.Forgotten != nil {
				t.Forgotten(nodeid)
			}
			return
		}
	}
}

func (t *TakeoverFS) GetAttr(cancel <-chan struct{}, input *fuse.GetAttrIn, out *fuse.AttrOut) (st fuse.Status) {
	if input.Flags()&fuse.FUSE_GETATTR_FH != 0 && !t.attrHandle(&input.Fh_, input.NodeId) {
		input.Flags_ &^= fuse.FUSE_GETATTR_FH
	}
	return t.status(t.call(cancel, func() { st = t.fs.GetAttr(cancel, input, out) }), st)
}

func (t *TakeoverFS) SetAttr(cancel <-chan struct{}, input *fuse.SetAttrIn, out *fuse.AttrOut) (st fuse.Status) {
	if input.Valid&fuse.FATTR_FH != 0 && !t.attrHandle(&input.Fh, input.NodeId) {
		input.Valid &^= fuse.FATTR_FH
	}
	return t.status(t.call(cancel, func() { st = t.fs.SetAttr(cancel, input, out) }), st)
}

func (t *TakeoverFS) Mknod(cancel <-chan struct{}, input *fuse.MknodIn, name string, out *fuse.EntryOut) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Mknod(cancel, input, name, out) }), st)
}

func (t *TakeoverFS) Mkdir(cancel <-chan struct{}, input *fuse.MkdirIn, name string, out *fuse.EntryOut) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Mkdir(cancel, input, name, out) }), st)
}

func (t *TakeoverFS) Unlink(cancel <-chan struct{}, header *fuse.InHeader, name string) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Unlink(cancel, header, name) }), st)
}

func (t *TakeoverFS) Rmdir(cancel <-chan struct{}, header *fuse.InHeader, name string) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Rmdir(cancel, header, name) }), st)
}

func (t *TakeoverFS) Rename(cancel <-chan struct{}, input *fuse.RenameIn, oldName string, newName string) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Rename(cancel, input, oldName, newName) }), st)
}

func (t *TakeoverFS) Link(cancel <-chan struct{}, input *fuse.LinkIn, filename string, out *fuse.EntryOut) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Link(cancel, input, filename, out) }), st)
}

func (t *TakeoverFS) Symlink(cancel <-chan struct{}, header *fuse.InHeader, pointedTo string, linkName string, out *fuse.EntryOut) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Symlink(cancel, header, pointedTo, linkName, out) }), st)
}

func (t *TakeoverFS) Readlink(cancel <-chan struct{}, header *fuse.InHeader) (b []byte, st fuse.Status) {
	return b, t.status(t.call(cancel, func() { b, st = t.fs.Readlink(cancel, header) }), st)
}

func (t *TakeoverFS) Access(cancel <-chan struct{}, input *fuse.AccessIn) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.Access(cancel, input) }), st)
}

func (t *TakeoverFS) GetXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string, dest []byte) (n uint32, st fuse.Status) {
	return n, t.status(t.call(cancel, func() { n, st = t.fs.GetXAttr(cancel, header, attr, dest) }), st)
}

func (t *TakeoverFS) ListXAttr(cancel <-chan struct{}, header *fuse.InHeader, dest []byte) (n uint32, st fuse.Status) {
	return n, t.status(t.call(cancel, func() { n, st = t.fs.ListXAttr(cancel, header, dest) }), st)
}

func (t *TakeoverFS) SetXAttr(cancel <-chan struct{}, input *fuse.SetXAttrIn, attr string, data []byte) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.SetXAttr(cancel, input, attr, data) }), st)
}

func (t *TakeoverFS) RemoveXAttr(cancel <-chan struct{}, header *fuse.InHeader, attr string) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.RemoveXAttr(cancel, header, attr) }), st)
}

func (t *TakeoverFS) Create(cancel <-chan struct{}, input *fuse.CreateIn, name string, out *fuse.CreateOut) (st fuse.Status) {
	st = t.status(t.call(cancel, func() { st = t.fs.Create(cancel, input, name, out) }), st)
	if st == fuse.OK {
		out.Fh = t.out(out.Fh)
	}
	return st
}

func (t *TakeoverFS) Tmpfile(cancel <-chan struct{}, input *fuse.CreateIn, out *fuse.CreateOut) (st fuse.Status) {
	st = t.status(t.call(cancel, func() { st = t.fs.Tmpfile(cancel, input, out) }), st)
	if st == fuse.OK {
		out.Fh = t.out(out.Fh)
	}
	return st
}

func (t *TakeoverFS) Open(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) (st fuse.Status) {
	st = t.status(t.call(cancel, func() { st = t.fs.Open(cancel, input, out) }), st)
	if st == fuse.OK {
		out.Fh = t.out(out.Fh)
	}
	return st
}

func (t *TakeoverFS) Read(cancel <-chan struct{}, input *fuse.ReadIn, buf []byte) (r fuse.ReadResult, st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, input.Flags, false)); st != fuse.OK {
		return nil, st
	}
	return r, t.status(t.call(cancel, func() { r, st = t.fs.Read(cancel, input, buf) }), st)
}

func (t *TakeoverFS) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) (st fuse.Status) {
	if in.Fh, st = t.handle(in.Fh, in.NodeId, t.reopen(cancel, in.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.Lseek(cancel, in, out) }), st)
}

func (t *TakeoverFS) GetLk(cancel <-chan struct{}, input *fuse.LkIn, out *fuse.LkOut) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.GetLk(cancel, input, out) }), st)
}

func (t *TakeoverFS) SetLk(cancel <-chan struct{}, input *fuse.LkIn) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.SetLk(cancel, input) }), st)
}

func (t *TakeoverFS) SetLkw(cancel <-chan struct{}, input *fuse.LkIn) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.SetLkw(cancel, input) }), st)
}

// Release of an earlier daemon's handle releases what this daemon opened
// for it, if anything.
func (t *TakeoverFS) Release(cancel <-chan struct{}, input *fuse.ReleaseIn) {
	if input.Fh = t.forgetHandle(input.Fh); input.Fh == 0 {
		return
	}
	t.call(cancel, func() { t.fs.Release(cancel, input) })
}

func (t *TakeoverFS) Write(cancel <-chan struct{}, input *fuse.WriteIn, data []byte) (n uint32, st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, writable(input.Flags), false)); st != fuse.OK {
		return 0, st
	}
	return n, t.status(t.call(cancel, func() { n, st = t.fs.Write(cancel, input, data) }), st)
}

func (t *TakeoverFS) Writev(cancel <-chan struct{}, input *fuse.WriteIn, data [][]byte) (n uint32, st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, writable(input.Flags), false)); st != fuse.OK {
		return 0, st
	}
	return n, t.status(t.call(cancel, func() { n, st = t.fs.Writev(cancel, input, data) }), st)
}

func (t *TakeoverFS) CopyFileRange(cancel <-chan struct{}, input *fuse.CopyFileRangeIn) (n uint32, st fuse.Status) {
	if input.FhIn, st = t.handle(input.FhIn, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return 0, st
	}
	if input.FhOut, st = t.handle(input.FhOut, input.NodeIdOut, t.reopen(cancel, input.NodeIdOut, syscall.O_RDWR, false)); st != fuse.OK {
		return 0, st
	}
	return n, t.status(t.call(cancel, func() { n, st = t.fs.CopyFileRange(cancel, input) }), st)
}

func (t *TakeoverFS) Ioctl(cancel <-chan struct{}, input *fuse.IoctlIn, inbuf []byte, output *fuse.IoctlOut, outbuf []byte) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.Ioctl(cancel, input, inbuf, output, outbuf) }), st)
}

// Flush of an earlier daemon's handle that this daemon never opened
// again has nothing to flush: the data went to the backing file.
func (t *TakeoverFS) Flush(cancel <-chan struct{}, input *fuse.FlushIn) (st fuse.Status) {
	if input.Fh, _ = t.handle(input.Fh, input.NodeId, nil); input.Fh == 0 {
		return fuse.OK
	}
	return t.status(t.call(cancel, func() { st = t.fs.Flush(cancel, input) }), st)
}

func (t *TakeoverFS) Fsync(cancel <-chan struct{}, input *fuse.FsyncIn) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.Fsync(cancel, input) }), st)
}

func (t *TakeoverFS) Fallocate(cancel <-chan struct{}, input *fuse.FallocateIn) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDWR, false)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.Fallocate(cancel, input) }), st)
}

func (t *TakeoverFS) OpenDir(cancel <-chan struct{}, input *fuse.OpenIn, out *fuse.OpenOut) (st fuse.Status) {
	st = t.status(t.call(cancel, func() { st = t.fs.OpenDir(cancel, input, out) }), st)
	if st == fuse.OK {
		out.Fh = t.out(out.Fh)
	}
	return st
}

func (t *TakeoverFS) ReadDir(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, true)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.ReadDir(cancel, input, out) }), st)
}

func (t *TakeoverFS) ReadDirPlus(cancel <-chan struct{}, input *fuse.ReadIn, out *fuse.DirEntryList) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, true)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.ReadDirPlus(cancel, input, out) }), st)
}

func (t *TakeoverFS) ReleaseDir(input *fuse.ReleaseIn) {
	if input.Fh = t.forgetHandle(input.Fh); input.Fh == 0 {
		return
	}
	t.call(nil, func() { t.fs.ReleaseDir(input) })
}

func (t *TakeoverFS) FsyncDir(cancel <-chan struct{}, input *fuse.FsyncIn) (st fuse.Status) {
	if input.Fh, st = t.handle(input.Fh, input.NodeId, t.reopen(cancel, input.NodeId, syscall.O_RDONLY, true)); st != fuse.OK {
		return st
	}
	return t.status(t.call(cancel, func() { st = t.fs.FsyncDir(cancel, input) }), st)
}

func (t *TakeoverFS) StatFs(cancel <-chan struct{}, input *fuse.InHeader, out *fuse.StatfsOut) (st fuse.Status) {
	return t.status(t.call(cancel, func() { st = t.fs.StatFs(cancel, input, out) }), st)
}

func (t *TakeoverFS) Statx(cancel <-chan struct{}, input *fuse.StatxIn, out *fuse.StatxOut) (st fuse.Status) {
	if input.GetattrFlags&fuse.FUSE_GETATTR_FH != 0 && !t.attrHandle(&input.Fh, input.NodeId) {
		input.GetattrFlags &^= fuse.FUSE_GETATTR_FH
	}
	return t.status(t.call(cancel, func() { st = t.fs.Statx(cancel, input, out) }), st)
}
