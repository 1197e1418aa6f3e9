package killpriv

import (
	"context"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// ModeSpecial are the mode bits beyond the permissions.
const ModeSpecial = syscall.S_ISUID | syscall.S_ISGID | syscall.S_ISVTX

// HasSetid reports whether a regular file of mode carries a bit a change
// of its data may have to clear.
func HasSetid(mode uint32) bool {
	return mode&syscall.S_IFMT == syscall.S_IFREG && mode&(syscall.S_ISUID|syscall.S_ISGID) != 0
}

// Bits returns the set-id bits a change by the caller of ctx clears
// from a non-directory of mode and group gid, as the VFS decides it
// (setattr_should_drop_suidgid): S_ISUID, and S_ISGID when the file is
// group-executable or when the caller is neither in the file's group nor
// holds CAP_FSETID. The kernel has decided already that the change kills
// at all (its caller lacks CAP_FSETID, or it is a chown, which kills
// whoever makes it). It reads /proc only for a set-gid file that is not
// group-executable, of a group not the caller's own.
func Bits(ctx context.Context, mode, gid uint32) uint32 {
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		return 0
	}
	kill := mode & syscall.S_ISUID
	if mode&syscall.S_ISGID != 0 && (mode&syscall.S_IXGRP != 0 || !inGroupOrFsetid(ctx, gid)) {
		kill |= syscall.S_ISGID
	}
	return kill
}

// RestoreMode gives the new entry at l, whose lstat is st, the
// permission, set-id and sticky bits of want, keeping a set-gid bit the
// directory inherited from its parent, and updates st to what is on disk.
// Symbolic links have no mode of their own.
func RestoreMode(l layer.Loc, st *syscall.Stat_t, want uint32) error {
	if want&ModeSpecial == 0 || st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
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

// Clear clears, through fd, the set-id bits a change by the caller of
// ctx clears (Bits).
func Clear(ctx context.Context, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	kill := Bits(ctx, st.Mode, st.Gid)
	if kill == 0 {
		return nil
	}
	return unix.Fchmod(fd, st.Mode&0o7777&^kill)
}

// killWrite is the Done channel of the context of a WRITE whose writer
// lacks CAP_FSETID (FUSE_WRITE_KILL_SUIDGID). It is never closed: such a
// write cannot be interrupted, which for a write to a local file changes
// nothing (the loopback file ignores its context).
var killWrite = make(chan struct{})

// WriteKills reports whether the WRITE of ctx asks for the kill.
func WriteKills(ctx context.Context) bool { return ctx.Done() == killWrite }

// Flags, wrapped round go-fuse's bridge, passes each WRITE's
// FUSE_WRITE_KILL_SUIDGID on to its handle: the bridge hands a
// FileWriter the request's caller and its cancel channel and nothing
// else of the request, so a WRITE that asks for the kill gets killWrite
// as its context's Done channel (WriteKills).
//
// A WRITE reaches the bridge by either of two methods: allocfs's own
// loop calls Write, go-fuse's server calls Writev (and Write only when
// Writev answers ENOSYS). Both carry the flag; a method left to the
// embedded bridge would drop it, and an unprivileged write would keep
// the bits.
type Flags struct{ fuse.RawFileSystem }

func (k Flags) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	return k.RawFileSystem.Write(writeCancel(cancel, in), in, data)
}

func (k Flags) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	return k.RawFileSystem.Writev(writeCancel(cancel, in), in, data)
}

// writeCancel is the cancel channel the bridge is to see for the WRITE
// in: killWrite when it asks for the kill.
func writeCancel(cancel <-chan struct{}, in *fuse.WriteIn) <-chan struct{} {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		return killWrite
	}
	return cancel
}

// SetattrChanges are the SETATTR fields that change something besides
// the change time.
const SetattrChanges = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_SIZE |
	fuse.FATTR_ATIME | fuse.FATTR_MTIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW

// SetattrKills returns the set-id bits a SETATTR must clear after its
// change, decided on the file's mode and group before it (st): when the
// kernel asks (FATTR_KILL_SUIDGID: a size change by an unprivileged
// caller, a change of owner), and when the request changes nothing, which
// is what the kernel's file_remove_privs sends before a write, fallocate
// or copy_file_range of an unprivileged caller, and what a chown to -1:-1
// is. A chmod in the same request wins over the rule.
func SetattrKills(ctx context.Context, in *fuse.SetAttrIn, st *syscall.Stat_t) uint32 {
	if !SetattrMayKill(in) {
		return 0
	}
	return Bits(ctx, st.Mode, st.Gid)
}

// SetattrMayKill reports whether a SETATTR is one SetattrKills decides
// for.
func SetattrMayKill(in *fuse.SetAttrIn) bool {
	return in.Valid&fuse.FATTR_MODE == 0 && (in.Valid&fuse.FATTR_KILL_SUIDGID != 0 || in.Valid&SetattrChanges == 0)
}
