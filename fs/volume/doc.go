// Package volume serves what is inside a volume: the nodes of its files
// and directories, their handles, and every change to them, made on the
// volume's stack of layers (fs/layer) with fd-relative calls. The tree
// (package fs) shows each volume by making its root (Plane.NewRoot) and
// knows nothing of the nodes below it.
//
// # What a volume asks of the tree
//
// All nodes of one mount share a Plane: the mount's logger, the
// directories held open below the layers (layer.DirCache), the
// passthrough state and its counters. Two questions only the tree can
// answer go through Host: the inode number of an entry of a chroot's
// host layer, and the disk limit statfs shows inside an allocation. The
// root of a layout directory's volume (an allocation's own directory,
// its alloc/, a task's directory) presents the layout's children (the
// tasks and alloc/; data/, logs/, tmp/; a task's local/, tmp/,
// secrets/, private/, alloc/) over its own entries, and asks the tree's
// Layout for them first.
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
// are put back afterwards (killpriv.RestoreMode), since chown clears set-id bits.
//
// # Data path
//
// Regular files inside volumes are served through go-fuse's loopback file
// handle (a descriptor and its read, write, lock and sync calls), which
// offers its fd for passthrough: when the kernel accepts it (root, kernel
// 6.9 or later), reads and writes never reach the daemon. Plane.Passthrough
// reports whether the kernel offered it and no data reached the daemon
// since. HANDLE_KILLPRIV_V2 stops the
// kernel from asking for security.capability before every write, and
// leaves the set-id rule to us: the kernel says per request when the VFS
// would clear the bits (a WRITE's kill flag, a SETATTR's, the empty
// SETATTR of file_remove_privs), and the daemon clears the bits ext4
// would (fs/killpriv); a file with set-id bits is served by the daemon,
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
// A node of an overlay volume remembers where it is visible (Node.layers);
// the layer package does the copy-up. What the nodes add keeps the node the
// kernel holds the same across it:
//
//   - a copied-up entry is looked up with its origin's inode number
//     (layer.Origin), so the kernel's node, st_ino and a hard-link group
//     are the ones it had below;
//   - handles opened on the lower file read the copy from then on
//     (Node.repointLocked), so an fd opened before a copy-up reads what one
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
// Every FUSE handler returns a syscall.Errno. Errors from the store and
// the allocdir contract are converted in one place, ToErrno, which the
// tree's handlers use too; it logs and returns EIO for anything it does
// not know.
package volume
