package volume

import (
	"context"
	"strings"
	"syscall"

	"github.com/allocfs/allocfs/fs/killpriv"
	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

var _ = (gofs.NodeGetattrer)((*Node)(nil))

// Getattr stats the node's path; a directory whose path is gone (renamed
// over, removed) while it is open answers from an open handle, as an
// unlinked but open directory does on a local filesystem.
func (n *Node) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.lowerOnly() {
		var st syscall.Stat_t
		if err := n.st.Lstat(n.shownLayer(), n.rel(), &st); err != nil {
			// Unlinked while open: the handle still has the file,
			// which a local filesystem shows with no links.
			fd, ok := lowerFd(f)
			if !ok {
				n.mu.Lock()
				fd, ok = n.heldFd, n.heldFd > 0
				n.mu.Unlock()
			}
			switch {
			case ok:
				if syscall.Fstat(fd, &st) != nil {
					return ToErrno(n.p.logger, err)
				}
			case !n.openDirStat(&st):
				// Not a directory removed or renamed over while open
				// either.
				return ToErrno(n.p.logger, err)
			}
			st.Nlink = 0
		}
		out.FromStat(&st)
		out.Ino = n.StableAttr().Ino
		n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
		return 0
	}
	var errno syscall.Errno
	if h, ok := attrHandle(f).(gofs.FileGetattrer); ok {
		errno = h.Getattr(ctx, out)
	} else {
		errno = n.backingGetattr(out)
	}
	if errno == 0 {
		n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
		n.shownCtime(&out.Attr)
		// The backing inode number; go-fuse would put the node's in
		// its place, logging each time it must.
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
	var st syscall.Stat_t
	if n.openDirStat(&st) {
		out.FromStat(&st)
		n.shownCtime(&out.Attr)
		out.Ino = n.StableAttr().Ino
		return 0
	}
	return errno
}

// openDirStat stats the directory through one of its open handles (a
// plain volume's volDir, an overlay's listDir), and reports whether one
// answered. The lock keeps a handle's descriptor from being closed, and
// its number reused, under the fstat.
func (n *Node) openDirStat(st *syscall.Stat_t) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for d := range n.openDirs {
		if syscall.Fstat(d.fd, st) == nil {
			return true
		}
	}
	for l := range n.openLists {
		if syscall.Fstat(l.fd, st) == nil {
			return true
		}
	}
	return false
}

var _ = (gofs.NodeSetattrer)((*Node)(nil))

