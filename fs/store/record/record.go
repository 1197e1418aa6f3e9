package record

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// Volume is a stack of layers mounted at one point of an allocation.
// Lookups go from Upper down through Lowers; only Upper is ever written.
// Layers are referred to by ID, never by path, so that the data dir can be
// moved and so that two allocations can share a layer (snapshot-mode
// migration) without either owning the other's paths.
type Volume struct {
	Upper  string   `json:"upper"`            // writable top layer ID
	Lowers []string `json:"lowers,omitempty"` // read-only layers, top first
	// ReadOnly freezes the whole volume (EROFS): a previous allocation's
	// view after its data migrated away.
	ReadOnly bool `json:"readonly,omitempty"`
	// Gen, on alloc/'s volume made again through the mount after an
	// rmdir, tells its root from the removed one's, which shows the same
	// inode number (State.Gen); 0 otherwise.
	Gen uint64 `json:"gen,omitempty"`
}

// Layers returns every layer ID of the volume, top first.
func (v *Volume) Layers() []string {
	out := make([]string, 0, 1+len(v.Lowers))
	out = append(out, v.Upper)
	return append(out, v.Lowers...)
}

// Status is the lifecycle state of an allocation, as recorded on disk so
// that it survives a restart of the daemon.
type Status string

const (
	// StatusRunning: the allocation's directories are in use and writable.
	StatusRunning Status = "running"
	// StatusTerminal: the allocation has stopped; it is kept, browsable,
	// until garbage collection destroys it.
	StatusTerminal Status = "terminal"
)

// State is the persisted record of an allocation (state/<id>.json). It is
// the only place that says which layers an allocation uses, so the store
// rewrites it atomically and never hands out the copy it holds.
type State struct {
	ID      string          `json:"id"`
	Tasks   []allocdir.Task `json:"tasks"`
	Status  Status          `json:"status"`
	Created time.Time       `json:"created"`
	// Volumes maps a mount point inside the allocation ("alloc/data",
	// "alloc/logs", "alloc/tmp", "<task>/local", "<task>/tmp") to its
	// layers.
	Volumes map[string]*Volume `json:"volumes"`
	// Stopped is when the allocation became terminal; GC collects the
	// oldest first.
	Stopped time.Time `json:"stopped,omitempty"`
	// Previous is the allocation this one took its data from, and
	// MigratedTo the one that took this one's.
	Previous   string `json:"previous,omitempty"`
	MigratedTo string `json:"migrated_to,omitempty"`
	// Retained are layers no volume stacks any more (a flatten merged
	// them away) that the allocation's views in the mount may still read
	// through: they live as long as the allocation does.
	Retained []string `json:"retained,omitempty"`
	// Origin is OriginMount for an allocation made by a mkdir at the
	// mount root (Nomad's client), empty for one made through the API or
	// the allocdir contract.
	Origin string `json:"origin,omitempty"`
	// Dirs are the attributes earlier versions kept of the skeleton
	// directories DirRoot (<mount>/<id>) and DirShared (alloc/). Those
	// are volumes now, and the store moves what Dirs says onto their
	// layer roots when it opens a record that has it.
	Dirs map[string]*DirAttr `json:"dirs,omitempty"`
	// Gone are the layout directories removed through the mount and not
	// made again: "alloc", "<task>/alloc", "<task>/secrets",
	// "<task>/private", sorted. A removed volume leaves Volumes instead,
	// a removed task Tasks.
	Gone []string `json:"gone,omitempty"`
	// Chroots are the tasks whose directory Nomad builds a chroot in:
	// they show the node's chroot environment, read-only, below their
	// own layer (the tree's host layer). Sorted.
	Chroots []string `json:"chroots,omitempty"`
	// Disk is the allocation's disk limit and the quota group that
	// counts it (limit.go); nil for none.
	Disk *DiskQuota `json:"disk,omitempty"`
	// Tags number, on a store whose layers are btrfs subvolumes, each
	// layer the allocation stacks or retains: every subvolume numbers
	// its inodes from 256, so the mount mixes the layer's tag into the
	// inode numbers it shows (bits 32-39) to keep two layers' files
	// apart. "tags": {"<layerID>": 3, ...}; tags run from 1 to 255.
	Tags map[string]uint8 `json:"tags,omitempty"`
	// Gen tells this allocation's directories from those of an earlier
	// one of the same ID, collected, whose nodes the kernel may still
	// hold (a shell in the directory): the allocation's own directory and
	// its alloc/ show inode numbers made from the ID alone, and the node's
	// generation tells them apart. Random, never 0; 0 in records of
	// earlier versions, whose directories the kernel knows with that
	// generation.
	Gen uint64 `json:"gen,omitempty"`
	// TagTop is the highest tag the allocation ever gave: a tag is never
	// given twice in an allocation, since the kernel may still hold the
	// nodes of the layer that had it, under the same inode numbers.
	TagTop uint8 `json:"tag_top,omitempty"`
}

