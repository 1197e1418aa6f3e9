package transport

import (
	"bytes"
	"fmt"
	"runtime/debug"
	"syscall"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Opcodes, from include/uapi/linux/fuse.h.
const (
	opLookup        = 1
	opForget        = 2
	opGetattr       = 3
	opSetattr       = 4
	opReadlink      = 5
	opSymlink       = 6
	opMknod         = 8
	opMkdir         = 9
	opUnlink        = 10
	opRmdir         = 11
	opRename        = 12
	opLink          = 13
	opOpen          = 14
	opRead          = 15
	opWrite         = 16
	opStatfs        = 17
	opRelease       = 18
	opFsync         = 20
	opSetxattr      = 21
	opGetxattr      = 22
	opListxattr     = 23
	opRemovexattr   = 24
	opFlush         = 25
	opInit          = 26
	opOpendir       = 27
	opReaddir       = 28
	opReleasedir    = 29
	opFsyncdir      = 30
	opAccess        = 34
	opCreate        = 35
	opInterrupt     = 36
	opDestroy       = 38
	opIoctl         = 39
	opBatchForget   = 42
	opFallocate     = 43
	opReaddirplus   = 44
	opRename2       = 45
	opLseek         = 46
	opCopyFileRange = 47
	opTmpfile       = 51
	opStatx         = 52
	outHeaderSize   = int(unsafe.Sizeof(fuse.OutHeader{}))
	inHeaderSize    = int(unsafe.Sizeof(fuse.InHeader{}))
	maxXattrSize    = 64 << 10 // XATTR_SIZE_MAX and XATTR_LIST_MAX
	// maxOutStructSize is the largest reply struct, STATX's (its statx
	// buffer and the validity before it).
	maxOutStructSize = max(256, int(unsafe.Sizeof(fuse.StatxOut{})))
)

// buffers are one reader's: the request as read, the reply's header and
// struct, and room for a reply's payload (read data, a listing, an xattr
// value, a link target).
type buffers struct {
	in, out, payload []byte
	// errno is what the last reply sent carried, for the Observer.
	errno syscall.Errno
	// ent is the ring entry the request came in, whose buffers take the
	// reply (fuseuring.go); nil for a request read from /dev/fuse. For a
	// ring request, payload is the entry's payload buffer, so a reply's
	// data is built where the kernel reads it.
	ent *ringEnt
}

func newBuffers(maxWrite int) *buffers {
	return &buffers{
		// A WRITE of maxWrite bytes, its header and struct, and slack
		// for the extensions the kernel may add.
		in:      make([]byte, maxWrite+4096),
		out:     make([]byte, outHeaderSize+maxOutStructSize),
		payload: make([]byte, max(maxWrite, maxXattrSize)),
	}
}

// request is one request as read, with its variable part (after the
// opcode's fixed struct) split off.
type request struct {
	raw []byte // header, struct and variable part
	hdr *fuse.InHeader
}

// fixed returns a pointer to the request read as an input struct of size
// bytes (header included), and the variable part after it, or false if
// the request is shorter.
func (r request) fixed(size int) (unsafe.Pointer, []byte, bool) {
	if len(r.raw) < size {
		return nil, nil, false
	}
	return unsafe.Pointer(&r.raw[0]), r.raw[size:], true
}

// names splits a variable part into n NUL-terminated names.
func names(b []byte, n int) ([]string, bool) {
	out := make([]string, 0, n)
	for range n {
		i := bytes.IndexByte(b, 0)
		if i < 0 {
			return nil, false
		}
		out = append(out, string(b[:i]))
		b = b[i+1:]
	}
	return out, true
}

func name(b []byte) (string, bool) {
	ns, ok := names(b, 1)
	if !ok {
		return "", false
	}
	return ns[0], true
}

// handle serves one request and replies to it (unless its opcode takes no
// reply). A panic in the filesystem is logged and answered with EIO: one
// request's bug must not take the mount down.
func (c *Conn) handle(b *buffers, raw []byte) {
	if len(raw) < inHeaderSize {
		c.log.Error("short FUSE request", "bytes", len(raw))
		return
	}
	hdr := (*fuse.InHeader)(unsafe.Pointer(&raw[0]))
	if c.arr != nil {
		c.arr.Arrived(hdr.Opcode)
	}
	if c.obs != nil {
		// Deferred before the recovery below, so that it runs after it
		// and sees the EIO a panic is answered with.
		start := time.Now()
		b.errno = 0
		defer func() { c.obs.Request(hdr.Opcode, time.Since(start), b.errno) }()
	}
	if ext := int(hdr.TotalExtlen) * 8; ext > 0 {
		if ext > len(raw)-inHeaderSize {
			c.reply(b, hdr.Unique, syscall.EINVAL, 0)
			return
		}
		raw = raw[:len(raw)-ext]
	}
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("panic in a FUSE handler; answered EIO", "opcode", hdr.Opcode, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			c.reply(b, hdr.Unique, syscall.EIO, 0)
		}
	}()
	c.dispatch(b, request{raw: raw, hdr: hdr})
}

