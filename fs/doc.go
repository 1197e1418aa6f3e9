// Package fs is allocfs's FUSE tree: the mount that presents every
// allocation of the store under one mount point, the nodes of its
// skeleton, the memory volumes, and AllocDir, the allocdir contract
// served from the store.
//
// # Four packages
//
// The data plane is four packages, each with one job:
//
//	fs/store   the records and the layers they stack: state files and
//	           journal, staging, remap, seal and import, flatten, the
//	           watch of backing files. No FUSE. What a record holds,
//	           what enforces disk limits, the collector, the data dir's
//	           steps and lock and the journal's framing are its
//	           subpackages (record, quota, gc, disk, lock, frame).
//	fs/layer   the on-disk layer format and every change to a stack of
//	           layers: whiteouts, opaque directories, the format's
//	           xattrs, merged lookup and listing, copy-up (origin, hard
//	           links, holes, change times), and the merge of two layers.
//	fs/volume  the nodes inside a volume: every file operation on a
//	           stack of layers, fd-relative, the data path (passthrough,
//	           set-id bits), files unlinked while open.
//	fs         the FUSE tree (this package): the mount, the skeleton the
//	           volumes are shown in, what the store's changes do to the
//	           kernel's caches, the takeover of a running mount.
//
// Beside them, fs/readside is the allocdir contract's read side, from the
// store and the layers, never through the mount; fs/layout routes the
// names of an allocation's skeleton for it and the tree alike; and
// fs/killpriv keeps set-id bits as a local filesystem does, for the
// volume nodes and the tree's handler chain.
//
// Below the tree, fs/transport is the FUSE connection itself: allocfs's
// own request loop over /dev/fuse, which hands each request to go-fuse's
// node bridge (server.go; go-fuse's fuse.Server remains an option, and
// serves --debug-fuse).
//
// The tree makes a volume's root node (volume.Plane.NewRoot) where the
// layout puts a volume, and answers the two questions the volume nodes
// ask of it (volume.Host: the inode numbers of a chroot's host layer,
// the disk limit statfs shows); a layout directory's children are its
// Layout (allocLayout, sharedLayout, taskNode), which the directory's
// volume root consults first (volume.Layout).
//
// The tree reads the store's committed records (store.Store.View) on
// every lookup and hears of changes through store.Store.OnChange; it
// never changes a record itself except through the store's methods.
//
// # The tree
//
//	<mount>/                      rootNode: one directory per allocation
//	└── <allocID>/                volume.Node of volume ".", allocLayout
//	    ├── alloc/                volume.Node of volume "alloc", sharedLayout
//	    │   └── data|logs|tmp/    volume.Node: the volume's upper layer
//	    └── <task>/               volume.Node of volume "<task>", taskNode
//	        ├── local/ tmp/       volume.Node
//	        ├── secrets/ private/ volume.Node over a detached tmpfs (memvol.go)
//	        └── alloc/            volume "alloc" again, as a second view
//
// Every directory of an allocation is a volume's root, as a plain
// directory accepts any entry: the layout's children (the Layout each
// layout directory's volume root consults first) are presented over the
// volume's own entries, whose names they take. An allocation's own
// directory and its alloc/ keep the synthetic inode numbers their parents
// list them by.
//
// One router, layout.Child (fs/layout), says what each name of the
// skeleton leads to; the tree asks it one lookup at a time, the read side
// of the allocdir contract (fs/readside) a whole path at once, so the
// two never disagree.
//
// The layout (which directories are allocations, tasks and volumes) is
// read from the allocation's record; a mkdir of a layout name makes the
// volume or task it names, and everything else lands in the volume of the
// directory it is made in. The <task>/alloc view shows the same volumes
// as alloc/ without a bind mount.
// Inode numbers inside volumes are the backing inode numbers with a slot
// mixed into their high bits (identity.go): each place a volume is shown
// (an allocation's own paths, each <task>/alloc view) has its own slot, so
// that a layer shown by two allocations (snapshot-mode migration) or by
// two views is two sets of nodes, each knowing its own volume. Numbers stay
// stable for as long as the allocation lives in the mount, so watchers
// that compare device and inode behave; after a restart of the daemon the
// slots, and so the high bits, may differ.
//
// # Kernel caching
//
// Entries and attributes are cached for MountOptions.StableTimeout: every
// change made through the mount passes through the kernel, which keeps its
// own caches right. Changes allocfs makes itself (creating, remapping or
// destroying an allocation) reach the kernel through the store's OnChange
// hook, as NotifyEntry and NotifyDelete, before the call that made them
// returns. The hook runs on the goroutine that changed the store, never in
// a FUSE request handler, where a notification can deadlock. Failed
// lookups are cached briefly.
//
// # Files
//
// The package's files are layered: each uses only what the files below it
// declare (TestFilesFormNoCircle checks it), so that one can be read
// knowing only those.
//
//	mount.go        NewMount, AdoptMount, Unmount: the mount's life, and
//	                what a change of the store does to the kernel's caches
//	server.go       the handler chain in front of go-fuse's bridge
//	takeover.go     where a node ID an earlier daemon handed out leads
//	allocdir.go     AllocDir, the allocdir contract over the store
//	namespace.go    mkdir, rmdir and rename of the layout's directories
//	tree.go         the mount root and the layout children of an
//	                allocation's directories (allocLayout, sharedLayout,
//	                taskNode)
//	chroot.go       the host layer of a chroot task directory
//	memvol.go       the memory volumes' life in the mount
//	deferred.go     notifications deferred past a request handler
//	mountstate.go   the Mount and its options
//	chrootenv.go, memvolume.go, opcount.go, identity.go, releaseorder.go
//	                what the Mount holds: the chroot environment, the
//	                memory volumes, request counts, view slots, the order
//	                of RELEASE and FORGET
//
// # Never through the mount
//
// The daemon must not access its own mount point: a request handler that
// waits on the mount it serves deadlocks. Everything in-process works on
// the store directly.
package fs
