package fs

import (
	"context"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Set-id bits, as a local filesystem keeps them.
//
// Two things stand between a task and the mode bits it asked for. The
// daemon makes each entry as root and then chowns it to the caller, which
// clears set-id bits as any chown by root does; so a new entry asked for
// with set-id or sticky bits gets its requested mode again afterwards
// (restoreMode). The kernel has already applied the umask and stripped
// what the caller may not set.
//
// And a write by someone without CAP_FSETID must clear a file's set-id
// bits (the "killpriv" rule: S_ISUID always, S_ISGID when group-executable),
// so that an owner cannot plant code that runs with the privileges the
// bits would still grant. With HANDLE_KILLPRIV_V2 the kernel leaves that
// to the server, and with passthrough the write never reaches the server
// and lands on the backing file as root, which keeps the bits. So a file
// with such bits is opened without passthrough (killprivFile) and the
// daemon clears them before the first write, fallocate or truncate of an
// unprivileged caller, as ext4 does.

// modeSpecial are the mode bits beyond the permissions.
const modeSpecial = syscall.S_ISUID | syscall.S_ISGID | syscall.S_ISVTX

// killBits returns the bits a write by an unprivileged caller clears from
// a regular file's mode: S_ISUID, and S_ISGID only with S_IXGRP (without
// it, S_ISGID marks mandatory locking, not privilege).
func killBits(mode uint32) uint32 {
	if mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0
	}
	var kill uint32
	if mode&syscall.S_ISUID != 0 {
		kill |= syscall.S_ISUID
	}
	if mode&(syscall.S_ISGID|syscall.S_IXGRP) == syscall.S_ISGID|syscall.S_IXGRP {
		kill |= syscall.S_ISGID
	}
	return kill
}

// restoreMode gives the new entry at l, whose lstat is st, the
// permission, set-id and sticky bits of want, keeping a set-gid bit the
// directory inherited from its parent, and updates st to what is on disk.
// Symbolic links have no mode of their own.
func restoreMode(l layer.Loc, st *syscall.Stat_t, want uint32) error {
	if want&modeSpecial == 0 || st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		return nil
	}
	mode := want & 0o7777
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		mode |= st.Mode & syscall.S_ISGID
	}
	if st.Mode&0o7777 == mode {
		return nil
	}
	if err := l.Chmod(mode); err != nil {
		return err
	}
	return l.Lstat(st)
}

// killprivFile is an open set-id file: served by the daemon, never by
// passthrough, so that it can clear the bits before an unprivileged write.
type killprivFile struct {
	*gofs.LoopbackFile
	logger hclog.Logger
}

// fd returns the backing file's descriptor.
func (f *killprivFile) fd() int {
	fd, _ := f.LoopbackFile.PassthroughFd()
	return fd
}

// kill clears the set-id bits the caller's change must clear, if any.
func (f *killprivFile) kill(ctx context.Context) syscall.Errno {
	return killPrivFd(ctx, f.logger, f.fd())
}

// killPrivFd clears, through fd, the set-id bits that a change by the
// caller of ctx must clear: none if the caller has CAP_FSETID.
func killPrivFd(ctx context.Context, logger hclog.Logger, fd int) syscall.Errno {
	_, errno := clearKillBits(logger, fd, func() bool { return !callerHasCap(ctx, capFsetid) })
	return errno
}

// clearKillBits clears, through fd, the bits killBits names, if any and
// if must says so (asked only when there are some: it may read /proc).
// It reports whether it cleared any.
func clearKillBits(logger hclog.Logger, fd int, must func() bool) (bool, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, toErrno(logger, err)
	}
	kill := killBits(st.Mode)
	if kill == 0 || !must() {
		return false, 0
	}
	return true, toErrno(logger, unix.Fchmod(fd, st.Mode&0o7777&^kill))
}

var _ = (gofs.FileWriter)((*killprivFile)(nil))

func (f *killprivFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.kill(ctx); errno != 0 {
		return 0, errno
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

var _ = (gofs.FileAllocater)((*killprivFile)(nil))

func (f *killprivFile) Allocate(ctx context.Context, off uint64, size uint64, mode uint32) syscall.Errno {
	if errno := f.kill(ctx); errno != 0 {
		return errno
	}
	return f.LoopbackFile.Allocate(ctx, off, size, mode)
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
func (n *volNode) serveOpen(fh gofs.FileHandle) (gofs.FileHandle, uint32) {
	lf, ok := fh.(*gofs.LoopbackFile)
	if !ok {
		return n.m.wrapFile(fh), 0
	}
	setid := false
	if fd, _ := lf.PassthroughFd(); fd >= 0 {
		var st unix.Stat_t
		setid = unix.Fstat(fd, &st) == nil && killBits(st.Mode) != 0
	}
	n.mu.Lock()
	on := n.m.passthrough.Load()
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
		return n.asDaemonFile(&killprivFile{LoopbackFile: lf, logger: n.m.logger}), 0
	}
	return n.asDaemonFile(lf), 0
}

// killprivSetattr clears set-id bits when the kernel says a size change by
// an unprivileged caller must (FATTR_KILL_SUIDGID), after the change,
// through the handle f when there is one (the file may have no name any
// more). It reports whether it cleared any.
func (n *volNode) killprivSetattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn) (bool, syscall.Errno) {
	if in.Valid&fuse.FATTR_MODE != 0 {
		// The same request sets the mode: a chmod wins over the rule.
		return false, 0
	}
	if in.Valid&fuse.FATTR_KILL_SUIDGID == 0 && !(in.Valid&fuse.FATTR_SIZE != 0 && !callerHasCap(ctx, capFsetid)) {
		return false, 0
	}
	if fd, ok := handleFd(f); ok {
		return clearKillBits(n.m.logger, fd, func() bool { return true })
	}
	l, errno := n.at(0, "")
	if errno != 0 {
		return false, errno
	}
	defer l.Close()
	var st syscall.Stat_t
	if err := l.Lstat(&st); err != nil {
		return false, toErrno(n.m.logger, err)
	}
	kill := killBits(st.Mode)
	if kill == 0 {
		return false, 0
	}
	return true, toErrno(n.m.logger, l.Chmod(st.Mode&0o7777&^kill))
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
