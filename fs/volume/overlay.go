package volume

import (
	"context"
	"path/filepath"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The nodes of a volume with lower layers (a snapshot-migrated one). The
// layer format itself, and every change to a stack of layers, is package
// layer's; these methods keep the nodes the kernel holds in step with it:
// where each is visible (Node.layers), and its identity across a
// copy-up.

// nodeLayers returns where the node is visible; for a node of a volume
// without lowers, the upper layer.
func (n *Node) nodeLayers() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.layers
}

// lowerOnly reports whether the node's entry is shown from a lower layer:
// it has not been copied up. A copy-up made for another node (a
// directory copied up for an entry in it, another name of a hard-linked
// file) shows here the first time the node is asked.
func (n *Node) lowerOnly() bool {
	if n.ovl == nil {
		return false
	}
	l := n.nodeLayers()
	if len(l) == 0 || l[0] == 0 {
		return false
	}
	var st syscall.Stat_t
	if n.ovl.Lstat(0, n.rel(), &st) != nil || layer.IsWhiteout(&st) || st.Mode&syscall.S_IFMT != n.StableAttr().Mode {
		return true
	}
	n.markUpper(layer.IsDir(&st))
	return false
}

// markUpper records that the node's entry is in the upper layer now; a
// directory keeps merging with the lowers it was visible in.
func (n *Node) markUpper(dir bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.markUpperLocked(dir)
}

func (n *Node) markUpperLocked(dir bool) {
	if len(n.layers) > 0 && n.layers[0] == 0 {
		return
	}
	if dir {
		n.layers = append([]int{0}, n.layers...)
	} else {
		n.layers = []int{0}
	}
	n.repointLocked()
}

// openShown opens the node's entry in the layer it is shown from, never
// following a symbolic link on the way: a task that swaps a directory for
// a link to /etc between lookup and open gets an error, not /etc.
func (n *Node) openShown(flags int) (int, error) {
	return n.st.Open(n.shownLayer(), n.rel(), flags)
}

// ovlLookup finds name in a directory of an overlay volume. An entry
// copied up from a lower layer keeps the identity it had there (its
// origin's inode number), so that a task's open files, its hard links
// and st_ino stay what they were before the copy-up.
func (n *Node) ovlLookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	n.lowerOnly() // brings a copy-up of the directory to the node's layers
	layers, st, err := n.ovl.Visible(filepath.Join(n.rel(), name), n.nodeLayers())
	if err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	ino := n.p.host.Identity(n.ovl, layers[0], filepath.Join(n.rel(), name), &st)
	if layers[0] == 0 {
		l, errno := n.at(0, name)
		if errno != 0 {
			return nil, errno
		}
		origin, ok := layer.Origin(l)
		l.Close()
		if !ok {
			// Made in the upper layer: the node gets the identity
			// (inode number and generation) its creation gave it, so
			// an open file and its name stay one inode for the kernel.
			ch, errno := n.lookupUpper(ctx, name, out)
			if errno != 0 {
				return nil, errno
			}
			if c, ok := ch.Operations().(*Node); ok {
				c.mu.Lock()
				c.layers = layers
				c.mu.Unlock()
				c.mergedNlink(filepath.Join(n.rel(), name), layers, &out.Attr)
			}
			return ch, 0
		}
		ino = origin
	}
	out.Attr.FromStat(&st)
	if layers[0] == 0 {
		n.shownCtime(&out.Attr)
	}
	ino ^= n.slot << ViewShift
	out.Attr.Ino = ino
	child := n.newChild(layers)
	ch := n.NewInode(ctx, child, gofs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: ino})
	if c, ok := ch.Operations().(*Node); ok {
		if c != child && layers[0] == 0 {
			// The node the kernel already holds for the lower entry.
			c.markUpper(layer.IsDir(&st))
		}
		c.mergedNlink(filepath.Join(n.rel(), name), layers, &out.Attr)
	}
	return ch, 0
}

// ovlOpendir lists a directory of an overlay volume.
func (n *Node) ovlOpendir() (gofs.FileHandle, uint32, syscall.Errno) {
	n.lowerOnly()
	entries, err := n.ovl.List(n.rel(), n.nodeLayers())
	if err != nil {
		return nil, 0, ToErrno(n.p.logger, err)
	}
	list := make([]fuse.DirEntry, len(entries))
	for i, e := range entries {
		list[i] = fuse.DirEntry{Name: e.Name, Mode: e.Mode}
	}
	d := &listDir{plusBatch: plusBatch{node: n}, entries: WithDots(n.EmbeddedInode(), list)}
	// The directory in its topmost layer, for fstat once its name is
	// gone; without it (an open that failed) the listing still works.
	if layers := n.nodeLayers(); len(layers) > 0 {
		if fd, err := n.st.Open(layers[0], n.rel(), unix.O_PATH|unix.O_DIRECTORY); err == nil {
			d.fd = fd
			n.mu.Lock()
			if n.openLists == nil {
				n.openLists = make(map[*listDir]struct{})
			}
			n.openLists[d] = struct{}{}
			n.mu.Unlock()
		}
	}
	return d, 0, 0
}

