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

// holdSpecial keeps, before name in the directory n is unlinked or
// replaced, an O_PATH descriptor of its backing entry when it is a FIFO,
// socket or device the kernel holds a node for: a process may have it
// open, and the kernel serves that open itself without telling the
// daemon, so only this descriptor can answer fstat once the name is gone
// (with no links, as a local filesystem shows). It is closed when the
// kernel forgets the node.
func (n *Node) holdSpecial(name string) {
	ch := n.GetChild(name)
	if ch == nil {
		return
	}
	c, ok := ch.Operations().(*Node)
	if !ok {
		return
	}
	switch c.StableAttr().Mode & syscall.S_IFMT {
	case syscall.S_IFIFO, syscall.S_IFSOCK, syscall.S_IFCHR, syscall.S_IFBLK:
	default:
		return
	}
	i := 0
	if c.lowerOnly() {
		i = c.shownLayer()
	}
	l, errno := n.at(i, name)
	if errno != 0 {
		return
	}
	fd, err := l.Open(unix.O_PATH, 0)
	l.Close()
	if err != nil {
		return
	}
	c.mu.Lock()
	old := c.heldFd
	c.heldFd = fd
	c.mu.Unlock()
	if old > 0 {
		unix.Close(old)
	}
}

// setattrHeld changes the unlinked special file held by fd (an O_PATH
// descriptor, reached through /proc/self/fd, which follows it) as SETATTR
// asks, and answers its attributes.
func (n *Node) setattrHeld(fd int, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	p := fmt.Sprintf("/proc/self/fd/%d", fd)
	var err error
	if mode, ok := in.GetMode(); ok {
		err = syscall.Chmod(p, mode&07777)
	}
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if err == nil && (uok || gok || in.Valid&killpriv.SetattrChanges == 0) {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		err = syscall.Chown(p, u, g)
	}
	if ts, ok := setattrTimes(in); ok && err == nil {
		err = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0)
	}
	if err != nil {
		return ToErrno(n.p.logger, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return ToErrno(n.p.logger, err)
	}
	out.FromStat(&st)
	out.Ino = n.StableAttr().Ino
	return 0
}

// copyUpUnlinked returns a handle for a change through the open lower
// handles of a file whose last name is gone: on the copy they read, when
// the file was copied up before its name went (the copy is the file
// then), or else on a copy of the lower file into an unnamed upper file
// (layer.Stack.CopyAnonymous) that they read from then on. It returns nil
// when the node has no open lower handle.
func (n *Node) copyUpUnlinked() gofs.FileHandle {
	if n.ovl == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	src, tfd := -1, -1
	for f := range n.lowerFiles {
		if f.upper >= 0 {
			// The handles read an unlinked copy: reopen it for writing
			// through /proc, which reaches a file without a name.
			fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", f.upper), unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				n.p.logger.Error("could not reopen the copy of an open file whose name is gone", "error", err)
				return nil
			}
			tfd = fd
			break
		}
		if pf, ok := f.lowerHandle.(gofs.FilePassthroughFder); ok && src < 0 {
			if fd, ok := pf.PassthroughFd(); ok {
				src = fd
			}
		}
	}
	if tfd < 0 {
		if src < 0 {
			return nil
		}
		var err error
		if tfd, err = n.ovl.CopyAnonymous(src); err != nil {
			n.p.logger.Error("could not copy up an open lower file whose name is gone", "error", err)
			return nil
		}
	}
	for f := range n.lowerFiles {
		if f.upper < 0 {
			if fd, err := unix.Dup(tfd); err == nil {
				f.upper = fd
			}
		}
	}
	lf := gofs.NewLoopbackFile(tfd).(*gofs.LoopbackFile)
	if n.openFiles == nil {
		n.openFiles = make(map[*gofs.LoopbackFile]struct{})
	}
	n.openFiles[lf] = struct{}{}
	n.orphan = lf
	return lf
}

var _ = (gofs.NodeOnForgetter)((*Node)(nil))

// OnForget closes what holdSpecial and copyUpUnlinked kept, and drops
// the record of a file unlinked while open.
func (n *Node) OnForget() {
	n.mu.Lock()
	fd := n.heldFd
	n.heldFd = 0
	orphan := n.orphan
	n.orphan = nil
	if orphan != nil {
		delete(n.openFiles, orphan)
	}
	recorded := n.recorded
	n.recorded = false
	n.mu.Unlock()
	if recorded {
		n.dropUnlinkedRecord()
	}
	if fd > 0 {
		unix.Close(fd)
	}
	if orphan != nil {
		orphan.Release(context.Background())
	}
}

// pathLeads reports whether the node's path still names an entry, in
// the layer the node is shown from.
func (n *Node) pathLeads() bool {
	l, errno := n.shown()
	if errno != 0 {
		return false
	}
	defer l.Close()
	var st syscall.Stat_t
	return l.Lstat(&st) == nil
}
