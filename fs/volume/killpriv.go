package volume

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
// And a change of a file's data by someone without CAP_FSETID must clear
// its set-id bits (the "killpriv" rule: S_ISUID always, S_ISGID when
// group-executable), so that an owner cannot plant code that runs with
// the privileges the bits would still grant. With HANDLE_KILLPRIV_V2 the
// kernel leaves that to the server and says when, per request, as the
// VFS decides it for a local filesystem:
//
//   - a WRITE carries FUSE_WRITE_KILL_SUIDGID when its writer lacks
//     CAP_FSETID; the writeback of a shared mapping (msync, munmap, the
//     flusher) never does: a local filesystem keeps the bits when data
//     arrives through a mapping, whoever wrote it;
//   - a SETATTR that changes the size carries FATTR_KILL_SUIDGID on the
//     same terms, and one that changes the owner always;
//   - before a write, fallocate or copy_file_range by a caller without
//     CAP_FSETID, the kernel's own file_remove_privs sends a SETATTR that
//     changes nothing, which the daemon applies as a chown to -1:-1
//     (volattr.go): on the backing file that clears the same bits.
//
// With passthrough a write never reaches the server and lands on the
// backing file as root, which keeps the bits; the SETATTR before it is
// what clears them. A file that has such bits when it is opened is served
// by the daemon all the same (killprivFile), which follows each WRITE's
// flag, so that no write by an unprivileged caller can pass a file whose
// bits the kernel's cached mode does not show yet.

// modeSpecial are the mode bits beyond the permissions.
const modeSpecial = syscall.S_ISUID | syscall.S_ISGID | syscall.S_ISVTX

// hasSetid reports whether a regular file of mode carries a bit a change
// of its data may have to clear.
func hasSetid(mode uint32) bool {
	return mode&syscall.S_IFMT == syscall.S_IFREG && mode&(syscall.S_ISUID|syscall.S_ISGID) != 0
}

// killFor returns the set-id bits a change by the caller of ctx clears
// from a non-directory of mode and group gid, as the VFS decides it
// (setattr_should_drop_suidgid): S_ISUID, and S_ISGID when the file is
// group-executable or when the caller is neither in the file's group nor
// holds CAP_FSETID. The kernel has decided already that the change kills
// at all (its caller lacks CAP_FSETID, or it is a chown, which kills
// whoever makes it). It reads /proc only for a set-gid file that is not
// group-executable, of a group not the caller's own.
func killFor(ctx context.Context, mode, gid uint32) uint32 {
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		return 0
	}
	kill := mode & syscall.S_ISUID
	if mode&syscall.S_ISGID != 0 && (mode&syscall.S_IXGRP != 0 || !callerInGroupOrFsetid(ctx, gid)) {
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
// go-fuse's bridge hands a FileWriter the request's caller and its cancel
// channel and nothing else of the request, so KillFlags, right above the
// bridge, gives a WRITE that asks for the kill killWrite as its context's
// Done channel (writeKills).
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
	if writeKills(ctx) {
		if errno := killFd(ctx, f.logger, f.fd()); errno != 0 {
			return 0, errno
		}
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

// killFd clears, through fd, the set-id bits a change by the caller of
// ctx clears (killFor).
func killFd(ctx context.Context, logger hclog.Logger, fd int) syscall.Errno {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return ToErrno(logger, err)
	}
	kill := killFor(ctx, st.Mode, st.Gid)
	if kill == 0 {
		return 0
	}
	return ToErrno(logger, unix.Fchmod(fd, st.Mode&0o7777&^kill))
}

// killWrite is the Done channel of the context of a WRITE whose writer
// lacks CAP_FSETID (FUSE_WRITE_KILL_SUIDGID). It is never closed: such a
// write cannot be interrupted, which for a write to a local file changes
// nothing (the loopback file ignores its context).
var killWrite = make(chan struct{})

// writeKills reports whether the WRITE of ctx asks for the kill.
func writeKills(ctx context.Context) bool { return ctx.Done() == killWrite }

// KillFlags, wrapped round the bridge, passes each WRITE's FUSE_WRITE_KILL_SUIDGID on to its handle
// (killWrite).
type KillFlags struct{ fuse.RawFileSystem }

func (k KillFlags) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		cancel = killWrite
	}
	return k.RawFileSystem.Write(cancel, in, data)
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
		setid = unix.Fstat(fd, &st) == nil && hasSetid(st.Mode)
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

// setattrKills returns the set-id bits a SETATTR must clear after its
// change, decided on the file's mode and group before it (st): when the
// kernel asks (FATTR_KILL_SUIDGID: a size change by an unprivileged
// caller, a change of owner), and when the request changes nothing, which
// is what the kernel's file_remove_privs sends before a write, fallocate
// or copy_file_range of an unprivileged caller, and what a chown to -1:-1
// is. A chmod in the same request wins over the rule.
func setattrKills(ctx context.Context, in *fuse.SetAttrIn, st *syscall.Stat_t) uint32 {
	if !setattrMayKill(in) {
		return 0
	}
	return killFor(ctx, st.Mode, st.Gid)
}

// setattrMayKill reports whether a SETATTR is one setattrKills decides
// for.
func setattrMayKill(in *fuse.SetAttrIn) bool {
	return in.Valid&fuse.FATTR_MODE == 0 && (in.Valid&fuse.FATTR_KILL_SUIDGID != 0 || in.Valid&setattrChanges == 0)
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
