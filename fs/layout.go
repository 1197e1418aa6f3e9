package fs

import (
	"slices"
	"sort"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
)

// The allocation layout, routed in one place. Both the FUSE tree (one
// lookup at a time) and the read side of the allocdir contract (a whole
// path at once, storeFS.locate) ask layoutChild what a name of a layout
// directory is, so the two can never disagree on where a path leads:
//
//	<alloc>/                  placeAlloc
//	├── alloc/                placeShared, view 0
//	│   └── data|logs|tmp/    placeVolume  "alloc/<name>", the view's
//	└── <task>/               placeTask    the task's own volume "<task>"
//	    ├── alloc/            placeShared, view task index + 1
//	    ├── local/ tmp/       placeVolume  "<task>/<name>", view 0
//	    └── secrets/ private/ placeMemory
//
// Any other name of a task directory is an entry of the task's own volume.

type placeKind int

const (
	placeNone placeKind = iota
	placeAlloc
	placeShared
	placeVolume
	placeTask
	placeMemory
)

// place is a directory of the layout.
type place struct {
	kind placeKind
	// key is the volume of placeVolume and placeTask (record.State.Volumes).
	key string
	// view is the slot view of placeShared and placeVolume (identity.go).
	view uint64
	// task is the task index of placeTask and placeMemory; name is the
	// memory volume's name (secrets or private).
	task int
	name string
}

// taskChildren are the names a task directory shows, sorted.
var taskChildren = []string{allocdir.SharedAllocName, allocdir.TaskLocal, allocdir.TaskPrivate, allocdir.TaskSecrets, allocdir.TmpDirName}

// layoutChild is the layout directory name leads to from parent in the
// allocation st, or placeNone: no such name (of placeAlloc or
// placeShared), or an entry of the task's own volume (of placeTask). A
// layout directory removed through the mount (a volume st has no more, a
// directory st.Gone names) is no such name, as after an rmdir on a local
// filesystem; a task's reserved names are never entries of its volume.
func layoutChild(st *record.State, parent place, name string) place {
	switch parent.kind {
	case placeAlloc:
		if name == allocdir.SharedAllocName {
			if st.IsGone(record.DirShared) {
				return place{}
			}
			return place{kind: placeShared}
		}
		if i := st.TaskIndex(name); i >= 0 {
			return place{kind: placeTask, key: name, task: i}
		}
	case placeShared:
		if slices.Contains(allocdir.SharedAllocDirs, name) {
			key := allocdir.SharedAllocName + "/" + name
			if st.Volumes[key] == nil {
				return place{}
			}
			return place{kind: placeVolume, key: key, view: parent.view}
		}
	case placeTask:
		task := st.Tasks[parent.task].Name
		switch name {
		case allocdir.SharedAllocName:
			if st.IsGone(task + "/" + name) {
				return place{}
			}
			return place{kind: placeShared, view: uint64(parent.task + 1)}
		case allocdir.TaskLocal, allocdir.TmpDirName:
			if st.Volumes[task+"/"+name] == nil {
				return place{}
			}
			return place{kind: placeVolume, key: task + "/" + name}
		case allocdir.TaskSecrets, allocdir.TaskPrivate:
			if st.IsGone(task + "/" + name) {
				return place{}
			}
			return place{kind: placeMemory, task: parent.task, name: name}
		}
	}
	return place{}
}

// layoutNames are the layout children of parent that st has, sorted; a
// task directory shows its volume's entries besides them.
func layoutNames(st *record.State, parent place) []string {
	var names []string
	switch parent.kind {
	case placeAlloc:
		names = append(names, allocdir.SharedAllocName)
		for _, t := range st.Tasks {
			names = append(names, t.Name)
		}
	case placeShared:
		names = append(names, allocdir.SharedAllocDirs...)
	case placeTask:
		names = append(names, taskChildren...)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return layoutChild(st, parent, n).kind == placeNone })
	sort.Strings(names)
	return names
}
