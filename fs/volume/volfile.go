package volume

import (
	"context"
	"fmt"
	"syscall"

	"github.com/allocfs/allocfs/fs/killpriv"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var _ = (gofs.NodeOpener)((*Node)(nil))

func (n *Node) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if n.ReadOnly() && flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) != 0 {
		return nil, 0, syscall.EROFS
	}
	if n.lowerOnly() {
		if flags&(syscall.O_WRONLY|syscall.O_RDWR|syscall.O_TRUNC) == 0 {
			// Reading a lower file needs no copy: open it where it is.
			// The kernel's own FMODE_EXEC of an execve is no open(2)
			// flag: openat2 refuses it.
			fd, err := n.openShown(int(flags &^ (syscall.O_APPEND | syscall.O_CREAT | fuse.FMODE_EXEC)))
			if err != nil {
				return nil, 0, ToErrno(n.p.logger, err)
			}
			lf := gofs.NewLoopbackFile(fd)
			if n.ReadOnly() {
				// Nothing in a frozen volume is ever copied up.
				return n.passthroughFile(lf), 0, 0
			}
			// No passthrough: the kernel keeps one backing file per
			// inode while any handle is open, and a writer opening the
			// file after its copy-up would be given this lower file to
			// write into.
			return n.daemonFile(n.newLowerFile(lf.(lowerHandle))), fuse.FOPEN_KEEP_CACHE, 0
		}
		if errno := n.copyUp(); errno != 0 {
			return nil, 0, errno
		}
	}
	lf, errno := n.backingOpen(0, flags)
	if errno == syscall.ENOENT {
		// A file whose last name is gone, opened again through
		// /proc/<pid>/fd: its open handles still reach it.
		lf, errno = n.reopenUnlinked(flags)
	}
	if errno != 0 {
		return nil, 0, errno
	}
	var fh gofs.FileHandle = lf
	if flags&syscall.O_TRUNC != 0 {
		// The open truncated the file (a CREATE that found it: the
		// mount has no ATOMIC_O_TRUNC, so an OPEN never does): an
		// unprivileged caller's truncate clears set-id bits as a write
		// does.
		if lf, ok := fh.(*gofs.LoopbackFile); ok && !killpriv.HasCap(ctx, killpriv.CapFsetid) {
			fd, _ := lf.PassthroughFd()
			if err := killpriv.Clear(ctx, fd); err != nil {
				releaseHandle(ctx, fh)
				return nil, 0, ToErrno(n.p.logger, err)
			}
		}
	}
	fh, openFlags := n.serveOpen(fh)
	return fh, openFlags, 0
}

// passthroughOpenFlags are the open flags of a handle offered for
// passthrough. No FLUSH on close: the data never passed through the
// daemon, and the kernel keeps file locks itself, so there is nothing a
// flush could do but cost a round trip per close (go-fuse's would dup and
// close the backing fd).
const passthroughOpenFlags = fuse.FOPEN_NOFLUSH

// volFile is an open regular file of a volume. Its fd is offered to the
// kernel for passthrough, so with passthrough on, no read or write ever
// reaches it: one that does means go-fuse has turned passthrough off for
// the whole mount (it does so silently, the first time registering a
// backing fd fails), and the mount reports it.
type volFile struct {
	*gofs.LoopbackFile
	p *Plane
	// node counts the handle in its passthroughOpen while it is open,
	// and in its openFiles when tracked is set.
	node    *Node
	tracked *gofs.LoopbackFile
}

// passthroughFile is a handle of n's file offered to the kernel for
// passthrough, counted in n.passthroughOpen until it is released.
func (n *Node) passthroughFile(fh gofs.FileHandle) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return n.p.wrapFile(fh)
	}
	n.mu.Lock()
	on := n.p.passthrough.Load()
	if on {
		n.passthroughOpen++
	}
	n.mu.Unlock()
	return n.asPassthroughFile(lf, on)
}

// asPassthroughFile wraps lf, a handle of n's file, as one the kernel
// serves by passthrough if on (the caller has counted it in
// n.passthroughOpen), or as one go-fuse serves when passthrough is off
// for the mount.
func (n *Node) asPassthroughFile(lf *gofs.LoopbackFile, on bool) gofs.FileHandle {
	n.trackFile(lf)
	if !on {
		n.p.daemonOpens.Add(1)
		return &trackedFile{LoopbackFile: lf, node: n}
	}
	n.p.passthroughOpens.Add(1)
	return &volFile{LoopbackFile: lf, p: n.p, node: n, tracked: lf}
}

// trackFile counts lf in the node's openFiles until it is released.
func (n *Node) trackFile(lf *gofs.LoopbackFile) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.openFiles == nil {
		n.openFiles = make(map[*gofs.LoopbackFile]struct{})
	}
	n.openFiles[lf] = struct{}{}
}

