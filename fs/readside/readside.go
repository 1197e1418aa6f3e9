package readside

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/layout"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// FS presents one allocation of the store as an allocdir.ReadFS:
// the skeleton is synthesised from the state, volumes are read from their
// upper layer beneath an fd of it, and memory-only directories from the
// mount's memory tree.
type FS struct {
	store *store.Store
	mount Mount
	st    *record.State
	// volumes holds each volume's ReadFS, with its layers' fds open, for
	// the whole operation: the resolver looks at a path one component at
	// a time.
	volumes map[string]allocdir.ReadFS
	fds     []int
}

// New returns the read side of allocation st of s; m is the mount the
// allocation is shown in, nil for none.
func New(s *store.Store, m Mount, st *record.State) *FS {
	return &FS{store: s, mount: m, st: st}
}

// Mount is what the read side finds only in the mount: the host layer of
// a chroot, and the memory volumes.
type Mount interface {
	// HostLayer is the host layer shown below the task directory's
	// volume key of st, nil for none.
	HostLayer(st *record.State, key string) *layer.HostLayer
	// MemoryRoot opens the root of the memory volume name of task in
	// allocation id, or returns -1 when the mount has not made it.
	MemoryRoot(id, task, name string) (int, error)
}

// Close closes the descriptors f opened.
func (f *FS) Close() {
	for _, fd := range f.fds {
		unix.Close(fd)
	}
	f.fds, f.volumes = nil, nil
}

// where says what backs a path of the allocation.
type where struct {
	skeleton []string // names of a synthesised directory, when it is one
	layerFS  allocdir.ReadFS
	rest     string // path inside the volume
	// upperRoot is the host path of the volume's upper layer.
	upperRoot string
	// memory is set for a path in a memory volume, which is never
	// opened for reading; layerFS reads its metadata when the volume
	// has been made, and without it the volume shows empty.
	memory  bool
	memRest []string
	base    string // the path's last component
}

func (f *FS) locate(name string) (*where, error) {
	at := layout.Place{Kind: layout.Alloc}
	var comps []string
	base := "."
	if name != "." {
		comps = strings.Split(name, "/")
		base = comps[len(comps)-1]
	}
	for i, c := range comps {
		next := layout.Child(f.st, at, c)
		switch next.Kind {
		case layout.None:
			if key := layout.VolumeOf(at); key != "" {
				// An entry of the layout directory's own volume.
				return f.volume(key, comps[i:], base)
			}
			return nil, &iofs.PathError{Op: "lookup", Path: name, Err: iofs.ErrNotExist}
		case layout.Volume:
			return f.volume(next.Key, comps[i+1:], base)
		case layout.Memory:
			return f.memory(f.st.Tasks[next.Task], next.Name, comps[i+1:], base)
		}
		at = next
	}
	w, err := f.volume(layout.VolumeOf(at), nil, base)
	if err != nil {
		return nil, err
	}
	w.skeleton = layout.Names(f.st, at)
	return w, nil
}

func (f *FS) volume(key string, rest []string, base string) (*where, error) {
	v, ok := f.st.Volumes[key]
	if !ok {
		return nil, &iofs.PathError{Op: "lookup", Path: key, Err: iofs.ErrNotExist}
	}
	vfs, ok := f.volumes[key]
	if !ok {
		ids := append([]string{v.Upper}, v.Lowers...)
		layers := make([]allocdir.ReadFS, 0, len(ids))
		roots := make([]string, 0, len(ids))
		for _, id := range ids {
			root := f.store.LayerPath(id)
			fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("layer %s of %s/%s: %w", id, f.st.ID, key, err)
			}
			f.fds = append(f.fds, fd)
			layers = append(layers, allocdir.NewBeneathFS(fd))
			roots = append(roots, root)
		}
		stack := &layer.Stack{Roots: roots}
		if host := f.hostLayer(key); host != nil {
			// A chroot task's directory shows the host's files below
			// its own, as the mount does.
			stack.Host = host
			stack.Roots = append(stack.Roots, stack.Host.Skeleton)
			layers = append(layers, stackLayerFS{s: stack, i: len(stack.Roots) - 1})
		}
		vfs = layers[0]
		if len(layers) > 1 {
			vfs = &ovlReadFS{ovl: stack, layers: layers}
		}
		if f.volumes == nil {
			f.volumes = make(map[string]allocdir.ReadFS)
		}
		f.volumes[key] = vfs
	}
	r := path.Join(rest...)
	if r == "" {
		r = "."
	}
	return &where{layerFS: vfs, rest: r, base: base, upperRoot: f.store.LayerPath(v.Upper)}, nil
}