// structs reads the request as *In and points out at the reply's struct;
// ok is false (and EINVAL sent) when the request is too short.
func inOut[In, Out any](c *Conn, b *buffers, r request) (*In, *Out, []byte, bool) {
	p, rest, ok := r.fixed(int(unsafe.Sizeof(*new(In))))
	if !ok {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return nil, nil, nil, false
	}
	out := (*Out)(unsafe.Pointer(&b.out[outHeaderSize]))
	clear(b.out[outHeaderSize : outHeaderSize+int(unsafe.Sizeof(*out))])
	return (*In)(p), out, rest, true
}

// in reads the request as *In; see inOut.
func in[In any](c *Conn, b *buffers, r request) (*In, []byte, bool) {
	i, _, rest, ok := inOut[In, struct{}](c, b, r)
	return i, rest, ok
}

func sizeOf[T any]() int { return int(unsafe.Sizeof(*new(T))) }

// done replies to a request whose answer is a struct of type Out (or
// nothing, for struct{}) and a status.
func done[Out any](c *Conn, b *buffers, r request, st fuse.Status) {
	c.reply(b, r.hdr.Unique, syscall.Errno(st), sizeOf[Out]())
}

// serve answers a request whose input is an In and whose reply an Out
// (struct{} for a bare status) with what fn returns; a request too short
// for In is answered EINVAL.
func serve[In, Out any](c *Conn, b *buffers, r request, fn func(*In, *Out) fuse.Status) {
	if i, out, _, ok := inOut[In, Out](c, b, r); ok {
		done[Out](c, b, r, fn(i, out))
	}
}

// serveNamed is serve for a request whose In is followed by a name.
func serveNamed[In, Out any](c *Conn, b *buffers, r request, fn func(*In, string, *Out) fuse.Status) {
	if i, out, rest, ok := inOut[In, Out](c, b, r); ok {
		c.named(b, r, rest, func(n string) fuse.Status { return fn(i, n, out) }, sizeOf[Out]())
	}
}

