// Package layout is an allocation's layout, routed in one place. Both the
// FUSE tree (one lookup at a time) and the read side of the allocdir
// contract (a whole path at once) ask Child what a name of a layout
// directory is, so the two can never disagree on where a path leads:
//
//	<alloc>/                  Alloc   the allocation's own volume "."
//	├── alloc/                Shared  volume "alloc", view 0
//	│   └── data|logs|tmp/    Volume  "alloc/<name>", the view's
//	└── <task>/               Task    the task's own volume "<task>"
//	    ├── alloc/            Shared  volume "alloc", view task index + 1
//	    ├── local/ tmp/       Volume  "<task>/<name>", view 0
//	    └── secrets/ private/ Memory
//
// A volume renamed inside its allocation (mv alloc/data alloc/d2, as on
// a local filesystem) keeps its layers under its new key ("alloc/d2"),
// and is a Volume child of its new directory.
//
// Any other name of one of these directories is an entry of its own
// volume (VolumeOf), as any name is in a plain directory: libcontainer
// keeps its state in alloc/container, jobs render templates into
// alloc/. The layout is computed from the allocation's record
// (record.State) alone: a volume the record no longer has, or a
// directory it says is gone, is no child.
package layout
