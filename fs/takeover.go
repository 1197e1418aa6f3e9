package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/volume"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"
)

// Taking a connection over. A daemon that adopts the /dev/fuse file of
// another (AdoptMount; fs/transport/session.go) inherits the kernel's
// view of the mount: node IDs, each with a lookup count, and open file
// handles, all handed out by a process that is gone. allocfs makes both
// resolvable:
//
//   - A node's ID is its inode number (go-fuse's ExternalNodeID), which
//     says where its file is: a skeleton directory's is a hash of its
//     place in the layout; a volume entry's is the backing file's inode
//     number with the slot of the allocation's view in its high bits
//     (identity.go), and the slot table is kept on disk. pathsOfNode
//     turns the number back into a path (the backing inode is opened by
//     handle, and its path read back through /proc/self/fd); a file born
//     after this daemon started only took a freed number, and is not it.
//   - A handle's number carries the generation of the daemon that opened
//     it in its high 32 bits; a handle of an earlier generation is opened
//     again on first use, or needs nothing (a release, a flush).
//
// go-fuse's bridge has no way to ask whether it knows a node ID: it
// panics on one it does not, before it changes anything.
// restart.TakeoverFS, in front of it, catches exactly that panic, has
// pathsOfNode say where the node may be, looks the path's names up through
// the bridge from the root (so that each node on the way is registered and
// attached where it is), and runs the request again. What else the next
// daemon needs (the session, the outcomes of namespace requests, the
// passthrough backing IDs, the records of files unlinked while open) is
// package restart's too; the slot table (identity.go) and the memory
// volumes' table (memvol.go) are the tree's, kept in the same directory
// (restart.StateFile).

// dropTakeoverState removes what the mount kept for a daemon taking it
// over, once the connection has ended.
func (m *Mount) dropTakeoverState() error {
	var err error
	if m.backingIDs != nil {
		err = m.backingIDs.Close()
	}
	if m.outcomes != nil {
		err = errors.Join(err, m.outcomes.Close())
	}
	if m.opts.GoFuseServer || m.opts.Debug {
		return err
	}
	return errors.Join(err, restart.RemoveState(m.store.DataDir()))
}

// FuseFd returns the mount's /dev/fuse descriptor, for a holder to keep
// a copy of (it stays the mount's), and false for go-fuse's server,
// whose connection cannot be taken over.
func (m *Mount) FuseFd() (int, bool) {
	s, ok := m.server.(ownServer)
	if !ok {
		return -1, false
	}
	return s.conn.Fd(), true
}

// ConnectionEnded reports whether the kernel ended the mount's
// connection (an unmount, an abort); false for go-fuse's server, which
// does not say.
func (m *Mount) ConnectionEnded() bool {
	s, ok := m.server.(ownServer)
	return ok && s.conn.Ended()
}

// PassthroughLost reports whether passthrough was negotiated and file
// data went through the daemon all the same (Passthrough says neither).
func (m *Mount) PassthroughLost() bool { return m.vol.PassthroughLost() }

// Park stops serving for a hand-over (transport.Conn.Park): what the
// kernel sends from now on waits for the next daemon. The process must
// exit after it, without unmounting.
func (m *Mount) Park(timeout time.Duration) error {
	s, ok := m.server.(ownServer)
	if !ok {
		return errors.New("go-fuse's server cannot hand its connection over")
	}
	return s.conn.Park(timeout)
}

// pathsOfNode returns the places in the mount where node id may be, most
// likely first.
func (m *Mount) pathsOfNode(id uint64) ([][]string, syscall.Errno) {
	if id&syntheticBit != 0 {
		p, ok := m.skeletonPath(id)
		if !ok {
			return nil, syscall.ESTALE
		}
		return [][]string{p}, 0
	}
	// A file unlinked while open is found by its record alone; a record
	// a crash left behind may name an inode number another file has now,
	// which the record's handle does not open: that file's own paths
	// follow.
	unlinked := restart.NewUnlinked(m.store.DataDir()).Paths(id)
	paths, errno := m.backingPaths(id)
	if errno != 0 && unlinked != nil {
		return unlinked, 0
	}
	return append(unlinked, paths...), errno
}

// backingPaths is pathsOfNode for a node of a volume's layer or a chroot's
// host: where its backing file is.
func (m *Mount) backingPaths(id uint64) ([][]string, syscall.Errno) {
	slot, ino := id>>volume.ViewShift, id&(1<<volume.ViewShift-1)
	k, ok := m.slots.view(slot)
	if !ok {
		return nil, syscall.ESTALE
	}
	st, err := m.store.View(k.alloc)
	if err != nil {
		return nil, syscall.ESTALE
	}
	if i, name, ok := memoryPlace(k.view); ok {
		return m.memoryPaths(st, i, name, ino)
	}
	layerID, rel, err := m.backingPath(st, ino)
	if err != nil {
		if paths := m.hostPaths(st, k.view, ino); paths != nil {
			return paths, 0
		}
		m.logger.Debug("backing file of an inherited node not found", "node", id, "error", err)
		return nil, syscall.ESTALE
	}
	if born, err := birth(filepath.Join(append([]string{m.store.DataDir(), "layers", layerID}, rel...)...)); err != nil || born.After(m.started) {
		// Its inode number was freed and taken by a file this daemon
		// made: the kernel's node is of a file that is gone.
		return nil, syscall.ESTALE
	}
	var first, rest [][]string
	for key, v := range st.Volumes {
		base, ok := volumePath(st, key, k.view)
		if !ok {
			continue
		}
		p := append(base, rel...)
		if v.Upper == layerID || slices.Contains(v.Lowers, layerID) {
			first = append(first, p)
		} else {
			rest = append(rest, p)
		}
	}
	return append(first, rest...), 0
}