func (c *Conn) dispatch(b *buffers, r request) {
	if c.probeRequest(b, r) {
		return
	}
	fs := c.fs
	var cancel <-chan struct{}
	u := r.hdr.Unique
	switch r.hdr.Opcode {
	case opLookup:
		serveNamed(c, b, r, func(_ *fuse.InHeader, n string, out *fuse.EntryOut) fuse.Status {
			return fs.Lookup(cancel, r.hdr, n, out)
		})
	case opForget:
		i, _, ok := in[fuse.ForgetIn](c, b, r)
		if ok {
			fs.Forget(r.hdr.NodeId, i.Nlookup)
		}
	case opBatchForget:
		c.batchForget(r)
	case opGetattr:
		serve(c, b, r, func(i *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status { return fs.GetAttr(cancel, i, out) })
	case opSetattr:
		serve(c, b, r, func(i *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status { return fs.SetAttr(cancel, i, out) })
	case opReadlink:
		target, st := fs.Readlink(cancel, r.hdr)
		c.replyData(b, u, st, target)
	case opSymlink:
		_, out, rest, ok := inOut[fuse.InHeader, fuse.EntryOut](c, b, r)
		if !ok {
			return
		}
		ns, ok := names(rest, 2)
		if !ok {
			c.reply(b, u, syscall.EINVAL, 0)
			return
		}
		// The entry's name comes first, then the link's target.
		done[fuse.EntryOut](c, b, r, fs.Symlink(cancel, r.hdr, ns[1], ns[0], out))
	case opMknod:
		serveNamed(c, b, r, func(i *fuse.MknodIn, n string, out *fuse.EntryOut) fuse.Status { return fs.Mknod(cancel, i, n, out) })
	case opMkdir:
		serveNamed(c, b, r, func(i *fuse.MkdirIn, n string, out *fuse.EntryOut) fuse.Status { return fs.Mkdir(cancel, i, n, out) })
	case opUnlink:
		serveNamed(c, b, r, func(_ *fuse.InHeader, n string, _ *struct{}) fuse.Status { return fs.Unlink(cancel, r.hdr, n) })
	case opRmdir:
		serveNamed(c, b, r, func(_ *fuse.InHeader, n string, _ *struct{}) fuse.Status { return fs.Rmdir(cancel, r.hdr, n) })
	case opRename, opRename2:
		c.rename(b, r)
	case opLink:
		serveNamed(c, b, r, func(i *fuse.LinkIn, n string, out *fuse.EntryOut) fuse.Status { return fs.Link(cancel, i, n, out) })
	case opOpen:
		serve(c, b, r, func(i *fuse.OpenIn, out *fuse.OpenOut) fuse.Status { return fs.Open(cancel, i, out) })
	case opOpendir:
		serve(c, b, r, func(i *fuse.OpenIn, out *fuse.OpenOut) fuse.Status { return fs.OpenDir(cancel, i, out) })
	case opRead:
		c.read1(b, r)
	case opWrite:
		i, out, rest, ok := inOut[fuse.WriteIn, fuse.WriteOut](c, b, r)
		if !ok {
			return
		}
		if int(i.Size) > len(rest) {
			c.reply(b, u, syscall.EINVAL, 0)
			return
		}
		var st fuse.Status
		out.Size, st = fs.Write(cancel, i, rest[:i.Size])
		done[fuse.WriteOut](c, b, r, st)
	case opStatfs:
		serve(c, b, r, func(_ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status { return fs.StatFs(cancel, r.hdr, out) })
	case opRelease:
		i, _, ok := in[fuse.ReleaseIn](c, b, r)
		if ok {
			fs.Release(cancel, i)
			c.reply(b, u, 0, 0)
		}
	case opReleasedir:
		i, _, ok := in[fuse.ReleaseIn](c, b, r)
		if ok {
			fs.ReleaseDir(i)
			c.reply(b, u, 0, 0)
		}
	case opFsync:
		serve(c, b, r, func(i *fuse.FsyncIn, _ *struct{}) fuse.Status { return fs.Fsync(cancel, i) })
	case opFsyncdir:
		serve(c, b, r, func(i *fuse.FsyncIn, _ *struct{}) fuse.Status { return fs.FsyncDir(cancel, i) })
	case opSetxattr:
		c.setxattr(b, r)
	case opGetxattr, opListxattr:
		c.getxattr(b, r)
	case opRemovexattr:
		serveNamed(c, b, r, func(_ *fuse.InHeader, n string, _ *struct{}) fuse.Status { return fs.RemoveXAttr(cancel, r.hdr, n) })
	case opFlush:
		serve(c, b, r, func(i *fuse.FlushIn, _ *struct{}) fuse.Status { return fs.Flush(cancel, i) })
	case opReaddir, opReaddirplus:
		c.readdir(b, r)
	case opAccess:
		serve(c, b, r, func(i *fuse.AccessIn, _ *struct{}) fuse.Status { return fs.Access(cancel, i) })
	case opCreate:
		serveNamed(c, b, r, func(i *fuse.CreateIn, n string, out *fuse.CreateOut) fuse.Status { return fs.Create(cancel, i, n, out) })
	case opTmpfile:
		// The name the kernel sends for the unnamed file means nothing.
		serve(c, b, r, func(i *fuse.CreateIn, out *fuse.CreateOut) fuse.Status { return fs.Tmpfile(cancel, i, out) })
	case opInterrupt:
		// Ignored, as the protocol allows: the interrupted request is
		// answered when its handler returns.
	case opDestroy:
		c.reply(b, u, 0, 0)
	case opFallocate:
		serve(c, b, r, func(i *fuse.FallocateIn, _ *struct{}) fuse.Status { return fs.Fallocate(cancel, i) })
	case opLseek:
		serve(c, b, r, func(i *fuse.LseekIn, out *fuse.LseekOut) fuse.Status { return fs.Lseek(cancel, i, out) })
	case opCopyFileRange:
		i, out, _, ok := inOut[fuse.CopyFileRangeIn, fuse.WriteOut](c, b, r)
		if !ok {
			return
		}
		var st fuse.Status
		out.Size, st = fs.CopyFileRange(cancel, i)
		done[fuse.WriteOut](c, b, r, st)
	case opStatx:
		serve(c, b, r, func(i *fuse.StatxIn, out *fuse.StatxOut) fuse.Status { return fs.Statx(cancel, i, out) })
	default:
		// Locks, ioctls, poll, bmap, DAX mappings, syncfs: not offered.
		c.reply(b, u, syscall.ENOSYS, 0)
	}
}

// named serves a request whose variable part is one name.
func (c *Conn) named(b *buffers, r request, rest []byte, fn func(string) fuse.Status, outSize int) {
	n, ok := name(rest)
	if !ok {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return
	}
	c.reply(b, r.hdr.Unique, syscall.Errno(fn(n)), outSize)
}

// rename serves RENAME (no flags; its struct is the new parent alone) and
// RENAME2 (with flags).
func (c *Conn) rename(b *buffers, r request) {
	var ri fuse.RenameIn
	size := inHeaderSize + 8
	if r.hdr.Opcode == opRename2 {
		size = sizeOf[fuse.RenameIn]()
	}
	p, rest, ok := r.fixed(size)
	if !ok {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&ri)), size), unsafe.Slice((*byte)(p), size))
	ns, ok := names(rest, 2)
	if !ok {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return
	}
	c.reply(b, r.hdr.Unique, syscall.Errno(c.fs.Rename(nil, &ri, ns[0], ns[1])), 0)
}

