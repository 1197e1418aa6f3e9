package volume

import (
	"context"
	"strconv"
	"strings"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Files unlinked while open are found again by a daemon that takes the
// connection over through their records (restart.Unlinked): written
// before the last name goes, read by a lookup of restart.UnlinkedName in
// the volume root, removed when the kernel forgets the node.

// recordUnlinked records the handle of name in the directory n, before it
// is unlinked or replaced, when its file is open here: its node outlives
// the name, and a daemon that takes the connection over finds it only
// through the record.
func (n *Node) recordUnlinked(name string) {
	if !n.p.recordUnlinked.Load() {
		return
	}
	ch := n.GetChild(name)
	if ch == nil || ch.StableAttr().Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	c, ok := ch.Operations().(*Node)
	if !ok || c.lowerOnly() {
		return
	}
	c.mu.Lock()
	open := len(c.openFiles) > 0
	c.mu.Unlock()
	if !open {
		return
	}
	l, errno := n.at(0, name)
	if errno != 0 {
		return
	}
	defer l.Close()
	h, _, err := unix.NameToHandleAt(l.Dir, l.Name, 0)
	if err != nil {
		n.p.logger.Debug("no handle for a file unlinked while open: a takeover will not find it", "error", err)
		return
	}
	rec := restart.UnlinkedRecord{Root: n.vroot.Path(nil), Type: h.Type(), Handle: h.Bytes()}
	if err := n.p.unlinked.Save(ch.StableAttr().Ino, rec); err != nil {
		n.p.logger.Warn("failed to record a file unlinked while open: a daemon taking over will not find it", "error", err)
		return
	}
	c.mu.Lock()
	c.recorded = true
	c.mu.Unlock()
}

// lookupUnlinked serves the lookup of restart.UnlinkedName(id) in the volume root
// n: the recorded file, opened by its handle, if it is still the node's.
func (n *Node) lookupUnlinked(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	id, err := strconv.ParseUint(strings.TrimPrefix(name, restart.UnlinkedPrefix), 16, 64)
	if err != nil || n.EmbeddedInode() != n.vroot {
		return nil, syscall.ENOENT
	}
	rec, ok := n.p.unlinked.Load(id)
	if !ok || rec.Root != n.vroot.Path(nil) {
		return nil, syscall.ENOENT
	}
	// open_by_handle_at wants a descriptor of the filesystem that is not
	// an O_PATH one.
	mfd, err := n.st.Open(0, "", unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(rec.Type, rec.Handle), unix.O_PATH|unix.O_CLOEXEC)
	unix.Close(mfd)
	if err != nil {
		return nil, syscall.ENOENT
	}
	var x unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &x); err != nil || saltedIno(n.st, x.Ino)^n.slot<<ViewShift != id || x.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, syscall.ENOENT
	}
	st := statFromStatx(&x)
	gen := uint64(1)
	if x.Mask&unix.STATX_BTIME != 0 {
		gen = uint64(x.Btime.Sec)<<30 | uint64(x.Btime.Nsec)
	}
	out.Attr.FromStat(&st)
	out.Attr.Ino = id
	child := n.newChild([]int{0})
	child.heldFd = fd
	child.recorded = true
	return n.NewInode(ctx, child, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: id, Gen: gen}), 0
}

// dropUnlinkedRecord removes the record of a node the kernel forgot.
func (n *Node) dropUnlinkedRecord() {
	n.p.unlinked.Remove(n.StableAttr().Ino)
}

// saltedIno is the inode number the upper layer of stack shows for its
// backing inode ino.
func saltedIno(stack *layer.Stack, ino uint64) uint64 {
	salted, _ := stack.Salted(0, ino)
	return salted
}
