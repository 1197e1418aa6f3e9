package fs

// The true floor of the metadata benchmarks ("floor"): a
// fuse.RawFileSystem that the transport calls directly, with no node
// bridge between them. What a workload costs on it is what the kernel and
// the transport cost and nothing of the daemon's: every request is a map
// access under one mutex and a reply. The bridge-based floor of
// benchpeers_test.go ("floor-bridge") answers the same requests through
// go-fuse's fs API, so the two columns side by side show what the bridge
// itself costs.

import (
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// rawFloor answers the requests the metadata benchmarks, their setup and
// their cleanup send (LOOKUP, FORGET, GETATTR, SETATTR, CREATE, MKDIR,
// OPEN, OPENDIR, READDIR, READDIRPLUS, WRITE, UNLINK, RMDIR, GETXATTR,
// LISTXATTR, RELEASE, RELEASEDIR) and leaves every other to go-fuse's
// default, ENOSYS. Its replies carry what the allocfs mount's carry where
// the kernel acts on them (timeouts, FOPEN_NOFLUSH, FOPEN_CACHE_DIR), so
// that the kernel sends it the requests it sends the mount.
type rawFloor struct {
	fuse.RawFileSystem
	entry, attr, negative time.Duration

	mu    sync.Mutex
	nodes map[uint64]*rawNode // by node ID; the root is fuse.FUSE_ROOT_ID
	next  uint64              // the last node ID given out
}

// rawNode is what a node ID stands for. A node stays while it has a name
// or the kernel holds a lookup of it, as the protocol wants; "cold" in a
// benchmark is the kernel's caches only, as for the other floor.
type rawNode struct {
	mode    uint32
	size    uint64
	nlookup uint64
	linked  bool
	// A directory's entries in creation order. The slot of a removed
	// entry stays, emptied, so that the offsets the kernel holds from an
	// earlier READDIR still point where they did.
	slots []rawSlot
	index map[string]int // name → slot
}

type rawSlot struct {
	name string // "" once removed
	id   uint64
}

func newRawFloor(entry, attr, negative time.Duration) *rawFloor {
	root := &rawNode{mode: syscall.S_IFDIR | 0o755, linked: true, index: map[string]int{}}
	return &rawFloor{
		RawFileSystem: fuse.NewDefaultRawFileSystem(),
		entry:         entry, attr: attr, negative: negative,
		nodes: map[uint64]*rawNode{fuse.FUSE_ROOT_ID: root},
		next:  fuse.FUSE_ROOT_ID,
	}
}

func (f *rawFloor) String() string { return "allocfs-raw-floor" }

// The kernel lists these flags on the mount's handles (the bridge adds
// KEEP_CACHE to a volume directory's CACHE_DIR): the floor's listings and
// closes then cost the kernel what the mount's do.
const (
	rawFloorOpenFlags    = fuse.FOPEN_NOFLUSH
	rawFloorOpendirFlags = fuse.FOPEN_CACHE_DIR | fuse.FOPEN_KEEP_CACHE
)

func (n *rawNode) fill(id uint64, out *fuse.Attr) {
	*out = fuse.Attr{Ino: id, Mode: n.mode, Size: n.size, Nlink: 1}
	if n.mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.Nlink = 2
	}
}

// entryOut describes node id and counts the lookup the kernel takes by
// receiving it. f.mu must be held.
func (f *rawFloor) entryOut(id uint64, n *rawNode, out *fuse.EntryOut) {
	n.nlookup++
	out.NodeId = id
	out.Generation = 0
	out.SetEntryTimeout(f.entry)
	out.SetAttrTimeout(f.attr)
	n.fill(id, &out.Attr)
}

// dir returns the directory id names; f.mu must be held.
func (f *rawFloor) dir(id uint64) (*rawNode, fuse.Status) {
	d := f.nodes[id]
	if d == nil {
		return nil, fuse.Status(syscall.ESTALE)
	}
	if d.mode&syscall.S_IFMT != syscall.S_IFDIR {
		return nil, fuse.Status(syscall.ENOTDIR)
	}
	return d, fuse.OK
}

func (f *rawFloor) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, st := f.dir(h.NodeId)
	if !st.Ok() {
		return st
	}
	i, ok := d.index[name]
	if !ok {
		// A reply with node ID 0 is a negative entry the kernel keeps
		// for its timeout, as the mount's are.
		*out = fuse.EntryOut{}
		out.SetEntryTimeout(f.negative)
		return fuse.OK
	}
	id := d.slots[i].id
	f.entryOut(id, f.nodes[id], out)
	return fuse.OK
}

func (f *rawFloor) Forget(id, nlookup uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[id]
	if n == nil || id == fuse.FUSE_ROOT_ID {
		return
	}
	n.nlookup -= min(n.nlookup, nlookup)
	if n.nlookup == 0 && !n.linked {
		delete(f.nodes, id)
	}
}

func (f *rawFloor) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[in.NodeId]
	if n == nil {
		return fuse.Status(syscall.ESTALE)
	}
	n.fill(in.NodeId, &out.Attr)
	out.SetTimeout(f.attr)
	return fuse.OK
}

func (f *rawFloor) SetAttr(_ <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[in.NodeId]
	if n == nil {
		return fuse.Status(syscall.ESTALE)
	}
	if size, ok := in.GetSize(); ok {
		n.size = size
	}
	if mode, ok := in.GetMode(); ok {
		n.mode = n.mode&syscall.S_IFMT | mode&0o7777
	}
	n.fill(in.NodeId, &out.Attr)
	out.SetTimeout(f.attr)
	return fuse.OK
}