func (n *Node) untrackFile(lf *gofs.LoopbackFile) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.openFiles, lf)
}

// openFile returns one of the node's open handles on its own file, or
// nil.
func (n *Node) openFile() gofs.FileHandle {
	n.mu.Lock()
	defer n.mu.Unlock()
	for lf := range n.openFiles {
		return lf
	}
	return nil
}

// reopenUnlinked opens the node's file through one of its open handles,
// or the descriptor a takeover found it by, for a node whose name is
// gone; ENOENT when it has neither.
func (n *Node) reopenUnlinked(flags uint32) (*gofs.LoopbackFile, syscall.Errno) {
	fd, ok := -1, false
	if h := n.openFile(); h != nil {
		fd, ok = handleFd(h)
	}
	if !ok {
		// A node a takeover found by its record (unlinkedrec.go).
		n.mu.Lock()
		fd, ok = n.heldFd, n.heldFd > 0
		n.mu.Unlock()
	}
	if !ok {
		return nil, syscall.ENOENT
	}
	flags &^= syscall.O_APPEND | syscall.O_CREAT | syscall.O_EXCL | syscall.O_NOFOLLOW | fuse.FMODE_EXEC
	nfd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), int(flags)|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	return gofs.NewLoopbackFile(nfd).(*gofs.LoopbackFile), 0
}

// trackedFile is a loopback handle served without passthrough wrapping
// (passthrough off), counted in its node's openFiles while open.
type trackedFile struct {
	*gofs.LoopbackFile
	node *Node
}

var _ = (gofs.FileReleaser)((*trackedFile)(nil))

func (f *trackedFile) Release(ctx context.Context) syscall.Errno {
	f.node.untrackFile(f.LoopbackFile)
	return f.LoopbackFile.Release(ctx)
}

var _ = (gofs.FileReleaser)((*volFile)(nil))

func (f *volFile) Release(ctx context.Context) syscall.Errno {
	if f.node != nil {
		f.node.mu.Lock()
		f.node.passthroughOpen--
		f.node.mu.Unlock()
		if f.tracked != nil {
			f.node.untrackFile(f.tracked)
		}
	}
	return f.LoopbackFile.Release(ctx)
}

func (p *Plane) wrapFile(fh gofs.FileHandle) gofs.FileHandle {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok || !p.passthrough.Load() {
		return fh
	}
	return &volFile{LoopbackFile: lf, p: p}
}

var _ = (gofs.FileReader)((*volFile)(nil))

func (f *volFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.p.dataThroughDaemon("read")
	return f.LoopbackFile.Read(ctx, dest, off)
}

var _ = (gofs.FileWriter)((*volFile)(nil))

func (f *volFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	f.p.dataThroughDaemon("write")
	return f.LoopbackFile.Write(ctx, data, off)
}

var _ = (gofs.NodeTmpfiler)((*Node)(nil))