func (c *Conn) batchForget(r request) {
	type forgetOne struct{ NodeID, Nlookup uint64 }
	p, rest, ok := r.fixed(inHeaderSize + 8)
	if !ok {
		return
	}
	count := int(*(*uint32)(unsafe.Add(p, inHeaderSize)))
	size := int(unsafe.Sizeof(forgetOne{}))
	if count*size > len(rest) {
		c.log.Warn("BATCH_FORGET shorter than its count", "count", count, "bytes", len(rest))
		count = len(rest) / size
	}
	for i := range count {
		f := (*forgetOne)(unsafe.Pointer(&rest[i*size]))
		if f.NodeID != probeNode {
			c.fs.Forget(f.NodeID, f.Nlookup)
		}
	}
}

// readIn reads a request shaped like READ (READ, READDIR, READDIRPLUS)
// and returns the room for its reply's data; ok is false (and EINVAL
// sent) when the request is short or asks for more than the payload
// buffer holds.
func (c *Conn) readIn(b *buffers, r request) (*fuse.ReadIn, []byte, bool) {
	i, _, ok := in[fuse.ReadIn](c, b, r)
	if !ok {
		return nil, nil, false
	}
	if int(i.Size) > len(b.payload) {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return nil, nil, false
	}
	return i, b.payload[:i.Size], true
}

func (c *Conn) read1(b *buffers, r request) {
	i, dest, ok := c.readIn(b, r)
	if !ok {
		return
	}
	res, st := c.fs.Read(nil, i, dest)
	if st != fuse.OK {
		if res != nil {
			res.Done()
		}
		c.reply(b, r.hdr.Unique, syscall.Errno(st), 0)
		return
	}
	var data []byte
	if res != nil {
		data, st = res.Bytes(dest)
		defer res.Done()
	}
	c.replyData(b, r.hdr.Unique, st, data)
}

func (c *Conn) readdir(b *buffers, r request) {
	i, dest, ok := c.readIn(b, r)
	if !ok {
		return
	}
	list := fuse.NewDirEntryList(dest, i.Offset)
	var st fuse.Status
	if r.hdr.Opcode == opReaddirplus {
		st = c.fs.ReadDirPlus(nil, i, list)
	} else {
		st = c.fs.ReadDir(nil, i, list)
	}
	c.replyData(b, r.hdr.Unique, st, list.Bytes())
}