// volumePath is where volume key of st shows in view (fs/layout), or
// false if that view does not show it.
func volumePath(st *record.State, key string, view uint64) ([]string, bool) {
	shared, ok := strings.CutPrefix(key, allocdir.SharedAllocName+"/")
	switch {
	case key == record.RootVolume && view == 0:
		return []string{st.ID}, true
	case key == record.RootVolume:
		return nil, false
	case key == record.SharedVolume && view == 0:
		return []string{st.ID, allocdir.SharedAllocName}, true
	case key == record.SharedVolume && view <= uint64(len(st.Tasks)):
		return []string{st.ID, st.Tasks[view-1].Name, allocdir.SharedAllocName}, true
	case key == record.SharedVolume:
		return nil, false
	case view == 0 && ok:
		return []string{st.ID, allocdir.SharedAllocName, shared}, true
	case view == 0:
		return append([]string{st.ID}, strings.Split(key, "/")...), true
	case ok && view <= uint64(len(st.Tasks)):
		return []string{st.ID, st.Tasks[view-1].Name, allocdir.SharedAllocName, shared}, true
	case !ok && view >= taskRootView && view-taskRootView < uint64(len(st.Tasks)) && st.Tasks[view-taskRootView].Name == key:
		return []string{st.ID, key}, true
	}
	return nil, false
}

// skeletonPath finds the layout directory whose synthetic inode number
// is id.
func (m *Mount) skeletonPath(id uint64) ([]string, bool) {
	for _, allocID := range m.store.IDs() {
		if syntheticIno("alloc", allocID) == id {
			return []string{allocID}, true
		}
		if syntheticIno("shared", allocID, "0") == id {
			return []string{allocID, allocdir.SharedAllocName}, true
		}
		st, err := m.store.View(allocID)
		if err != nil {
			continue
		}
		for i, t := range st.Tasks {
			if syntheticIno("shared", allocID, strconv.Itoa(i+1)) == id {
				return []string{allocID, t.Name, allocdir.SharedAllocName}, true
			}
		}
	}
	return nil, false
}

// backingPath finds the backing file whose inode number is ino, among the
// layers of allocation st, and returns its layer and its path there.
// On ext4 the inode is opened by its handle, whose generation ext4 does
// not check when it is 0; elsewhere the layers are searched.
func (m *Mount) backingPath(st *record.State, ino uint64) (string, []string, error) {
	layers := filepath.Join(m.store.DataDir(), "layers")
	if len(st.Tags) > 0 {
		// Subvolumes: the salt names the layer, the rest is the inode
		// number in it.
		tag, raw := uint8(ino>>layer.SaltShift), ino&(1<<layer.SaltShift-1)
		for id, t := range st.Tags {
			if t != tag {
				continue
			}
			if rel, ok := findIno(filepath.Join(layers, id), raw); ok {
				return id, rel, nil
			}
		}
		return "", nil, fmt.Errorf("no file of inode %d in the layer tagged %d of %s", raw, tag, st.ID)
	}
	if p, err := openByIno(layers, ino); err == nil {
		if layerID, rel, ok := splitLayerPath(layers, p); ok {
			return layerID, rel, nil
		}
	}
	var ids []string
	for _, v := range st.Volumes {
		ids = append(ids, v.Upper)
		ids = append(ids, v.Lowers...)
	}
	ids = append(ids, st.Retained...)
	for _, id := range ids {
		if rel, ok := findIno(filepath.Join(layers, id), ino); ok {
			return id, rel, nil
		}
	}
	return "", nil, fmt.Errorf("no file of inode %d in the layers of %s", ino, st.ID)
}

// birth returns when the file at path was made.
func birth(path string) (time.Time, error) {
	var x unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BTIME, &x); err != nil {
		return time.Time{}, err
	}
	if x.Mask&unix.STATX_BTIME == 0 {
		return time.Time{}, nil
	}
	return time.Unix(x.Btime.Sec, int64(x.Btime.Nsec)), nil
}

// splitLayerPath splits p, a path under layers, into its layer and the
// names below it; a deleted file (whose /proc path says so) has none.
func splitLayerPath(layers, p string) (string, []string, bool) {
	rel, err := filepath.Rel(layers, p)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") || strings.HasSuffix(p, " (deleted)") {
		return "", nil, false
	}
	parts := strings.Split(rel, "/")
	return parts[0], parts[1:], true
}

// findIno searches the tree at root for an entry of inode number ino.
func findIno(root string, ino uint64) ([]string, bool) {
	var found []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || found != nil {
			return filepath.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if s, ok := info.Sys().(*syscall.Stat_t); ok && s.Ino == ino {
			rel, _ := filepath.Rel(root, p)
			found = []string{}
			if rel != "." {
				found = strings.Split(rel, "/")
			}
			return filepath.SkipAll
		}
		return nil
	})
	return found, found != nil
}

// unnameUnlinked takes the name a takeover found an unlinked node by out
// of go-fuse's tree (below root) once the node is registered: the node has no name,
// and its path must lead nowhere, so that only what it holds answers.
func unnameUnlinked(root *gofs.Inode, path []string) {
	if len(path) == 0 || !strings.HasPrefix(path[len(path)-1], restart.UnlinkedPrefix) {
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