// Tmpfile needs the directory in the upper layer, like any creation.
func (n *Node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.ReadOnly() {
		return nil, nil, 0, syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return nil, nil, 0, errno
	}
	ch, fh, errno := n.backingTmpfile(ctx, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	if child, ok := ch.Operations().(*Node); ok {
		return ch, child.passthroughFile(fh), passthroughOpenFlags, 0
	}
	return ch, n.p.wrapFile(fh), 0, 0
}

// daemonHandle is what a file handle served by the daemon offers: the
// loopback file's operations, without its passthrough fd.
type daemonHandle interface {
	gofs.FileReader
	gofs.FileWriter
	gofs.FileReleaser
	gofs.FileFlusher
	gofs.FileFsyncer
	gofs.FileGetattrer
	gofs.FileSetattrer
	gofs.FileLseeker
	gofs.FileAllocater
}

// lowerHandle is what a handle on a lower file offers: reading. go-fuse
// answers GETATTR and SETATTR through any open handle of a node, and this
// one would show, or change, the lower file after a copy-up: it has
// neither, so they go by path to the copied-up file.
type lowerHandle interface {
	gofs.FileReader
	gofs.FileReleaser
	gofs.FileFlusher
	gofs.FileFsyncer
	gofs.FileLseeker
}

// lowerFile is a loopback file on a lower layer, reduced to lowerHandle.
// Once its node is copied up it reads the upper copy instead (upper): an
// fd opened before a copy-up reads what one opened after it reads, as on
// a local filesystem, where there is only one file.
type lowerFile struct {
	lowerHandle
	node *Node
	// upper is the copied-up file, opened by repoint; -1 before. Guarded
	// by node.mu.
	upper int
}

// newLowerFile wraps fh, open on n's lower file, and counts it in
// n.lowerFiles until it is released.
func (n *Node) newLowerFile(fh lowerHandle) *lowerFile {
	f := &lowerFile{lowerHandle: fh, node: n, upper: -1}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lowerFiles == nil {
		n.lowerFiles = make(map[*lowerFile]struct{})
	}
	n.lowerFiles[f] = struct{}{}
	return f
}

// repointLocked opens the upper copy for every open lower handle of the
// node, just copied up. n.mu is held. A handle whose copy cannot be
// opened reads on from the lower file, which holds the same bytes until
// a write changes the copy; the failure is logged.
func (n *Node) repointLocked() {
	if len(n.lowerFiles) == 0 {
		return
	}
	rel := n.rel()
	for f := range n.lowerFiles {
		if f.upper >= 0 {
			continue
		}
		fd, err := n.st.Open(0, rel, syscall.O_RDONLY)
		if err != nil {
			n.p.logger.Error("an fd opened before a copy-up cannot follow it", "path", rel, "error", err)
			continue
		}
		f.upper = fd
	}
}

// current is the descriptor the handle reads from now.
func (f *lowerFile) current() (int, bool) {
	f.node.mu.Lock()
	defer f.node.mu.Unlock()
	return f.upper, f.upper >= 0
}

func (f *lowerFile) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	fd, ok := f.current()
	if !ok {
		return f.lowerHandle.Read(ctx, dest, off)
	}
	n, err := unix.Pread(fd, dest, off)
	if err != nil {
		return nil, ToErrno(f.node.p.logger, err)
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (f *lowerFile) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	fd, ok := f.current()
	if !ok {
		return f.lowerHandle.Lseek(ctx, off, whence)
	}
	n, err := unix.Seek(fd, int64(off), int(whence))
	return uint64(n), ToErrno(f.node.p.logger, err)
}

func (f *lowerFile) Release(ctx context.Context) syscall.Errno {
	f.node.mu.Lock()
	delete(f.node.lowerFiles, f)
	upper := f.upper
	f.upper = -1
	f.node.mu.Unlock()
	if upper >= 0 {
		syscall.Close(upper)
	}
	return f.lowerHandle.Release(ctx)
}

// lowerFd is the descriptor of f, if it is a handle opened on a lower
// file: the copied-up file's once it has one.
func lowerFd(f gofs.FileHandle) (int, bool) {
	df, ok := f.(*daemonFile)
	if !ok {
		return 0, false
	}
	lf, ok := df.daemonHandle.(*lowerFile)
	if !ok {
		return 0, false
	}
	if fd, ok := lf.current(); ok {
		return fd, true
	}
	pf, ok := lf.lowerHandle.(gofs.FilePassthroughFder)
	if !ok {
		return 0, false
	}
	return pf.PassthroughFd()
}

// attrHandle is f unless it is a handle on a lower file, whose attributes
// are not the node's once it has been copied up.
func attrHandle(f gofs.FileHandle) gofs.FileHandle {
	if df, ok := f.(*daemonFile); ok {
		if _, lower := df.daemonHandle.(*lowerFile); lower {
			return nil
		}
	}
	return f
}

// daemonFile is an open file whose data the daemon serves: it hides the
// loopback file's passthrough fd, and counts itself in its node's
// daemonServed while open.
type daemonFile struct {
	daemonHandle
	node *Node
	// tracked is the handle's own file, counted in node.openFiles.
	tracked *gofs.LoopbackFile
}

func (n *Node) daemonFile(fh gofs.FileHandle) gofs.FileHandle {
	n.mu.Lock()
	n.daemonServed++
	n.mu.Unlock()
	return n.asDaemonFile(fh)
}

// asDaemonFile wraps fh, a handle the caller has counted in
// n.daemonServed, as a daemonFile.
func (n *Node) asDaemonFile(fh gofs.FileHandle) gofs.FileHandle {
	n.p.daemonOpens.Add(1)
	df := &daemonFile{daemonHandle: fh.(daemonHandle), node: n}
	switch h := fh.(type) {
	case *gofs.LoopbackFile:
		df.tracked = h
	case *killprivFile:
		df.tracked = h.LoopbackFile
	}
	if df.tracked != nil {
		n.trackFile(df.tracked)
	}
	return df
}

var _ = (gofs.FileReleaser)((*daemonFile)(nil))

func (f *daemonFile) Release(ctx context.Context) syscall.Errno {
	f.node.mu.Lock()
	f.node.daemonServed--
	f.node.mu.Unlock()
	if f.tracked != nil {
		f.node.untrackFile(f.tracked)
	}
	return f.daemonHandle.Release(ctx)
}

func (*lowerFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return 0, syscall.EBADF
}

// Getattr and Setattr are never called (see attrHandle); they exist to
// complete daemonHandle.
func (*lowerFile) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return syscall.ENOSYS
}

func (*lowerFile) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.ENOSYS
}

func (*lowerFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	return syscall.EBADF
}
