package volume

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// A volume directory's open handles. A plain directory is listed from its
// upper layer's fd (volDir, readdirplus batches ahead of the kernel), an
// overlay one from the merged listing (overlay.go), a layout directory as
// its layer's entries plus the layout children (listDir). A handle keeps
// answering fstat after its directory is renamed over or removed.

var _ = (gofs.NodeOpendirHandler)((*Node)(nil))

// OpendirHandle lists a layout directory as its layer's entries plus the
// layout children; any other directory is the loopback's own.
func (n *Node) OpendirHandle(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	switch {
	case n.task != nil:
		return n.layoutOpendir()
	case n.ovl != nil:
		return n.ovlOpendir()
	}
	return n.openDir()
}

// layoutOpendir lists a layout directory: the layout children it has, and
// the entries of its volume (merged with the host layer of a chroot).
func (n *Node) layoutOpendir() (gofs.FileHandle, uint32, syscall.Errno) {
	names, errno := n.task.Names()
	if errno != 0 {
		return nil, 0, errno
	}
	var entries []fuse.DirEntry
	for _, c := range names {
		entries = append(entries, fuse.DirEntry{Name: c, Mode: syscall.S_IFDIR})
	}
	if n.ovl != nil {
		merged, err := n.ovl.List(n.rel(), n.nodeLayers())
		if err != nil {
			return nil, 0, ToErrno(n.p.logger, err)
		}
		for _, e := range merged {
			if !n.reserved(e.Name) {
				entries = append(entries, fuse.DirEntry{Name: e.Name, Mode: e.Mode})
			}
		}
		return &listDir{plusBatch: plusBatch{node: n}, entries: WithDots(n.EmbeddedInode(), entries)}, 0, 0
	}
	fd, err := n.st.Open(0, n.rel(), syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, 0, ToErrno(n.p.logger, err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		syscall.Close(fd)
		return nil, 0, errno
	}
	defer ds.Close()
	for ds.HasNext() {
		e, errno := ds.Next()
		if errno != 0 {
			return nil, 0, errno
		}
		if !n.reserved(e.Name) {
			n.mapDirent(&e)
			// The offset of an entry of this list is its position
			// (listDir.Seekdir), not the backing directory's cookie.
			e.Off = 0
			entries = append(entries, e)
		}
	}
	return &listDir{plusBatch: plusBatch{node: n}, entries: entries}, 0, 0
}

// listDir is a directory handle over a fixed list of entries.
type listDir struct {
	plusBatch
	entries []fuse.DirEntry
	pos     int
	// fd is an O_PATH descriptor of an overlay directory in its topmost
	// layer (0 for none), registered in the node's openLists: once the
	// directory is removed or renamed over, fstat of this handle
	// answers from it, as an open directory of a local filesystem does.
	fd int
}

var _ = (gofs.FileReleasedirer)((*listDir)(nil))

// Releasedir forgets the handle's descriptor, if it has one.
func (l *listDir) Releasedir(ctx context.Context, flags uint32) {
	if l.fd <= 0 {
		return
	}
	l.node.mu.Lock()
	delete(l.node.openLists, l)
	l.node.mu.Unlock()
	syscall.Close(l.fd)
}

var _ = (gofs.FileReaddirenter)((*listDir)(nil))

func (l *listDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if l.first == nil {
		names := 0
		for _, e := range l.entries {
			if !isDots(e.Name) {
				names++
			}
		}
		l.started(ctx, names > PlusAttrsMax)
	}
	if l.pos >= len(l.entries) {
		return nil, 0
	}
	e := l.entries[l.pos]
	l.pos++
	return &e, 0
}

var _ = (gofs.FileSeekdirer)((*listDir)(nil))

func (l *listDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off > uint64(len(l.entries)) {
		return syscall.EINVAL
	}
	l.pos = int(off)
	if off == 0 {
		l.restart()
	}
	return 0
}

// dirStream is what go-fuse's loopback directory stream offers a handle.
type dirStream interface {
	gofs.FileReaddirenter
	gofs.FileSeekdirer
	gofs.FileReleasedirer
	gofs.FileFsyncdirer
}

// volDir is an open directory of a volume: go-fuse's loopback stream,
// plus the fd kept for attributes once the path no longer leads to it.
type volDir struct {
	dirStream
	plusBatch // and its node, the directory's
	fd        int
	// ahead holds the entries read from the stream before the kernel
	// asked for them, to learn whether the listing is large (plusBatch);
	// aheadErr is the error that ended that read, returned after them.
	ahead    []fuse.DirEntry
	aheadErr syscall.Errno
	// sought is set once the stream was rewound after the open, or
	// moved by the kernel: a btrfs directory descriptor lists only the
	// entries it had when it was opened, until it is rewound, and a
	// listing the kernel keeps (FOPEN_CACHE_DIR) must not miss a name
	// made between the OPENDIR and the first READDIR.
	sought bool
}

var _ = (gofs.FileReaddirenter)((*volDir)(nil))

// Readdirent gives each entry the inode number stat gives it.
func (d *volDir) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if !d.sought {
		d.sought = true
		if errno := d.dirStream.Seekdir(ctx, 0); errno != 0 {
			return nil, errno
		}
	}
	if d.first == nil {
		d.started(ctx, d.readAhead(ctx))
	}
	if len(d.ahead) > 0 {
		e := d.ahead[0]
		d.ahead = d.ahead[1:]
		return &e, 0
	}
	if errno := d.aheadErr; errno != 0 {
		d.aheadErr = 0
		return nil, errno
	}
	return d.next(ctx)
}

