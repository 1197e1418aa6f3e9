package layout

import (
	"slices"
	"sort"
	"strings"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
)

// Kind is what a directory of the layout is.
type Kind int

// The kinds of directories of the layout (see the package's picture).
const (
	None Kind = iota
	Alloc
	Shared
	Volume
	Task
	Memory
)

// Place is a directory of the layout.
type Place struct {
	Kind Kind
	// Key is the volume of Volume, Shared and Task
	// (record.State.Volumes); Alloc's is VolumeOf's.
	Key string
	// View is the slot view of Shared and Volume (the tree's identity.go).
	View uint64
	// Task is the task index of Task and Memory; Name is the memory
	// volume's name (secrets or private).
	Task int
	Name string
}

// VolumeOf is the volume that holds the entries of the directory p other
// than its layout children: every directory of an allocation accepts any
// entry, as a plain directory does. "" for a place that has none (a
// memory volume, which is its own).
func VolumeOf(p Place) string {
	switch p.Kind {
	case Alloc:
		return record.RootVolume
	case Shared, Task, Volume:
		return p.Key
	}
	return ""
}

// TaskChildren are the names a task directory shows, sorted.
var TaskChildren = []string{allocdir.SharedAllocName, allocdir.TaskLocal, allocdir.TaskPrivate, allocdir.TaskSecrets, allocdir.TmpDirName}

// Child is the layout directory name leads to from parent in the
// allocation st, or a Place of Kind None: an entry of parent's own volume
// (VolumeOf), if it has one by that name. A layout
// directory removed through the mount (a volume st has no more, a
// directory st.Gone names) is no such name, as after an rmdir on a local
// filesystem; a task's reserved names are never entries of its volume.
func Child(st *record.State, parent Place, name string) Place {
	switch parent.Kind {
	case Alloc:
		if name == allocdir.SharedAllocName {
			if st.Volumes[record.SharedVolume] == nil {
				return Place{}
			}
			return Place{Kind: Shared, Key: record.SharedVolume}
		}
		if i := st.TaskIndex(name); i >= 0 {
			return Place{Kind: Task, Key: name, Task: i}
		}
	case Shared:
		// data/, logs/, tmp/, or one of them renamed in the allocation.
		if key := allocdir.SharedAllocName + "/" + name; st.Volumes[key] != nil {
			return Place{Kind: Volume, Key: key, View: parent.View}
		}
	case Task:
		task := st.Tasks[parent.Task].Name
		switch name {
		case allocdir.SharedAllocName:
			if st.IsGone(task+"/"+name) || st.Volumes[record.SharedVolume] == nil {
				return Place{}
			}
			return Place{Kind: Shared, Key: record.SharedVolume, View: uint64(parent.Task + 1)}
		case allocdir.TaskLocal, allocdir.TmpDirName:
			if st.Volumes[task+"/"+name] == nil {
				return Place{}
			}
			return Place{Kind: Volume, Key: task + "/" + name}
		case allocdir.TaskSecrets, allocdir.TaskPrivate:
			if st.IsGone(task + "/" + name) {
				return Place{}
			}
			return Place{Kind: Memory, Task: parent.Task, Name: name}
		}
		// A volume renamed into the task's directory.
		if st.Volumes[task+"/"+name] != nil {
			return Place{Kind: Volume, Key: task + "/" + name}
		}
	}
	return Place{}
}

// Names are the layout children of parent that st has, sorted; a
// task directory shows its volume's entries besides them.
func Names(st *record.State, parent Place) []string {
	var names []string
	switch parent.Kind {
	case Alloc:
		names = append(names, allocdir.SharedAllocName)
		for _, t := range st.Tasks {
			names = append(names, t.Name)
		}
	case Shared:
		names = append(names, volumesIn(st, allocdir.SharedAllocName)...)
	case Task:
		names = append(names, TaskChildren...)
		for _, n := range volumesIn(st, st.Tasks[parent.Task].Name) {
			if !slices.Contains(TaskChildren, n) {
				names = append(names, n)
			}
		}
	}
	names = slices.DeleteFunc(names, func(n string) bool { return Child(st, parent, n).Kind == None })
	sort.Strings(names)
	return names
}

// volumesIn are the names of the volumes whose roots are entries of the
// layout directory dir ("alloc" or a task's name): those of the layout,
// and any a rename put there.
func volumesIn(st *record.State, dir string) []string {
	var names []string
	for key := range st.Volumes {
		if name, ok := strings.CutPrefix(key, dir+"/"); ok && !strings.Contains(name, "/") {
			names = append(names, name)
		}
	}
	return names
}

// Renamable reports whether a volume may be renamed to name in the
// layout directory parent: a name the layout keeps for a directory of
// another kind (a task's secrets/, private/, alloc/) may not be one.
func Renamable(parent Place, name string) bool {
	switch parent.Kind {
	case Shared:
		return true
	case Task:
		return name == allocdir.TaskLocal || name == allocdir.TmpDirName || !slices.Contains(TaskChildren, name)
	}
	return false
}