// copyUp makes the node's entry exist in the upper layer, copying it
// (and its parents) from the lower layer it is shown from (see
// layer.Stack.CopyUp).
func (n *Node) copyUp() syscall.Errno {
	if !n.lowerOnly() {
		return 0
	}
	if _, parent := n.Parent(); parent != nil {
		if p, ok := parent.Operations().(*Node); ok && p.ovl == n.ovl {
			if errno := p.copyUp(); errno != 0 {
				return errno
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.layers) > 0 && n.layers[0] == 0 {
		return 0 // copied up while we waited
	}
	rel := n.rel()
	if err := n.ovl.CopyUp(rel, n.layers[0]); err != nil {
		n.p.logger.Error("copy-up failed", "from", n.ovl.Path(n.layers[0], rel), "to", n.ovl.Path(0, rel), "error", err)
		return ToErrno(n.p.logger, err)
	}
	n.markUpperLocked(n.StableAttr().Mode == syscall.S_IFDIR)
	return 0
}

// copyUpTree copies a directory up with everything its lowers show in
// it, and makes it opaque: after a rename it no longer sits over the same
// lower paths, so it must not merge with anything below. Live child nodes
// are told their entries are in the upper layer now.
func (n *Node) copyUpTree() syscall.Errno {
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	layers := n.nodeLayers()
	rel := n.rel()
	if len(layers) <= 1 {
		if n.StableAttr().Mode != syscall.S_IFDIR {
			return 0
		}
		// Nothing below to bring along, but the lower layers may hold
		// something at the path it is about to move to.
		if err := n.ovl.MarkOpaque(rel); err != nil {
			return ToErrno(n.p.logger, err)
		}
		return 0
	}
	if err := n.ovl.Materialize(rel, layers); err != nil {
		n.p.logger.Error("copy-up of a directory tree failed", "path", rel, "error", err)
		return ToErrno(n.p.logger, err)
	}
	n.mu.Lock()
	n.layers = []int{0}
	n.mu.Unlock()
	var reset func(in *gofs.Inode)
	reset = func(in *gofs.Inode) {
		for _, ch := range in.Children() {
			if c, ok := ch.Operations().(*Node); ok && c.ovl == n.ovl {
				c.mu.Lock()
				c.layers = []int{0}
				c.mu.Unlock()
				reset(ch)
			}
		}
	}
	reset(n.EmbeddedInode())
	return 0
}

// inLowers reports whether name in the directory n is visible from a
// lower layer, so that removing or renaming it needs a whiteout.
func (n *Node) inLowers(name string) bool {
	return n.ovl.InLowers(filepath.Join(n.rel(), name), n.nodeLayers())
}

// whiteout hides name of the directory n (copied up) in the lower layers.
func (n *Node) whiteout(name string) syscall.Errno {
	return ToErrno(n.p.logger, n.ovl.Whiteout(filepath.Join(n.rel(), name)))
}

// prepareCreate readies the directory n of an overlay volume for a new
// entry at name: the directory is copied up and a whiteout there is
// removed. It reports whether the name hid something in a lower layer.
func (n *Node) prepareCreate(name string) (bool, syscall.Errno) {
	if errno := n.copyUp(); errno != 0 {
		return false, errno
	}
	hidden, err := n.ovl.ClearWhiteout(filepath.Join(n.rel(), name))
	if err != nil {
		return false, ToErrno(n.p.logger, err)
	}
	return hidden || n.inLowers(name), 0
}

// copyUpLinked copies up the lower file at name of the directory n when
// it has other names: removing or replacing one name must leave the
// others one file with one link fewer, which only the upper layer can
// show. It returns where name is visible afterwards.
func (n *Node) copyUpLinked(name string, layers []int, st *syscall.Stat_t) ([]int, syscall.Errno) {
	if layers[0] == 0 || st.Mode&syscall.S_IFMT != syscall.S_IFREG || st.Nlink < 2 {
		return layers, 0
	}
	rel := filepath.Join(n.rel(), name)
	if err := n.ovl.CopyUp(rel, layers[0]); err != nil {
		n.p.logger.Error("copy-up of a hard-linked file failed", "path", rel, "error", err)
		return nil, ToErrno(n.p.logger, err)
	}
	if ch := n.GetChild(name); ch != nil {
		if c, ok := ch.Operations().(*Node); ok {
			c.markUpper(false)
		}
	}
	return []int{0}, 0
}

// ovlLink links the file t under name in the directory n of the same
// overlay volume: t is copied up first (with every other name it has),
// and the new name is the same node, so that the kernel's inode for t
// shows the new link count.
func (n *Node) ovlLink(t *Node, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if errno := t.copyUp(); errno != 0 {
		return nil, errno
	}
	if _, errno := n.prepareCreate(name); errno != 0 {
		return nil, errno
	}
	to, errno := n.backingLink(t, name)
	if errno != 0 {
		return nil, errno
	}
	defer to.Close()
	var st syscall.Stat_t
	if err := to.Lstat(&st); err != nil {
		return nil, ToErrno(n.p.logger, err)
	}
	out.Attr.FromStat(&st)
	n.shownCtime(&out.Attr)
	return t.EmbeddedInode(), 0
}

// removeEntry deletes name from the directory n of an overlay volume:
// from the upper layer if it is there, and with a whiteout if a lower
// layer shows it too. rmdir refuses a directory whose merged view is not
// empty.
func (n *Node) removeEntry(name string, dir bool) syscall.Errno {
	rel := filepath.Join(n.rel(), name)
	n.lowerOnly()
	layers, st, err := n.ovl.Visible(rel, n.nodeLayers())
	if err != nil {
		return ToErrno(n.p.logger, err)
	}
	if dir != layer.IsDir(&st) {
		if dir {
			return syscall.ENOTDIR
		}
		return syscall.EISDIR
	}
	if dir {
		entries, err := n.ovl.List(rel, layers)
		if err != nil {
			return ToErrno(n.p.logger, err)
		}
		if len(entries) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	if (len(layers) == 1 && n.ovl.HostRemovals(layers[0]) != nil) || (layers[0] == 0 && n.ovl.HostOnly(rel, n.nodeLayers())) {
		return n.removeFromHost(name, layers, dir)
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	lower := n.inLowers(name)
	layers, errno := n.copyUpLinked(name, layers, &st)
	if errno != 0 {
		return errno
	}
	nlink := n.nlinkBefore()
	if layers[0] == 0 {
		if dir {
			// Only whiteouts can be left in a merged-empty directory.
			if err := n.ovl.ClearDir(rel); err != nil {
				return ToErrno(n.p.logger, err)
			}
		}
		if errno := n.backingUnlink(name, dir); errno != 0 {
			return errno
		}
	}
	if lower {
		if errno := n.whiteout(name); errno != 0 {
			return errno
		}
	}
	delta := 0
	if dir {
		delta = -1
	}
	n.nlinkAfter(nlink, delta)
	return 0
}

// removeFromHost removes name, which no lower layer but the host layer
// shows, from the directory n: its upper part, if it has one, goes from
// the upper layer, and the host layer records its removal (a write to
// its log, layer.Removals) instead of a whiteout, so that a chroot's
// removal copies up no directory and makes no inode for each host entry
// it removes. The record comes first: a crash between the two leaves an
// upper directory holding only whiteouts, which shows empty, never the
// host's entries again. The other names of a host file keep the host's
// link count, as they do across a copy-up.
func (n *Node) removeFromHost(name string, layers []int, dir bool) syscall.Errno {
	rel := filepath.Join(n.rel(), name)
	nlink := n.nlinkBefore()
	if err := n.ovl.RemoveFromHost(rel); err != nil {
		return ToErrno(n.p.logger, err)
	}
	if layers[0] == 0 {
		if dir {
			if err := n.ovl.ClearDir(rel); err != nil {
				return ToErrno(n.p.logger, err)
			}
		}
		if errno := n.backingUnlink(name, dir); errno != 0 {
			return errno
		}
	}
	delta := 0
	if dir {
		delta = -1
	}
	n.nlinkAfter(nlink, delta)
	return 0
}

// ovlRename renames within an overlay volume: the source is copied up
// (a directory with everything its lowers show, and made opaque), the
// target directory is copied up, the rename happens in the upper layer,
// and the old name is whited out if a lower layer still shows it.
func (n *Node) ovlRename(ctx context.Context, name string, dst *Node, newName string, flags uint32) syscall.Errno {
	child := n.GetChild(name)
	if child == nil {
		var out fuse.EntryOut
		var errno syscall.Errno
		if child, errno = n.ovlLookup(ctx, name, &out); errno != 0 {
			return errno
		}
	}
	src, ok := child.Operations().(*Node)
	if !ok {
		return syscall.EXDEV
	}
	if errno := dst.checkRename(src, newName, flags); errno != 0 {
		return errno
	}
	if dst == n && newName == name {
		return 0 // renamed onto itself: nothing to do, as rename(2) says
	}
	if errno := src.copyUpTree(); errno != 0 {
		return errno
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		other := dst.GetChild(newName)
		if other == nil {
			var out fuse.EntryOut
			var errno syscall.Errno
			if other, errno = dst.ovlLookup(ctx, newName, &out); errno != 0 {
				return errno
			}
		}
		if o, ok := other.Operations().(*Node); ok {
			if errno := o.copyUpTree(); errno != 0 {
				return errno
			}
		}
		return n.backingRename(name, dst, newName, flags)
	}
	if errno := dst.copyUp(); errno != 0 {
		return errno
	}
	// A target that a lower layer shows: a directory must be empty in
	// the merged view, and whatever is replaced is hidden by the renamed
	// entry (a directory is opaque after copyUpTree).
	target := filepath.Join(dst.rel(), newName)
	if layers, st, err := dst.ovl.Visible(target, dst.nodeLayers()); err == nil {
		if layer.IsDir(&st) {
			entries, err := dst.ovl.List(target, layers)
			if err != nil {
				return ToErrno(n.p.logger, err)
			}
			if len(entries) > 0 {
				return syscall.ENOTEMPTY
			}
			if layers[0] == 0 {
				if err := dst.ovl.ClearDir(target); err != nil {
					return ToErrno(n.p.logger, err)
				}
			}
		} else if _, errno := dst.copyUpLinked(newName, layers, &st); errno != 0 {
			return errno
		}
	}
	if _, err := dst.ovl.ClearWhiteout(target); err != nil {
		return ToErrno(n.p.logger, err)
	}
	oldLower := n.inLowers(name)
	if errno := n.backingRename(name, dst, newName, flags); errno != 0 {
		return errno
	}
	if flags&unix.RENAME_WHITEOUT != 0 {
		// The device the rename left is the task's, and hides what a
		// lower layer holds under the name as any entry would.
		return n.markRealDevice(name)
	}
	if oldLower {
		return n.whiteout(name)
	}
	return 0
}

// markRealDevice records that the character device 0/0 at name, in the
// upper layer, is a task's own (layer.RealDeviceXattr): a device made by
// mknod, or left by a rename with RENAME_WHITEOUT, in any volume, since
// every volume's upper layer may be stacked under another one later.
func (n *Node) markRealDevice(name string) syscall.Errno {
	l, errno := n.at(0, name)
	if errno != 0 {
		return errno
	}
	defer l.Close()
	if err := layer.MarkRealDevice(l); err != nil {
		n.p.logger.Error("could not mark a task's device 0/0 as its own", "path", l.String(), "error", err)
		return ToErrno(n.p.logger, err)
	}
	return 0
}

// checkRename answers, before anything is copied up, every error a rename
// of src onto newName in this directory can get from the target, with
// ext4's errnos: a failing rename must change nothing.
func (n *Node) checkRename(src *Node, newName string, flags uint32) syscall.Errno {
	rel := filepath.Join(n.rel(), newName)
	n.lowerOnly()
	layers, st, err := n.ovl.Visible(rel, n.nodeLayers())
	exists := err == nil
	if err != nil && err != syscall.ENOENT {
		return ToErrno(n.p.logger, err)
	}
	switch {
	case flags&unix.RENAME_NOREPLACE != 0 && exists:
		return syscall.EEXIST
	case flags&unix.RENAME_EXCHANGE != 0 && !exists:
		return syscall.ENOENT
	case flags&unix.RENAME_EXCHANGE != 0 || !exists:
		return 0
	}
	srcDir := src.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR
	switch {
	case srcDir && !layer.IsDir(&st):
		return syscall.ENOTDIR
	case !srcDir && layer.IsDir(&st):
		return syscall.EISDIR
	case srcDir && src.EmbeddedInode() != n.GetChild(newName):
		entries, err := n.ovl.List(rel, layers)
		if err != nil {
			return ToErrno(n.p.logger, err)
		}
		if len(entries) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	return 0
}
