package record

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// VolumeSpec is one volume the store creates for a new allocation or task:
// its key in State.Volumes and the mode of its fresh upper layer.
type VolumeSpec struct {
	Key  string
	Mode os.FileMode
	// Owner, when set, owns the fresh layer's root instead of the
	// store's owner: the caller of a mkdir through the mount.
	Owner *allocdir.Owner
	// Agent gives the fresh layer's root to the daemon itself rather
	// than to the store's owner: the allocation's own directory is the
	// agent's, as Nomad's client makes it.
	Agent bool
	// Gen is the new volume's Volume.Gen.
	Gen uint64
}

// The volumes that hold what lands in an allocation's own directories
// outside data/, logs/, tmp/ and the tasks: a plain directory accepts any
// entry (libcontainer's state directory alloc/container, a template or an
// artifact rendered into ${NOMAD_ALLOC_DIR}, a ready file or a socket a
// task shares with its sidecar), and so do these. The layout's own
// children are presented over them.
const (
	// RootVolume is <mount>/<allocID>/ itself.
	RootVolume = "."
	// SharedVolume is <mount>/<allocID>/alloc/, which every
	// <task>/alloc view shows too.
	SharedVolume = allocdir.SharedAllocName
)

// AllocVolumes are the volumes every allocation has, whatever its tasks.
func AllocVolumes() []VolumeSpec {
	return []VolumeSpec{
		{Key: RootVolume, Mode: 0o755, Agent: true},
		{Key: SharedVolume, Mode: allocdir.SharedDirMode},
		{Key: path.Join(allocdir.SharedAllocName, allocdir.SharedDataName), Mode: allocdir.SharedDirMode},
		{Key: path.Join(allocdir.SharedAllocName, allocdir.LogDirName), Mode: allocdir.SharedDirMode},
		{Key: path.Join(allocdir.SharedAllocName, allocdir.TmpDirName), Mode: allocdir.SharedDirMode},
	}
}

// TaskVolumes are the volumes of one task. secrets/ and private/ are not
// among them: they live in memory only and never reach the data dir.
func TaskVolumes(task string) []VolumeSpec {
	return []VolumeSpec{
		// The task directory itself: drivers write there (executor.out,
		// a chroot's /bin and /etc); the layout's own children are
		// presented over it.
		{Key: task, Mode: allocdir.TaskDirMode},
		{Key: path.Join(task, allocdir.TaskLocal), Mode: allocdir.TaskDirMode},
		{Key: path.Join(task, allocdir.TmpDirName), Mode: allocdir.TaskTmpMode},
	}
}

// VolumeSpecs are the volumes the allocation's layout calls for: the
// alloc-level ones and those of each task.
func (s *State) VolumeSpecs() []VolumeSpec {
	specs := AllocVolumes()
	for _, t := range s.Tasks {
		specs = append(specs, TaskVolumes(t.Name)...)
	}
	return specs
}

// HasVolumeSpec reports whether key is one of the allocation's volumes.
func (s *State) HasVolumeSpec(key string) bool {
	for _, v := range s.VolumeSpecs() {
		if v.Key == key {
			return true
		}
	}
	return false
}

// VolumeSpecOf returns the spec of the volume at key, whichever
// allocation or task it belongs to.
func VolumeSpecOf(key string) (VolumeSpec, bool) {
	for _, v := range AllocVolumes() {
		if v.Key == key {
			return v, true
		}
	}
	task, _, _ := strings.Cut(key, "/")
	if ValidTaskName(task) != nil {
		return VolumeSpec{}, false
	}
	for _, v := range TaskVolumes(task) {
		if v.Key == key {
			return v, true
		}
	}
	return VolumeSpec{}, false
}

// Suffix ends every record file's name; what precedes it is the ID.
const Suffix = ".json"