// Setattr copies a lower entry up first: metadata changes are writes.
func (n *Node) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.ReadOnly() {
		return syscall.EROFS
	}
	if uid, ok := in.GetUID(); ok && n.task != nil && n.EmbeddedInode() == n.vroot {
		if errno := n.task.Chowned(n, uid); errno != 0 {
			return errno
		}
	}
	if n.hostUnchanged(in, out) {
		return 0
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
	var kill uint32
	if killpriv.SetattrMayKill(in) {
		var st syscall.Stat_t
		if errno := n.statNode(h, &st); errno != 0 {
			return errno
		}
		kill = killpriv.SetattrKills(ctx, in, &st)
	}
	if in.Valid&killpriv.SetattrChanges == 0 {
		// Nothing but the change time: chown(f, -1, -1), or the
		// kernel's file_remove_privs (fs/killpriv). A local filesystem
		// still stamps ctime and clears set-id bits; a chown that
		// changes nothing does the same to the backing file, as root,
		// and clearBits then clears what root's chown keeps and the
		// caller's does not.
		var err error
		if fd, ok := handleFd(h); ok {
			err = unix.Fchown(fd, -1, -1)
		} else if l, errno := n.at(0, ""); errno != 0 {
			return errno
		} else {
			err = l.Chown(-1, -1)
			l.Close()
		}
		if err != nil {
			return ToErrno(n.p.logger, err)
		}
	}
	if errno := n.backingSetattr(ctx, h, in, out); errno != 0 {
		return errno
	}
	killed := false
	if kill != 0 {
		var errno syscall.Errno
		if killed, errno = n.clearBits(h, kill); errno != 0 {
			return errno
		}
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

var _ = (gofs.NodeReadlinker)((*Node)(nil))

func (n *Node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	l, errno := n.shown()
	if errno != 0 {
		return nil, errno
	}
	defer l.Close()
	target, err := l.Readlink()
	if err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	return []byte(target), 0
}

// shown names the node's entry in the layer it is shown from.
func (n *Node) shown() (layer.Loc, syscall.Errno) {
	i := 0
	if n.lowerOnly() {
		i = n.shownLayer()
	}
	return n.at(i, "")
}

var _ = (gofs.NodeGetxattrer)((*Node)(nil))

func (n *Node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	l, errno := n.shown()
	if errno != 0 {
		return 0, errno
	}
	defer l.Close()
	sz, err := l.Getxattr(layer.StoredXattr(attr), dest)
	return uint32(sz), ToErrno(n.p.logger, err)
}

var _ = (gofs.NodeSetxattrer)((*Node)(nil))

func (n *Node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return n.changeUpper(func(l layer.Loc) error { return l.Setxattr(layer.StoredXattr(attr), data, int(flags)) })
}

// changeUpper makes change to the node's entry in the upper layer,
// copying it up first: every change is a write.
func (n *Node) changeUpper(change func(l layer.Loc) error) syscall.Errno {
	if n.ReadOnly() {
		return syscall.EROFS
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	l, errno := n.at(0, "")
	if errno != 0 {
		return errno
	}
	defer l.Close()
	return ToErrno(n.p.logger, change(l))
}

var _ = (gofs.NodeRemovexattrer)((*Node)(nil))

func (n *Node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return n.changeUpper(func(l layer.Loc) error { return l.Removexattr(layer.StoredXattr(attr)) })
}

var _ = (gofs.NodeListxattrer)((*Node)(nil))

// Listxattr lists what the task set, never the layer format's own marks
// (see xattr.go).
func (n *Node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	l, errno := n.shown()
	if errno != 0 {
		return 0, errno
	}
	defer l.Close()
	// The kernel lists trusted.* to CAP_SYS_ADMIN only; the daemon,
	// which has it, answers for a caller that may not.
	checked, admin := false, false
	sz, err := layer.ListShownXattrs(l, dest, func(name string) bool {
		if !strings.HasPrefix(name, "trusted.") {
			return false
		}
		if !checked {
			checked, admin = true, killpriv.HasCap(ctx, killpriv.CapSysAdmin)
		}
		return !admin
	})
	if err != nil {
		return 0, ToErrno(n.p.logger, err)
	}
	return sz, 0
}

var _ = (gofs.NodeStatxer)((*Node)(nil))

func (n *Node) Statx(ctx context.Context, f gofs.FileHandle, flags uint32, mask uint32, out *fuse.StatxOut) syscall.Errno {
	if n.lowerOnly() {
		l, errno := n.shown()
		if errno != 0 {
			return errno
		}
		defer l.Close()
		var st unix.Statx_t
		if err := l.Statx(int(flags), int(mask), &st); err != nil {
			return ToErrno(n.p.logger, err)
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
	l, errno := n.at(0, "")
	if errno != 0 {
		return errno
	}
	defer l.Close()
	var st unix.Statx_t
	if err := l.Statx(int(flags), int(mask), &st); err != nil {
		return ToErrno(n.p.logger, err)
	}
	out.FromStatx(&st)
	n.shownStatxCtime(out)
	n.finishStatx(out)
	return 0
}

// finishStatx gives a statx reply what GETATTR's gets: a merged
// directory's link count, and the node's inode number.
func (n *Node) finishStatx(out *fuse.StatxOut) {
	if out.Mask&unix.STATX_NLINK != 0 {
		attr := fuse.Attr{Mode: uint32(out.Mode), Nlink: out.Nlink}
		n.mergedNlink(n.rel(), n.nodeLayers(), &attr)
		out.Nlink = attr.Nlink
	}
	out.Ino = n.StableAttr().Ino
}

// hostUnchanged reports whether SETATTR in would change nothing of the
// node, an entry shown from the host layer of a chroot: a chmod to its
// mode, a chown to its owner. Nomad's chroot build gives every directory
// it re-creates its host counterpart's owner, once for each level below
// it; copied up, each would cost a directory in the task's layer and a
// round of copy-up work, for a change only the change time would show. So
// such a change is answered from the host entry as it is, its ctime
// included (the tree's chroot.go), filled into out.
func (n *Node) hostUnchanged(in *fuse.SetAttrIn, out *fuse.AttrOut) bool {
	if n.ovl == nil || n.ovl.Host == nil || in.Valid&^(fuse.FATTR_MODE|fuse.FATTR_UID|fuse.FATTR_GID|fuse.FATTR_FH|fuse.FATTR_LOCKOWNER|fuse.FATTR_KILL_SUIDGID) != 0 {
		return false
	}
	if !n.lowerOnly() || !n.ovl.IsHost(n.shownLayer()) {
		return false
	}
	var st syscall.Stat_t
	if err := n.ovl.Lstat(n.shownLayer(), n.rel(), &st); err != nil {
		return false
	}
	if mode, ok := in.GetMode(); ok && mode&0o7777 != st.Mode&0o7777 {
		return false
	}
	if uid, ok := in.GetUID(); ok && uid != st.Uid {
		return false
	}
	if gid, ok := in.GetGID(); ok && gid != st.Gid {
		return false
	}
	// A chown that kills: the set-id bits it would clear must be
	// there to clear.
	if in.Valid&fuse.FATTR_KILL_SUIDGID != 0 && st.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0 {
		return false
	}
	out.FromStat(&st)
	out.Ino = n.StableAttr().Ino
	n.mergedNlink(n.rel(), n.nodeLayers(), &out.Attr)
	return true
}