// add names a new node in directory parent; f.mu must be held.
func (f *rawFloor) add(parent uint64, name string, mode uint32, out *fuse.EntryOut) fuse.Status {
	d, st := f.dir(parent)
	if !st.Ok() {
		return st
	}
	if _, ok := d.index[name]; ok {
		return fuse.Status(syscall.EEXIST)
	}
	f.next++
	id := f.next
	n := &rawNode{mode: mode, linked: true}
	if mode&syscall.S_IFMT == syscall.S_IFDIR {
		n.index = map[string]int{}
	}
	f.nodes[id] = n
	d.index[name] = len(d.slots)
	d.slots = append(d.slots, rawSlot{name: name, id: id})
	f.entryOut(id, n, out)
	return fuse.OK
}

func (f *rawFloor) Create(_ <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st := f.add(in.NodeId, name, syscall.S_IFREG|in.Mode&0o7777, &out.EntryOut); !st.Ok() {
		return st
	}
	out.OpenOut = fuse.OpenOut{OpenFlags: rawFloorOpenFlags}
	return fuse.OK
}

func (f *rawFloor) Mkdir(_ <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.add(in.NodeId, name, syscall.S_IFDIR|in.Mode&0o7777, out)
}

// remove takes name out of directory parent, if check allows; f.mu must
// be held.
func (f *rawFloor) remove(parent uint64, name string, check func(*rawNode) syscall.Errno) fuse.Status {
	d, st := f.dir(parent)
	if !st.Ok() {
		return st
	}
	i, ok := d.index[name]
	if !ok {
		return fuse.ENOENT
	}
	id := d.slots[i].id
	n := f.nodes[id]
	if errno := check(n); errno != 0 {
		return fuse.Status(errno)
	}
	delete(d.index, name)
	d.slots[i] = rawSlot{}
	n.linked = false
	if n.nlookup == 0 {
		delete(f.nodes, id)
	}
	return fuse.OK
}

func (f *rawFloor) Unlink(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remove(h.NodeId, name, func(n *rawNode) syscall.Errno {
		if n.mode&syscall.S_IFMT == syscall.S_IFDIR {
			return syscall.EISDIR
		}
		return 0
	})
}

func (f *rawFloor) Rmdir(_ <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.remove(h.NodeId, name, func(n *rawNode) syscall.Errno {
		if n.mode&syscall.S_IFMT != syscall.S_IFDIR {
			return syscall.ENOTDIR
		}
		if len(n.index) > 0 {
			return syscall.ENOTEMPTY
		}
		return 0
	})
}

func (f *rawFloor) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	out.OpenFlags = rawFloorOpenFlags
	return fuse.OK
}

func (f *rawFloor) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	out.OpenFlags = rawFloorOpendirFlags
	return fuse.OK
}

func (f *rawFloor) Write(_ <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[in.NodeId]
	if n == nil {
		return 0, fuse.Status(syscall.ESTALE)
	}
	if end := in.Offset + uint64(len(data)); end > n.size {
		n.size = end
	}
	return uint32(len(data)), fuse.OK
}

// GetXAttr answers as a filesystem with extended attributes and none set
// does: ENOSYS would have the kernel stop asking, which spares the floor
// the GETXATTR of security.capability the mount gets on a file's first
// write.
func (f *rawFloor) GetXAttr(<-chan struct{}, *fuse.InHeader, string, []byte) (uint32, fuse.Status) {
	return 0, fuse.ENOATTR
}

func (f *rawFloor) ListXAttr(<-chan struct{}, *fuse.InHeader, []byte) (uint32, fuse.Status) {
	return 0, fuse.OK
}

// Listing offsets: "." is 1, ".." is 2, and slot i of the directory is
// i+3, each the offset after its entry, as the kernel expects.
const rawFirstSlotOff = 3

func (f *rawFloor) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.list(in, out, false)
}

func (f *rawFloor) ReadDirPlus(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.list(in, out, true)
}

// list fills out with the entries of in's directory after in.Offset, as
// many as fit. With plus every entry but "." and ".." is described, and
// that counts as a lookup; the kernel ignores what the dots carry.
func (f *rawFloor) list(in *fuse.ReadIn, out *fuse.DirEntryList, plus bool) fuse.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, st := f.dir(in.NodeId)
	if !st.Ok() {
		return st
	}
	add := func(e fuse.DirEntry) (*fuse.EntryOut, bool) {
		if !plus {
			return nil, out.AddDirEntry(e)
		}
		eo := out.AddDirLookupEntry(e)
		return eo, eo != nil
	}
	for off, name := range []string{".", ".."} {
		if in.Offset <= uint64(off) {
			if _, ok := add(fuse.DirEntry{Name: name, Mode: syscall.S_IFDIR, Ino: in.NodeId, Off: uint64(off + 1)}); !ok {
				return fuse.OK
			}
		}
	}
	start := 0
	if in.Offset >= rawFirstSlotOff {
		start = int(in.Offset - rawFirstSlotOff + 1)
	}
	for i := start; i < len(d.slots); i++ {
		s := d.slots[i]
		if s.name == "" {
			continue
		}
		n := f.nodes[s.id]
		eo, ok := add(fuse.DirEntry{Name: s.name, Mode: n.mode, Ino: s.id, Off: uint64(i + rawFirstSlotOff)})
		if !ok {
			break
		}
		if eo != nil {
			f.entryOut(s.id, n, eo)
		}
	}
	return fuse.OK
}
