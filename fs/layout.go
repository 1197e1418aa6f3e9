package fs

import (
	"slices"
	"sort"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
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
	// key is the volume of placeVolume and placeTask (store.State.Volumes).
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
// placeShared), or an entry of the task's own volume (of placeTask).
func layoutChild(st *store.State, parent place, name string) place {
	switch parent.kind {
	case placeAlloc:
		if name == allocdir.SharedAllocName {
			return place{kind: placeShared}
		}
		if i := st.TaskIndex(name); i >= 0 {
			return place{kind: placeTask, key: name, task: i}
		}
	case placeShared:
		if slices.Contains(allocdir.SharedAllocDirs, name) {
			return place{kind: placeVolume, key: allocdir.SharedAllocName + "/" + name, view: parent.view}
		}
	case placeTask:
		switch name {
		case allocdir.SharedAllocName:
			return place{kind: placeShared, view: uint64(parent.task + 1)}
		case allocdir.TaskLocal, allocdir.TmpDirName:
			return place{kind: placeVolume, key: st.Tasks[parent.task].Name + "/" + name}
		case allocdir.TaskSecrets, allocdir.TaskPrivate:
			return place{kind: placeMemory, task: parent.task, name: name}
		}
	}
	return place{}
}

// layoutNames are the layout children of parent, sorted; a task
// directory shows its volume's entries besides them.
func layoutNames(st *store.State, parent place) []string {
	switch parent.kind {
	case placeAlloc:
		names := []string{allocdir.SharedAllocName}
		for _, t := range st.Tasks {
			names = append(names, t.Name)
		}
		sort.Strings(names)
		return names
	case placeShared:
		names := append([]string(nil), allocdir.SharedAllocDirs...)
		sort.Strings(names)
		return names
	case placeTask:
		return append([]string(nil), taskChildren...)
	}
	return nil
}