func (f *FS) hostLayer(key string) *layer.HostLayer {
	if f.mount == nil {
		return nil
	}
	return f.mount.HostLayer(f.st, key)
}

// memory says where a path in a task's memory volume is: in the volume
// the mount made, read beneath a descriptor of it, or in one not made
// yet, an empty directory (as also without a mount).
func (f *FS) memory(task allocdir.Task, name string, rest []string, base string) (*where, error) {
	w := &where{memory: true, memRest: rest, base: base}
	if f.mount == nil {
		return w, nil
	}
	fd, err := f.mount.MemoryRoot(f.st.ID, task.Name, name)
	if err != nil || fd < 0 {
		return w, err
	}
	f.fds = append(f.fds, fd)
	w.layerFS = allocdir.NewBeneathFS(fd)
	w.rest = path.Join(rest...)
	if w.rest == "" {
		w.rest = "."
	}
	return w, nil
}

// Open implements iofs.FS; only volume files can be opened.
func (f *FS) Open(name string) (iofs.File, error) {
	w, err := f.locate(name)
	if err != nil {
		return nil, err
	}
	if w.layerFS == nil || w.memory {
		return nil, &iofs.PathError{Op: "open", Path: name, Err: syscall.EACCES}
	}
	return w.layerFS.Open(w.rest)
}