func (c *Conn) setxattr(b *buffers, r request) {
	// Without FUSE_SETXATTR_EXT the struct is size and flags alone.
	size := inHeaderSize + 8
	if c.flags&fuse.CAP_SETXATTR_EXT != 0 {
		size = sizeOf[fuse.SetXAttrIn]()
	}
	p, rest, ok := r.fixed(size)
	if !ok {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return
	}
	var si fuse.SetXAttrIn
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&si)), size), unsafe.Slice((*byte)(p), size))
	i := bytes.IndexByte(rest, 0)
	if i < 0 || len(rest)-i-1 < int(si.Size) {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return
	}
	value := rest[i+1 : i+1+int(si.Size)]
	c.reply(b, r.hdr.Unique, syscall.Errno(c.fs.SetXAttr(nil, &si, string(rest[:i]), value)), 0)
}

// getxattr serves GETXATTR and LISTXATTR, each two requests in one: with
// a size of 0 the kernel asks how big the value is, otherwise for the
// value itself.
func (c *Conn) getxattr(b *buffers, r request) {
	i, out, rest, ok := inOut[fuse.GetXAttrIn, fuse.GetXAttrOut](c, b, r)
	if !ok {
		return
	}
	if int(i.Size) > len(b.payload) {
		c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
		return
	}
	dest := b.payload[:i.Size]
	var n uint32
	var st fuse.Status
	if r.hdr.Opcode == opListxattr {
		n, st = c.fs.ListXAttr(nil, r.hdr, dest)
	} else {
		attr, ok := name(rest)
		if !ok {
			c.reply(b, r.hdr.Unique, syscall.EINVAL, 0)
			return
		}
		n, st = c.fs.GetXAttr(nil, r.hdr, attr, dest)
	}
	if i.Size == 0 {
		if st == fuse.ERANGE {
			st = fuse.OK
		}
		out.Size = n
		done[fuse.GetXAttrOut](c, b, r, st)
		return
	}
	if st == fuse.OK && int(n) > len(dest) {
		st = fuse.ERANGE
	}
	if st != fuse.OK {
		n = 0
	}
	c.replyData(b, r.hdr.Unique, st, dest[:n])
}

// reply sends a reply whose struct (size bytes) the handler wrote into
// b.out after the header. An error reply carries no struct.
func (c *Conn) reply(b *buffers, unique uint64, errno syscall.Errno, size int) syscall.Errno {
	if errno != 0 {
		size = 0
	}
	b.errno = errno
	h := (*fuse.OutHeader)(unsafe.Pointer(&b.out[0]))
	*h = fuse.OutHeader{Length: uint32(outHeaderSize + size), Status: -int32(errno), Unique: unique}
	if b.ent != nil {
		return b.ent.put(b.out[:outHeaderSize], b.out[outHeaderSize:outHeaderSize+size])
	}
	return c.write(b.out[:outHeaderSize+size])
}

// replyData sends a reply whose payload is data.
func (c *Conn) replyData(b *buffers, unique uint64, st fuse.Status, data []byte) {
	if st != fuse.OK {
		c.reply(b, unique, syscall.Errno(st), 0)
		return
	}
	h := (*fuse.OutHeader)(unsafe.Pointer(&b.out[0]))
	*h = fuse.OutHeader{Length: uint32(outHeaderSize + len(data)), Unique: unique}
	if b.ent != nil {
		b.ent.put(b.out[:outHeaderSize], data)
		return
	}
	if len(data) == 0 {
		c.write(b.out[:outHeaderSize])
		return
	}
	c.writev(b.out[:outHeaderSize], data)
}

func (c *Conn) write(msg []byte) syscall.Errno {
	_, err := unix.Write(c.fd, msg)
	return c.sent(err)
}

func (c *Conn) writev(parts ...[]byte) syscall.Errno {
	_, err := unix.Writev(c.fd, parts)
	return c.sent(err)
}

// sent logs a failed reply. ENOENT means the kernel no longer waits for
// it (the request was interrupted, or the mount is going away).
func (c *Conn) sent(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	errno, _ := err.(syscall.Errno)
	if errno != unix.ENOENT && errno != unix.ENODEV && !c.closed.Load() {
		c.log.Warn("writing a FUSE reply failed", "error", err)
	}
	if errno == 0 {
		errno = syscall.EIO
	}
	return errno
}