// readAhead reads entries into ahead until it has seen PlusAttrsMax+1
// names besides "." and "..", and reports whether there were that many.
func (d *volDir) readAhead(ctx context.Context) bool {
	for names := 0; names <= PlusAttrsMax; {
		e, errno := d.next(ctx)
		if errno != 0 {
			d.aheadErr = errno
			return false
		}
		if e == nil {
			return false
		}
		d.ahead = append(d.ahead, *e)
		if !isDots(e.Name) {
			names++
		}
	}
	return true
}

// next is the stream's next entry, with its inode number mapped.
func (d *volDir) next(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	e, errno := d.dirStream.Readdirent(ctx)
	if e != nil {
		d.node.mapDirent(e)
	}
	return e, errno
}

var _ = (gofs.FileSeekdirer)((*volDir)(nil))

// Seekdir drops what was read ahead: the stream moves to off.
func (d *volDir) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	d.ahead, d.aheadErr, d.sought = nil, 0, true
	if off == 0 {
		d.restart()
	}
	return d.dirStream.Seekdir(ctx, off)
}

// mapDirent gives a directory entry of the backing layer the inode number
// the mount shows for it: the backing one with the view's slot mixed in
// (the tree's identity.go), the node's own for "." and its parent's for "..", so
// that d_ino agrees with st_ino as on a local filesystem.
func (n *Node) mapDirent(e *fuse.DirEntry) {
	switch e.Name {
	case ".":
		e.Ino = n.StableAttr().Ino
	case "..":
		e.Ino = n.StableAttr().Ino
		if _, p := n.Parent(); p != nil {
			e.Ino = p.StableAttr().Ino
		}
	default:
		if e.Ino != 0 {
			e.Ino, _ = n.st.Salted(0, e.Ino)
			e.Ino ^= n.slot << ViewShift
		}
	}
}

// openDir opens the node's directory for listing.
func (n *Node) openDir() (gofs.FileHandle, uint32, syscall.Errno) {
	// Opened beneath the layer root, never through a symbolic link that
	// a task swapped in for one of the directories on the way.
	fd, err := n.st.Open(0, n.rel(), syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, 0, ToErrno(n.p.logger, err)
	}
	ds, errno := gofs.NewLoopbackDirStreamFd(fd)
	if errno != 0 {
		syscall.Close(fd)
		return nil, 0, errno
	}
	d := &volDir{dirStream: ds.(dirStream), plusBatch: plusBatch{node: n}, fd: fd}
	n.mu.Lock()
	if n.openDirs == nil {
		n.openDirs = make(map[*volDir]struct{})
	}
	n.openDirs[d] = struct{}{}
	n.mu.Unlock()
	// The kernel may keep the listing: every change to a volume's
	// directories passes through it (which drops the cached listing),
	// and allocfs's own changes replace whole volumes.
	return d, fuse.FOPEN_CACHE_DIR, 0
}

var _ = (gofs.FileReleasedirer)((*volDir)(nil))

// Releasedir forgets the handle, then closes the stream (and its fd).
func (d *volDir) Releasedir(ctx context.Context, flags uint32) {
	d.node.mu.Lock()
	delete(d.node.openDirs, d)
	d.node.mu.Unlock()
	d.dirStream.Releasedir(ctx, flags)
}

var _ = (gofs.FileFsyncdirer)((*listDir)(nil))

// Fsyncdir makes the directory's entries durable: its directory in the
// upper layer, where it has one, and the removals from a host layer,
// which live in a log of their own (layer.Removals).
func (l *listDir) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	n := l.node
	if n.ovl != nil {
		if err := n.ovl.SyncRemovals(); err != nil {
			return ToErrno(n.p.logger, err)
		}
	}
	if layers := n.nodeLayers(); len(layers) > 0 && layers[0] != 0 {
		return 0
	}
	fd, err := n.st.Open(0, n.rel(), syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return ToErrno(n.p.logger, err)
	}
	defer syscall.Close(fd)
	return gofs.ToErrno(syscall.Fsync(fd))
}
