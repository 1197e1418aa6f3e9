package volume

import (
	"context"
	"syscall"

	"github.com/allocfs/allocfs/fs/killpriv"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// killprivFile is an open set-id file: served by the daemon, never by
// passthrough, so that it can clear the bits before an unprivileged write
// (fs/killpriv says when).
type killprivFile struct {
	*gofs.LoopbackFile
	logger hclog.Logger
}

// fd returns the backing file's descriptor.
func (f *killprivFile) fd() int {
	fd, _ := f.LoopbackFile.PassthroughFd()
	return fd
}

var _ = (gofs.FileWriter)((*killprivFile)(nil))

func (f *killprivFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if killpriv.WriteKills(ctx) {
		if err := killpriv.Clear(ctx, f.fd()); err != nil {
			return 0, ToErrno(f.logger, err)
		}
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

// serveOpen chooses who serves fh, a new handle of the node's own file,
// and counts it, in one step under the node's lock: the kernel fails with
// EIO an open whose kind differs from the inode's other open handles, so
// two opens racing must not choose apart. The kernel serves it by
// passthrough unless handles served by the daemon are open, or the file
// carries set-id bits: the first unprivileged write must clear them, and
// only a write that reaches the daemon can. While a passthrough handle is
// open (the bits were set on an open file) the new handle joins it, and
// the bits stay until that file is closed and opened again. It returns
// the handle to give go-fuse and its open flags.
func (n *Node) serveOpen(fh gofs.FileHandle) (gofs.FileHandle, uint32) {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return n.p.wrapFile(fh), 0
	}
	setid := false
	if fd, _ := lf.PassthroughFd(); fd >= 0 {
		var st unix.Stat_t
		setid = unix.Fstat(fd, &st) == nil && killpriv.HasSetid(st.Mode)
	}
	return n.serveOpenMode(lf, setid)
}

// serveOpenMode is serveOpen of a handle whose file's set-id bits the
// caller knows (setid): a CREATE has just stat'ed the file it made.
func (n *Node) serveOpenMode(lf *gofs.LoopbackFile, setid bool) (gofs.FileHandle, uint32) {
	n.mu.Lock()
	on := n.p.passthrough.Load()
	daemon := n.daemonServed > 0 || setid && (n.passthroughOpen == 0 || !on)
	switch {
	case daemon:
		n.daemonServed++
	case on:
		n.passthroughOpen++
	}
	n.mu.Unlock()
	switch {
	case !daemon:
		return n.asPassthroughFile(lf, on), passthroughOpenFlags
	case setid:
		return n.asDaemonFile(&killprivFile{LoopbackFile: lf, logger: n.p.logger}), 0
	}
	return n.asDaemonFile(lf), 0
}

// clearBits clears the bits of kill that the node's file still has, after
// a change that may have cleared some (a chown as root clears S_ISUID),
// through the handle f when there is one (the file may have no name any
// more). It reports whether it cleared any.
func (n *Node) clearBits(f gofs.FileHandle, kill uint32) (bool, syscall.Errno) {
	if fd, ok := handleFd(f); ok {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return false, ToErrno(n.p.logger, err)
		}
		if st.Mode&kill == 0 {
			return false, 0
		}
		return true, ToErrno(n.p.logger, unix.Fchmod(fd, st.Mode&0o7777&^kill))
	}
	l, errno := n.at(0, "")
	if errno != 0 {
		return false, errno
	}
	defer l.Close()
	var st syscall.Stat_t
	if err := l.Lstat(&st); err != nil {
		return false, ToErrno(n.p.logger, err)
	}
	if st.Mode&kill == 0 {
		return false, 0
	}
	return true, ToErrno(n.p.logger, l.Chmod(st.Mode&0o7777&^kill))
}

// statNode stats the node's file, through f when there is a handle.
func (n *Node) statNode(f gofs.FileHandle, st *syscall.Stat_t) syscall.Errno {
	if fd, ok := handleFd(f); ok {
		return ToErrno(n.p.logger, syscall.Fstat(fd, st))
	}
	l, errno := n.at(0, "")
	if errno != 0 {
		return errno
	}
	defer l.Close()
	return ToErrno(n.p.logger, l.Lstat(st))
}

// handleFd is the backing descriptor of an open handle of the node's own
// file (not of a lower file), if f is one.
func handleFd(f gofs.FileHandle) (int, bool) {
	if df, ok := f.(*daemonFile); ok {
		if _, lower := df.daemonHandle.(*lowerFile); lower {
			return 0, false
		}
		f = df.daemonHandle
	}
	if pf, ok := f.(gofs.FilePassthroughFder); ok {
		return pf.PassthroughFd()
	}
	return 0, false
}

// releaseHandle closes a handle an operation opened and then failed.
func releaseHandle(ctx context.Context, fh gofs.FileHandle) {
	if r, ok := fh.(gofs.FileReleaser); ok {
		r.Release(ctx)
	}
}