// Clone returns a deep copy, so that a caller can edit it (or keep it)
// without racing the store or other callers.
func (s *State) Clone() *State {
	if s == nil {
		return nil
	}
	c := *s
	if s.Tasks != nil {
		c.Tasks = append([]allocdir.Task(nil), s.Tasks...)
	}
	if s.Retained != nil {
		c.Retained = append([]string(nil), s.Retained...)
	}
	if s.Gone != nil {
		c.Gone = append([]string(nil), s.Gone...)
	}
	if s.Chroots != nil {
		c.Chroots = append([]string(nil), s.Chroots...)
	}
	if s.Disk != nil {
		d := *s.Disk
		c.Disk = &d
	}
	if s.Tags != nil {
		c.Tags = make(map[string]uint8, len(s.Tags))
		for k, v := range s.Tags {
			c.Tags[k] = v
		}
	}
	if s.Dirs != nil {
		c.Dirs = make(map[string]*DirAttr, len(s.Dirs))
		for k, a := range s.Dirs {
			if a != nil {
				cp := *a
				a = &cp
			}
			c.Dirs[k] = a
		}
	}
	if s.Volumes != nil {
		c.Volumes = make(map[string]*Volume, len(s.Volumes))
		for k, v := range s.Volumes {
			if v == nil {
				c.Volumes[k] = nil
				continue
			}
			nv := &Volume{Upper: v.Upper, ReadOnly: v.ReadOnly}
			if v.Lowers != nil {
				nv.Lowers = append([]string(nil), v.Lowers...)
			}
			c.Volumes[k] = nv
		}
	}
	return &c
}

// TaskIndex returns the index of the task called name, or -1.
func (s *State) TaskIndex(name string) int {
	for i, t := range s.Tasks {
		if t.Name == name {
			return i
		}
	}
	return -1
}

// LayerIDs returns the set of layers the allocation stacks.
func (s *State) LayerIDs() map[string]struct{} {
	out := make(map[string]struct{})
	for _, v := range s.Volumes {
		if v == nil {
			continue
		}
		for _, l := range v.Layers() {
			out[l] = struct{}{}
		}
	}
	return out
}

// AllLayerIDs returns the layers the allocation stacks and those it
// retains: every layer that must live while it does.
func (s *State) AllLayerIDs() map[string]struct{} {
	out := s.LayerIDs()
	for _, l := range s.Retained {
		out[l] = struct{}{}
	}
	return out
}

// VolumeKeys returns the keys of the allocation's volumes in order, so
// that what is done to each happens in a reproducible order.
func (s *State) VolumeKeys() []string {
	keys := make([]string, 0, len(s.Volumes))
	for k := range s.Volumes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Normalize gives a state the shape it has after a JSON round trip (an
// empty Volumes map, no empty Lowers), so that what the store holds in
// memory is exactly what it would read back.
func (s *State) Normalize() {
	if s.Volumes == nil {
		s.Volumes = make(map[string]*Volume)
	}
	for _, v := range s.Volumes {
		if v != nil && len(v.Lowers) == 0 {
			v.Lowers = nil
		}
	}
	if len(s.Retained) == 0 {
		s.Retained = nil
	}
	if len(s.Gone) == 0 {
		s.Gone = nil
	}
	if len(s.Chroots) == 0 {
		s.Chroots = nil
	}
	if len(s.Dirs) == 0 {
		s.Dirs = nil
	}
	if len(s.Tags) == 0 {
		s.Tags = nil
	}
}

// Validate checks what the store relies on in a state, whether it was read
// from disk or produced by an Update: a state that passes can be written
// and read back. Whether its layers exist is checked by the caller, which
// knows where layers live.
func (s *State) Validate() error {
	if err := ValidAllocID(s.ID); err != nil {
		return err
	}
	// No tasks is a valid record: the allocdir contract builds the
	// allocation before its tasks.
	if err := ValidTasks(s.Tasks); err != nil {
		return err
	}
	switch s.Status {
	case StatusRunning, StatusTerminal:
	default:
		return fmt.Errorf("unknown status %q", s.Status)
	}
	for key, v := range s.Volumes {
		if v == nil {
			return fmt.Errorf("volume %q is null", key)
		}
		for _, l := range v.Layers() {
			if err := allocdir.ValidName(l); err != nil {
				return fmt.Errorf("volume %q: invalid layer ID: %w", key, err)
			}
		}
	}
	if s.Disk != nil && (s.Disk.Bytes < 0 || s.Disk.Inodes < 0) {
		return fmt.Errorf("disk limit %+v: %w", s.Disk.Limit, ErrBadLimit)
	}
	for l, t := range s.Tags {
		if t == 0 {
			return fmt.Errorf("layer %s has tag 0", l)
		}
	}
	for _, l := range s.Retained {
		if err := allocdir.ValidName(l); err != nil {
			return fmt.Errorf("retained layers: invalid layer ID: %w", err)
		}
	}
	switch s.Origin {
	case "", OriginMount:
	default:
		return fmt.Errorf("unknown origin %q", s.Origin)
	}
	for dir, a := range s.Dirs {
		if dir != DirRoot && dir != DirShared || a == nil {
			return fmt.Errorf("attributes of %q: not a skeleton directory", dir)
		}
	}
	for _, dir := range s.Gone {
		if err := s.ValidGone(dir); err != nil {
			return fmt.Errorf("removed directories: %w", err)
		}
	}
	for _, task := range s.Chroots {
		if s.TaskIndex(task) < 0 {
			return fmt.Errorf("chroots: no task %q", task)
		}
	}
	return nil
}

// Read reads and checks one record file. The ID recorded inside must
// match the file name: the name is how the store finds it again.
func Read(file string) (*State, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	if want := strings.TrimSuffix(filepath.Base(file), Suffix); st.ID != want {
		return nil, fmt.Errorf("records allocation ID %q, want %q (its file name)", st.ID, want)
	}
	if err := st.Validate(); err != nil {
		return nil, err
	}
	st.Normalize()
	return &st, nil
}
