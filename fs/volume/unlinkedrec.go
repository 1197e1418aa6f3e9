package volume

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A file unlinked while a task holds it open has no path: a daemon that
// takes the connection over cannot find it by walking, and the kernel
// still names its node (an fstat, a setattr, an inherited handle opened
// again). So when a name whose file this daemon has open goes, the file's
// handle (name_to_handle_at) is recorded first, in
// <data-dir>/fuse/unlinked/<node ID in hex>:
//
//	{"root": "a1/web/secrets", "type": 1, "handle": "<base64>"}
//
// root is the volume root the file was in, as a path of the mount. A
// daemon that does not know the node looks up the name unlinkedName(id)
// in that root: no name from the kernel holds a NUL, so only the
// takeover asks it, and the lookup opens the file by its handle and
// serves the node from that descriptor (heldFd), as holdSpecial does for
// a FIFO. The record goes when the kernel forgets the node.

// unlinkedRecord is one record of unlinked/.
type unlinkedRecord struct {
	Root   string `json:"root"`
	Type   int32  `json:"type"`
	Handle []byte `json:"handle"`
}

func (p *Plane) unlinkedPath(id uint64) string {
	return restart.StateFile(p.dataDir, filepath.Join("unlinked", strconv.FormatUint(id, 16)))
}

// unlinkedPrefix starts the name unlinkedName gives an unlinked node.
const unlinkedPrefix = "\x00unlinked:"

func unlinkedName(id uint64) string { return unlinkedPrefix + strconv.FormatUint(id, 16) }

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
	rec := unlinkedRecord{Root: n.vroot.Path(nil), Type: h.Type(), Handle: h.Bytes()}
	b, err := json.Marshal(rec)
	if err == nil {
		err = restart.WriteReplace(n.p.unlinkedPath(ch.StableAttr().Ino), b)
	}
	if err != nil {
		n.p.logger.Warn("failed to record a file unlinked while open: a daemon taking over will not find it", "error", err)
		return
	}
	c.mu.Lock()
	c.recorded = true
	c.mu.Unlock()
}

// UnlinkedPaths are where the node id, unlinked while open, may be found
// by lookup, from its record; nil for none.
func (p *Plane) UnlinkedPaths(id uint64) [][]string {
	b, err := os.ReadFile(p.unlinkedPath(id))
	if err != nil {
		return nil
	}
	var rec unlinkedRecord
	if json.Unmarshal(b, &rec) != nil || rec.Root == "" {
		return nil
	}
	return [][]string{append(strings.Split(rec.Root, "/"), unlinkedName(id))}
}

// lookupUnlinked serves the lookup of unlinkedName(id) in the volume root
// n: the recorded file, opened by its handle, if it is still the node's.
func (n *Node) lookupUnlinked(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	id, err := strconv.ParseUint(strings.TrimPrefix(name, unlinkedPrefix), 16, 64)
	if err != nil || n.EmbeddedInode() != n.vroot {
		return nil, syscall.ENOENT
	}
	b, err := os.ReadFile(n.p.unlinkedPath(id))
	if err != nil {
		return nil, syscall.ENOENT
	}
	var rec unlinkedRecord
	if json.Unmarshal(b, &rec) != nil || rec.Root != n.vroot.Path(nil) {
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
	os.Remove(n.p.unlinkedPath(n.StableAttr().Ino))
}

// UnnameUnlinked takes the name a takeover found an unlinked node by out
// of go-fuse's tree (below root) once the node is registered: the node has no name,
// and its path must lead nowhere, so that only what it holds answers.
func UnnameUnlinked(root *gofs.Inode, path []string) {
	if len(path) == 0 || !strings.HasPrefix(path[len(path)-1], unlinkedPrefix) {
		return
	}
	dir := root
	for _, name := range path[:len(path)-1] {
		if dir = dir.GetChild(name); dir == nil {
			return
		}
	}
	dir.RmChild(path[len(path)-1])
}

// saltedIno is the inode number the upper layer of stack shows for its
// backing inode ino.
func saltedIno(stack *layer.Stack, ino uint64) uint64 {
	salted, _ := stack.Salted(0, ino)
	return salted
}
