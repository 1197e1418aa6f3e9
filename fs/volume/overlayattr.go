package volume

import (
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// What an overlay directory shows of itself: the link count of its merged
// listing, and change times that hide copy-ups.

// mergedNlink gives attr, the attributes of the directory rel visible in
// layers, the link count a local filesystem shows: 2 and one for each
// subdirectory of its merged listing (each backing directory counts only
// its own, and a host layer's counts the entries a task removed from it).
// The count is kept until the upper directory changes, or a removal from
// the host layer is recorded in it; lower layers never change.
func (n *Node) mergedNlink(rel string, layers []int, attr *fuse.Attr) {
	if n.ovl == nil || !n.merges(layers) || attr.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return
	}
	if len(layers) == 1 && n.ovl.HostRemovals(layers[0]).Changes(rel) == 0 {
		return // the host's own count holds
	}
	var st syscall.Stat_t
	if n.ovl.Lstat(layers[0], rel, &st) != nil {
		return
	}
	if st.Nlink == 1 {
		// The backing filesystem counts no subdirectories in a
		// directory's links (btrfs: always 1); neither does the mount.
		return
	}
	key := nlinkKey{st.Mtim, st.Ctim, st.Ino, layers[0], len(layers), n.ovl.HostRemovals(layers[len(layers)-1]).Changes(rel)}
	n.mu.Lock()
	cached := n.nlink
	n.mu.Unlock()
	if cached != nil && cached.key == key {
		attr.Nlink = cached.count
		return
	}
	entries, err := n.ovl.List(rel, layers)
	if err != nil {
		return // the backing count, rather than a failed stat
	}
	count := uint32(2)
	for _, e := range entries {
		if e.Mode == syscall.S_IFDIR {
			count++
		}
	}
	attr.Nlink = count
	n.mu.Lock()
	n.nlink = &mergedCount{key: key, count: count}
	n.mu.Unlock()
}

// shownCtime gives attr, filled from the upper layer's entry (attr.Ino
// still the backing inode number), the change time a task sees: allocfs's
// own changes (copy-ups) do not show (layer.Ctimes).
func (n *Node) shownCtime(attr *fuse.Attr) {
	if n.ovl == nil {
		return
	}
	st := syscall.Stat_t{Ino: attr.Ino, Ctim: syscall.Timespec{Sec: int64(attr.Ctime), Nsec: int64(attr.Ctimensec)}}
	c := n.ovl.Ctimes.Shown(&st)
	attr.Ctime, attr.Ctimensec = uint64(c.Sec), uint32(c.Nsec)
}

// shownStatxCtime is shownCtime for a statx reply.
func (n *Node) shownStatxCtime(out *fuse.StatxOut) {
	if n.ovl == nil || out.Mask&unix.STATX_CTIME == 0 {
		return
	}
	st := syscall.Stat_t{Ino: out.Ino, Ctim: syscall.Timespec{Sec: int64(out.Ctime.Sec), Nsec: int64(out.Ctime.Nsec)}}
	c := n.ovl.Ctimes.Shown(&st)
	out.Ctime.Sec, out.Ctime.Nsec = uint64(c.Sec), uint32(c.Nsec)
}

// nlinkKey says which state of a merged directory a count is for: the
// directory it is shown from, with its times, and the layers merged.
type nlinkKey struct {
	mtime, ctime syscall.Timespec
	ino          uint64
	// shown is the layer the directory is shown from, merged is how many
	// layers merge into it.
	shown, merged int
	// removals counts the removals a host layer below recorded in it.
	removals uint64
}

// merges reports whether a directory visible in layers shows a count of
// its own (mergedNlink): it merges layers, or it is a host layer's, whose
// entries a task may have removed without a change to its backing
// directory.
func (n *Node) merges(layers []int) bool {
	return len(layers) >= 2 || (len(layers) == 1 && n.ovl.HostRemovals(layers[0]) != nil)
}

type mergedCount struct {
	key   nlinkKey
	count uint32
}

// nlinkBefore returns the directory's cached merged link count if it
// still holds (its key is the upper directory's state now), before a
// change of the directory's own that nlinkAfter carries it over. A task
// removing a directory of n entries would otherwise have it listed again
// at every GETATTR between the removals, each listing stat'ing every
// whiteout the removals left: n² stats (minutes, for Nomad's removal of
// a chroot's /usr).
func (n *Node) nlinkBefore() *mergedCount {
	n.mu.Lock()
	cached, layers := n.nlink, n.layers
	n.mu.Unlock()
	if cached == nil || !n.merges(layers) || cached.key.shown != layers[0] || cached.key.merged != len(layers) {
		return nil
	}
	var st syscall.Stat_t
	rel := n.rel()
	if n.ovl.Lstat(layers[0], rel, &st) != nil || (nlinkKey{st.Mtim, st.Ctim, st.Ino, layers[0], len(layers), n.ovl.HostRemovals(layers[len(layers)-1]).Changes(rel)}) != cached.key {
		return nil
	}
	return cached
}

// nlinkAfter moves the count nlinkBefore returned over the change just
// made, which took delta links from the directory (a subdirectory
// removed: -1; anything else: 0). The kernel holds the directory's lock
// across the request, so no other change through the mount falls
// between the two.
func (n *Node) nlinkAfter(before *mergedCount, delta int) {
	if before == nil {
		return
	}
	var st syscall.Stat_t
	rel := n.rel()
	if n.ovl.Lstat(before.key.shown, rel, &st) != nil {
		return
	}
	n.mu.Lock()
	layers := n.layers
	n.mu.Unlock()
	if len(layers) != before.key.merged {
		return
	}
	key := nlinkKey{st.Mtim, st.Ctim, st.Ino, before.key.shown, before.key.merged, n.ovl.HostRemovals(layers[len(layers)-1]).Changes(rel)}
	n.mu.Lock()
	if n.nlink == before && len(n.layers) == before.key.merged && n.layers[0] == before.key.shown {
		n.nlink = &mergedCount{key: key, count: uint32(int(before.count) + delta)}
	}
	n.mu.Unlock()
}