// ReadDir implements iofs.ReadDirFS.
func (f *FS) ReadDir(name string) ([]iofs.DirEntry, error) {
	w, err := f.locate(name)
	if err != nil {
		return nil, err
	}
	switch {
	case w.layerFS != nil && w.skeleton != nil:
		// A layout directory: its volume's entries and the layout
		// children.
		entries, err := w.layerFS.ReadDir(w.rest)
		if err != nil {
			return nil, err
		}
		out := make([]iofs.DirEntry, 0, len(entries)+len(w.skeleton))
		for _, n := range w.skeleton {
			fi, err := f.Lstat(path.Join(name, n))
			if err != nil {
				return nil, err
			}
			out = append(out, iofs.FileInfoToDirEntry(fi))
		}
		for _, e := range entries {
			if !slices.Contains(w.skeleton, e.Name()) {
				out = append(out, e)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
		return out, nil
	case w.layerFS != nil:
		return w.layerFS.ReadDir(w.rest)
	}
	_, err = memEmpty(w)
	return nil, err
}

// Lstat implements iofs.ReadLinkFS.
func (f *FS) Lstat(name string) (iofs.FileInfo, error) {
	w, err := f.locate(name)
	if err != nil {
		return nil, err
	}
	switch {
	case w.layerFS != nil:
		fi, err := w.layerFS.Lstat(w.rest)
		if err != nil {
			return nil, err
		}
		if w.rest == "." {
			return renamedInfo{FileInfo: fi, name: w.base}, nil
		}
		return fi, nil
	}
	return memEmpty(w)
}

// ReadLink implements iofs.ReadLinkFS.
func (f *FS) ReadLink(name string) (string, error) {
	w, err := f.locate(name)
	if err != nil {
		return "", err
	}
	switch {
	case w.layerFS != nil:
		return w.layerFS.ReadLink(w.rest)
	}
	return "", &iofs.PathError{Op: "readlink", Path: name, Err: iofs.ErrInvalid}
}

// synthInfo is the stat of a skeleton directory.
type synthInfo struct {
	name  string
	mode  iofs.FileMode
	mtime time.Time
	size  int64
}

func (s *synthInfo) Name() string { return s.name }

func (s *synthInfo) Size() int64 { return s.size }

func (s *synthInfo) Mode() iofs.FileMode { return s.mode }

func (s *synthInfo) ModTime() time.Time { return s.mtime }

func (s *synthInfo) IsDir() bool { return s.mode.IsDir() }

func (s *synthInfo) Sys() any { return nil }

// renamedInfo reports a layer root under its name in the allocation.
type renamedInfo struct {
	iofs.FileInfo
	name string
}

func (r renamedInfo) Name() string { return r.name }

// memEmpty answers for a memory volume not made yet: an empty directory.
func memEmpty(w *where) (iofs.FileInfo, error) {
	if len(w.memRest) > 0 {
		return nil, &iofs.PathError{Op: "lookup", Path: strings.Join(w.memRest, "/"), Err: iofs.ErrNotExist}
	}
	return &synthInfo{name: w.base, mode: iofs.ModeDir | 0o777}, nil
}

// ovlReadFS is the read side's view of a volume with lower layers: the
// overlay decides which layer shows a path (whiteouts and opaque
// directories included), and that layer's beneath-only ReadFS reads it,
// so no symbolic link planted meanwhile is followed.
type ovlReadFS struct {
	ovl    *layer.Stack
	layers []allocdir.ReadFS
}

func ovlRel(name string) string {
	if name == "." {
		return ""
	}
	return name
}

// shown returns the layers where name is visible, shown one first.
func (o *ovlReadFS) shown(op, name string) ([]int, error) {
	all := make([]int, len(o.layers))
	for i := range all {
		all[i] = i
	}
	if name == "." {
		return all, nil
	}
	layers, _, err := o.ovl.Visible(ovlRel(name), all)
	if err != nil {
		return nil, &iofs.PathError{Op: op, Path: name, Err: err}
	}
	return layers, nil
}

func (o *ovlReadFS) Open(name string) (iofs.File, error) {
	layers, err := o.shown("open", name)
	if err != nil {
		return nil, err
	}
	return o.layers[layers[0]].Open(name)
}

func (o *ovlReadFS) Lstat(name string) (iofs.FileInfo, error) {
	layers, err := o.shown("lstat", name)
	if err != nil {
		return nil, err
	}
	return o.layers[layers[0]].Lstat(name)
}

func (o *ovlReadFS) ReadLink(name string) (string, error) {
	layers, err := o.shown("readlink", name)
	if err != nil {
		return "", err
	}
	return o.layers[layers[0]].ReadLink(name)
}

func (o *ovlReadFS) ReadDir(name string) ([]iofs.DirEntry, error) {
	layers, err := o.shown("readdir", name)
	if err != nil {
		return nil, err
	}
	entries, err := o.ovl.List(ovlRel(name), layers)
	if err != nil {
		return nil, &iofs.PathError{Op: "readdir", Path: name, Err: err}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	out := make([]iofs.DirEntry, 0, len(entries))
	for _, e := range entries {
		fi, err := o.Lstat(path.Join(name, e.Name))
		if errors.Is(err, iofs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, iofs.FileInfoToDirEntry(fi))
	}
	return out, nil
}

// stackLayerFS reads the layer at position i of a stack through the
// stack, which knows where each path of a host layer lies (its entry's
// source, or the skeleton): every open stays beneath that root and
// follows no link.
type stackLayerFS struct {
	s *layer.Stack
	i int
}

func (l stackLayerFS) loc(op, name string) (layer.Loc, error) {
	if !iofs.ValidPath(name) {
		return layer.Loc{Dir: -1}, &iofs.PathError{Op: op, Path: name, Err: iofs.ErrInvalid}
	}
	at, err := l.s.Loc(l.i, ovlRel(name))
	if err != nil {
		return layer.Loc{Dir: -1}, &iofs.PathError{Op: op, Path: name, Err: err}
	}
	return at, nil
}

func (l stackLayerFS) Open(name string) (iofs.File, error) {
	at, err := l.loc("open", name)
	if err != nil {
		return nil, err
	}
	defer at.Close()
	fd, err := at.Open(unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &iofs.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

func (l stackLayerFS) Lstat(name string) (iofs.FileInfo, error) {
	var st syscall.Stat_t
	if err := l.s.Lstat(l.i, ovlRel(name), &st); err != nil {
		return nil, &iofs.PathError{Op: "lstat", Path: name, Err: err}
	}
	return allocdir.NewStatInfo(path.Base(name), &st), nil
}

func (l stackLayerFS) ReadLink(name string) (string, error) {
	at, err := l.loc("readlink", name)
	if err != nil {
		return "", err
	}
	defer at.Close()
	target, err := at.Readlink()
	if err != nil {
		return "", &iofs.PathError{Op: "readlink", Path: name, Err: err}
	}
	return target, nil
}

func (l stackLayerFS) ReadDir(name string) ([]iofs.DirEntry, error) {
	entries, err := l.s.List(ovlRel(name), []int{l.i})
	if err != nil {
		return nil, &iofs.PathError{Op: "readdir", Path: name, Err: err}
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	out := make([]iofs.DirEntry, 0, len(entries))
	for _, e := range entries {
		fi, err := l.Lstat(path.Join(name, e.Name))
		if err != nil {
			continue
		}
		out = append(out, iofs.FileInfoToDirEntry(fi))
	}
	return out, nil
}
