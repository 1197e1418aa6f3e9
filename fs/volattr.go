package fs

import (
	"context"
	"os"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var _ = (gofs.NodeGetattrer)((*volNode)(nil))

// Getattr stats the node's path; a directory whose path is gone (renamed
// over, removed) while it is open answers from an open handle, as an
// unlinked but open directory does on a local filesystem.
func (n *volNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.lowerOnly() {
		var st syscall.Stat_t
		if err := syscall.Lstat(n.shownPath(), &st); err != nil {
			// Unlinked while open: the handle still has the file,
			// which a local filesystem shows with no links.
			fd, ok := lowerFd(f)
			if !ok {
				n.mu.Lock()
				fd, ok = n.heldFd, n.heldFd > 0
				n.mu.Unlock()
			}
			if !ok || syscall.Fstat(fd, &st) != nil {
				return toErrno(n.m.logger, err)
			}
			st.Nlink = 0
		}
		out.FromStat(&st)
		out.Ino = n.StableAttr().Ino
		n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
		return 0
	}
	errno := n.LoopbackNode.Getattr(ctx, attrHandle(f), out)
	if errno == 0 {
		n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
		n.shownCtime(&out.Attr)
		// The loopback fills in the backing inode number; go-fuse
		// puts the node's in its place, logging each time it must.
		out.Ino = n.StableAttr().Ino
	}
	if errno != syscall.ENOENT {
		return errno
	}
	n.mu.Lock()
	held := n.heldFd
	n.mu.Unlock()
	if held > 0 {
		var st syscall.Stat_t
		if syscall.Fstat(held, &st) == nil {
			out.FromStat(&st)
			out.Ino = n.StableAttr().Ino
			return 0
		}
	}
	if h := n.openFile(); h != nil {
		// Unlinked while open.
		if errno := h.(gofs.FileGetattrer).Getattr(ctx, out); errno == 0 {
			n.shownCtime(&out.Attr)
			out.Ino = n.StableAttr().Ino
			return 0
		}
	}
	if fd, ok := lowerFd(f); ok {
		// Copied up, then unlinked while open.
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			out.FromStat(&st)
			n.shownCtime(&out.Attr)
			out.Ino = n.StableAttr().Ino
			return 0
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for d := range n.openDirs {
		var st syscall.Stat_t
		if err := syscall.Fstat(d.fd, &st); err != nil {
			continue
		}
		out.FromStat(&st)
		n.shownCtime(&out.Attr)
		out.Ino = n.StableAttr().Ino
		return 0
	}
	return errno
}

var _ = (gofs.NodeSetattrer)((*volNode)(nil))

// setattrChanges are the SETATTR fields that change something besides the
// change time.
const setattrChanges = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_SIZE |
	fuse.FATTR_ATIME | fuse.FATTR_MTIME | fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW

// Setattr copies a lower entry up first: metadata changes are writes.
func (n *volNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	h := attrHandle(f)
	// Whether the node's name is gone matters for a copy-up and for a
	// change that came without a handle; a plain volume's change through
	// a handle needs neither, and no lstat.
	leads := h != nil && n.ovl == nil || n.pathLeads()
	if leads {
		if errno := n.copyUp(); errno != 0 {
			return errno
		}
	}
	if h == nil && !leads {
		// fchmod, fchown and futimens come without a handle: a file
		// unlinked while open is changed through one of its handles,
		// a FIFO, socket or device through what holdSpecial kept.
		if h = n.openFile(); h == nil {
			n.mu.Lock()
			held := n.heldFd
			n.mu.Unlock()
			if held > 0 {
				return n.setattrHeld(held, in, out)
			}
			h = n.copyUpUnlinked()
		}
	}
	if in.Valid&setattrChanges == 0 {
		// Nothing but the change time: chown(f, -1, -1), say. A local
		// filesystem still stamps ctime (and clears set-id bits, which
		// the kernel sends as a mode change when there are any); a
		// chown that changes nothing does the same to the backing file.
		var err error
		if fd, ok := handleFd(h); ok {
			err = unix.Fchown(fd, -1, -1)
		} else {
			err = unix.Lchown(n.backingPath(), -1, -1)
		}
		if err != nil {
			return toErrno(n.m.logger, err)
		}
	}
	if errno := n.LoopbackNode.Setattr(ctx, h, in, out); errno != 0 {
		return errno
	}
	killed, errno := n.killprivSetattr(ctx, h, in)
	if errno != 0 {
		return errno
	}
	if killed {
		// The mode lost its set-id bits since out was filled.
		return n.Getattr(ctx, attrHandle(f), out)
	}
	n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
	n.shownCtime(&out.Attr)
	out.Ino = n.StableAttr().Ino
	return 0
}

var _ = (gofs.NodeReadlinker)((*volNode)(nil))

func (n *volNode) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	if n.lowerOnly() {
		target, err := os.Readlink(n.shownPath())
		if err != nil {
			return nil, toErrno(n.m.logger, err)
		}
		return []byte(target), 0
	}
	return n.LoopbackNode.Readlink(ctx)
}

var _ = (gofs.NodeGetxattrer)((*volNode)(nil))

func (n *volNode) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	p := n.backingPath()
	if n.lowerOnly() {
		p = n.shownPath()
	}
	sz, err := unix.Lgetxattr(p, layer.StoredXattr(attr), dest)
	return uint32(sz), toErrno(n.m.logger, err)
}

