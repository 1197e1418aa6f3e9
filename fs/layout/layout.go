package layout

import (
	"slices"
	"sort"

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
	// Key is the volume of Volume and Task (record.State.Volumes).
	Key string
	// View is the slot view of Shared and Volume (the tree's identity.go).
	View uint64
	// Task is the task index of Task and Memory; Name is the memory
	// volume's name (secrets or private).
	Task int
	Name string
}

// TaskChildren are the names a task directory shows, sorted.
var TaskChildren = []string{allocdir.SharedAllocName, allocdir.TaskLocal, allocdir.TaskPrivate, allocdir.TaskSecrets, allocdir.TmpDirName}

// Child is the layout directory name leads to from parent in the
// allocation st, or a Place of Kind None: no such name (of Alloc or
// Shared), or an entry of the task's own volume (of Task). A layout
// directory removed through the mount (a volume st has no more, a
// directory st.Gone names) is no such name, as after an rmdir on a local
// filesystem; a task's reserved names are never entries of its volume.
func Child(st *record.State, parent Place, name string) Place {
	switch parent.Kind {
	case Alloc:
		if name == allocdir.SharedAllocName {
			if st.IsGone(record.DirShared) {
				return Place{}
			}
			return Place{Kind: Shared}
		}
		if i := st.TaskIndex(name); i >= 0 {
			return Place{Kind: Task, Key: name, Task: i}
		}
	case Shared:
		if slices.Contains(allocdir.SharedAllocDirs, name) {
			key := allocdir.SharedAllocName + "/" + name
			if st.Volumes[key] == nil {
				return Place{}
			}
			return Place{Kind: Volume, Key: key, View: parent.View}
		}
	case Task:
		task := st.Tasks[parent.Task].Name
		switch name {
		case allocdir.SharedAllocName:
			if st.IsGone(task + "/" + name) {
				return Place{}
			}
			return Place{Kind: Shared, View: uint64(parent.Task + 1)}
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
		names = append(names, allocdir.SharedAllocDirs...)
	case Task:
		names = append(names, TaskChildren...)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return Child(st, parent, n).Kind == None })
	sort.Strings(names)
	return names
}