// ValidAllocID checks an allocation ID: one path component, and short
// enough that <id>.json still fits in a file name (NAME_MAX), so that a
// long ID fails up front rather than half-way through a create.
func ValidAllocID(id string) error {
	if err := allocdir.ValidID(id); err != nil {
		return fmt.Errorf("invalid allocation ID: %w", err)
	}
	if len(id)+len(Suffix) > 255 {
		return fmt.Errorf("invalid allocation ID: %w: %q is longer than %d bytes",
			allocdir.ErrInvalidName, id, 255-len(Suffix))
	}
	return nil
}

// ValidTaskName checks a task name: one path component, and not "alloc",
// whose volumes would collide with the shared directory's.
func ValidTaskName(name string) error {
	if err := allocdir.ValidTaskName(name); err != nil {
		return fmt.Errorf("invalid task name: %w", err)
	}
	if name == allocdir.SharedAllocName {
		return fmt.Errorf("invalid task name: %w: %q is reserved for the shared directory",
			allocdir.ErrInvalidName, name)
	}
	return nil
}

// ValidTasks checks every task name and that no two tasks share one.
func ValidTasks(tasks []allocdir.Task) error {
	seen := make(map[string]struct{}, len(tasks))
	for _, t := range tasks {
		if err := ValidTaskName(t.Name); err != nil {
			return err
		}
		if _, dup := seen[t.Name]; dup {
			return fmt.Errorf("invalid task name: %w: %q appears twice", allocdir.ErrInvalidName, t.Name)
		}
		seen[t.Name] = struct{}{}
	}
	return nil
}

// OriginMount is the State.Origin of an allocation made by a mkdir at the
// mount root: Nomad's client, with its alloc_dir on the mount, makes and
// removes it with plain syscalls, and the collector never takes it, since
// Nomad tells no one when it stops.
const OriginMount = "mount"

// DirAttr is what a task or Nomad set on a directory of the skeleton (an
// allocation's root, its alloc/) through the mount: chmod, chown, utimes,
// and the times the directory's own changes stamp. Records of earlier
// versions hold them; those directories are volumes now (RootVolume,
// SharedVolume), whose layer roots the store gives these attributes when
// it opens such a record (Store's upgrade).
//
//	"dirs": {"": {"mode": 493, "uid": 0, "gid": 0, "atime": ..., "mtime": ..., "ctime": ...}}
type DirAttr struct {
	Mode  uint32    `json:"mode"` // permission, set-id and sticky bits
	UID   uint32    `json:"uid"`
	GID   uint32    `json:"gid"`
	Atime time.Time `json:"atime"`
	Mtime time.Time `json:"mtime"`
	Ctime time.Time `json:"ctime"`
}

// Skeleton directories with attributes of their own in records of
// earlier versions (State.Dirs).
const (
	// DirRoot is the allocation's own directory, <mount>/<allocID>.
	DirRoot = ""
	// DirShared is its alloc/, which every <task>/alloc view shows too.
	DirShared = allocdir.SharedAllocName
)

// TaskGoneDirs are the names, in a task directory, of the layout directories
// that State.Gone can hold besides alloc/ itself.
var TaskGoneDirs = []string{allocdir.SharedAllocName, allocdir.TaskSecrets, allocdir.TaskPrivate}

// IsGone reports whether the layout directory dir ("<task>/alloc",
// "<task>/secrets", "<task>/private"; "alloc" in records of earlier
// versions, whose alloc/ now goes with its volume) was removed through
// the mount.
func (s *State) IsGone(dir string) bool { return slices.Contains(s.Gone, dir) }

// ValidGone checks an entry of State.Gone: alloc/, or a task's alloc/,
// secrets/ or private/.
func (s *State) ValidGone(dir string) error {
	if dir == DirShared {
		return nil
	}
	task, name, ok := strings.Cut(dir, "/")
	if ok && s.TaskIndex(task) >= 0 && slices.Contains(TaskGoneDirs, name) {
		return nil
	}
	return fmt.Errorf("%w: %q is not a removable layout directory", allocdir.ErrInvalidName, dir)
}

// IsChroot reports whether the directory of task shows the node's chroot
// environment.
func (s *State) IsChroot(task string) bool { return slices.Contains(s.Chroots, task) }