var _ = (gofs.NodeSetxattrer)((*volNode)(nil))

func (n *volNode) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Setxattr(ctx, layer.StoredXattr(attr), data, flags)
}

var _ = (gofs.NodeRemovexattrer)((*volNode)(nil))

func (n *volNode) Removexattr(ctx context.Context, attr string) syscall.Errno {
	if n.ro {
		return syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	return n.LoopbackNode.Removexattr(ctx, layer.StoredXattr(attr))
}

var _ = (gofs.NodeListxattrer)((*volNode)(nil))

// Listxattr lists what the task set, never the layer format's own marks
// (see xattr.go).
func (n *volNode) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p := n.backingPath()
	if n.lowerOnly() {
		p = n.shownPath()
	}
	sz, err := layer.ListShownXattrs(p, dest)
	if err != nil {
		return 0, toErrno(n.m.logger, err)
	}
	return sz, 0
}

var _ = (gofs.NodeStatxer)((*volNode)(nil))

func (n *volNode) Statx(ctx context.Context, f gofs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if n.lowerOnly() {
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, n.shownPath(), int(flags)|unix.AT_SYMLINK_NOFOLLOW, int(mask), &st); err != nil {
			return toErrno(n.m.logger, err)
		}
		out.FromStatx(&st)
		n.finishStatx(out)
		return 0
	}
	if h, ok := attrHandle(f).(gofs.FileStatxer); ok {
		errno := h.Statx(ctx, flags, mask, out)
		if errno == 0 {
			n.shownStatxCtime(out)
			n.finishStatx(out)
		}
		return errno
	}
	// By path: the node is the entry itself, so a final symbolic link
	// (swapped in by a task, say) is never followed.
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, n.backingPath(), int(flags)|unix.AT_SYMLINK_NOFOLLOW, int(mask), &st); err != nil {
		return toErrno(n.m.logger, err)
	}
	out.FromStatx(&st)
	n.shownStatxCtime(out)
	n.finishStatx(out)
	return 0
}

// finishStatx gives a statx reply what GETATTR's gets: a merged
// directory's link count, and the node's inode number.
func (n *volNode) finishStatx(out *fuse.StatxOut) {
	if out.Mask&unix.STATX_NLINK != 0 {
		attr := fuse.Attr{Mode: uint32(out.Mode), Nlink: out.Nlink}
		n.mergedNlink(n.rel(), n.nodeLayers(), &attr)
		out.Nlink = attr.Nlink
	}
	out.Ino = n.StableAttr().Ino
}
