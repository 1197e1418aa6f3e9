// Package fs is allocfs's FUSE tree: the mount that presents every
// allocation of the store under one mount point, the nodes of its
// skeleton, volumes and memory volumes, and AllocDir, the allocdir
// contract served from the store.
//
// # Three packages
//
// The data plane is three packages, each with one job:
//
//	fs/store   the records and the layers they stack: state files and
//	           journal, staging, remap, seal and import, flatten, the
//	           collector, the watch of backing files. No FUSE.
//	fs/layer   the on-disk layer format and every change to a stack of
//	           layers: whiteouts, opaque directories, the format's
//	           xattrs, merged lookup and listing, copy-up (origin, hard
//	           links, holes, change times), and the merge of two layers.
//	fs         the FUSE tree (this package): nodes only, serving what the
//	           store records in the layer format.
//
// Below the tree, fs/transport is the FUSE connection itself: allocfs's
// own request loop over /dev/fuse, which hands each request to go-fuse's
// node bridge (server.go; go-fuse's fuse.Server remains an option, and
// serves --debug-fuse).
//
// The tree reads the store's committed records (store.Store.View) on
// every lookup and hears of changes through store.Store.OnChange; it
// never changes a record itself except through the store's methods.
//
// # The tree
//
//	<mount>/                      rootNode: one directory per allocation
//	└── <allocID>/                allocNode: 0755, the agent's
//	    ├── alloc/                sharedNode: 0777 nobody
//	    │   └── data|logs|tmp/    volNode: the volume's upper layer
//	    └── <task>/               taskNode: 0777 nobody
//	        ├── local/ tmp/       volNode
//	        ├── secrets/ private/ volNode over a detached tmpfs (memvol.go)
//	        └── alloc/            sharedNode again, as a second view
//
// One router, layoutChild (layout.go), says what each name of the
// skeleton leads to; the tree asks it one lookup at a time, the read side
// of the allocdir contract (storeFS.locate) a whole path at once, so the
// two never disagree.
//
// The skeleton (everything that is not inside a volume or a memory tree)
// is synthesised from the allocation's state and cannot be written. The
// <task>/alloc view shows the same volumes as alloc/ without a bind mount.
// Inode numbers inside volumes are the backing inode numbers with a slot
// mixed into their high bits (identity.go): each place a volume is shown
// (an allocation's own paths, each <task>/alloc view) has its own slot, so
// that a layer shown by two allocations (snapshot-mode migration) or by
// two views is two sets of nodes, each knowing its own volume. Numbers stay
// stable for as long as the allocation lives in the mount, so watchers
// that compare device and inode behave; after a restart of the daemon the
// slots, and so the high bits, may differ.
//
// # Backing entries
//
// A volume node holds no path and no descriptor of its own: each
// operation names its entry through the volume's layer.Stack as the
// directory that holds it, opened beneath the layer root, and the name
// in it (backing.go, layer.Loc), and makes its change with an *at() call.
// So a task's paths are limited by the mount's PATH_MAX only, a symbolic
// link planted in a layer is never followed, and the daemon's descriptors
// are bounded by what is open, not by what the kernel caches. New
// entries are made as root and given the caller's uid and, in a setgid
// directory, the directory's group, in one chown; the mode bits asked for
// are put back afterwards (restoreMode), since chown clears set-id bits.
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
// # Data path
//
// Regular files inside volumes are served through go-fuse's loopback file
// handle (a descriptor and its read, write, lock and sync calls), which
// offers its fd for passthrough: when the kernel accepts it (root, kernel
// 6.9 or later), reads and writes never reach the daemon. NewMount reports
// whether the kernel offered passthrough. HANDLE_KILLPRIV_V2 stops the
// kernel from asking for security.capability before every write, and
// leaves the set-id rule to us: the kernel says per request when the VFS
// would clear the bits (a WRITE's kill flag, a SETATTR's, the empty
// SETATTR of file_remove_privs), and the daemon clears the bits ext4
// would (killpriv.go); a file with set-id bits is served by the daemon,
// so that every write to it is seen. A lower file of a writable overlay is served by
// the daemon too (the kernel binds one backing file to an inode, and a
// copy-up must replace it), with its page cache kept across opens. The
// kernel refuses passthrough and daemon-served handles of one inode at
// once, so each node counts both.
//
// Extended attributes of the layer format (trusted.overlay.*) never show
// through the mount; a task's own trusted.overlay.* are stored escaped
// (layer.StoredXattr).
//
// # Copy-up a task cannot see
//
// A node of an overlay volume remembers where it is visible (volNode.layers);
// the layer package does the copy-up. What the tree adds keeps the node the
// kernel holds the same across it:
//
//   - a copied-up entry is looked up with its origin's inode number
//     (layer.Origin), so the kernel's node, st_ino and a hard-link group
//     are the ones it had below;
//   - handles opened on the lower file read the copy from then on
//     (volNode.repointLocked), so an fd opened before a copy-up reads what one
//     opened after it reads;
//   - a merged directory shows the link count of its merged listing;
//   - change times come through layer.Ctimes, which hides allocfs's own
//     changes;
//   - a task's character device 0/0, made by mknod or left by a rename
//     with RENAME_WHITEOUT, is marked in every volume, so that no stack
//     takes it for a whiteout later.
//
// # Errors
//
// Every FUSE handler returns a syscall.Errno. Errors from the store and the
// allocdir contract are converted in one place, toErrno, which logs and
// returns EIO for anything it does not know.
//
// # Never through the mount
//
// The daemon must not access its own mount point: a request handler that
// waits on the mount it serves deadlocks. Everything in-process works on
// the store directly.
package fs
