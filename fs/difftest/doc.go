// Package difftest is the machinery of a differential file-system test:
// a seeded generator of operations (Gen), an executor that runs one
// operation on a side, a directory fd with its own pool of open fds
// (Side), a snapshot of a whole tree (Snapshot) and the comparisons of
// two results (CompareResults) and two trees (CompareTrees). It knows
// nothing of allocfs or FUSE: the test in package fs runs it with one
// side on an allocfs volume and the other on a plain directory of the
// backing ext4, both holding the tree Populate builds, and treats every
// difference as a divergence of allocfs from the reference.
//
// # Operations
//
// Operations are generated from the seed alone, blind to the state of
// the trees, so that a seed replays the same sequence whatever the file
// systems answer. Paths are one to three components from a four-name
// alphabet, so that operations collide with each other and with the
// seeded tree. Every call is relative to the side's root fd (the *at
// calls), or names the entry through /proc/self/fd/<root>/<path> where
// Linux has no *at form (xattrs, truncate). Fds live in Slots numbered
// slots per side, so that an fd operation means the same on both sides;
// an op on an empty slot answers EBADF on both without a call.
//
// Besides the calls with a name of their own, three ops stand for what
// tasks do in several calls: mmap (a store through a shared mapping of a
// slot's file, within its size, flushed by msync or left to munmap and
// writeback; a fault on the mapping is an error, not a crash),
// copy_file_range (from a path opened for it into a slot), and fifo (an
// existing FIFO opened O_RDWR|O_NONBLOCK, with O_APPEND or
// O_CREAT|O_TRUNC, into a slot, and written, often past what the pipe
// holds).
//
// # What is compared
//
// For each operation: the errno (by name), the byte count, the bytes
// read or the link target or xattr value, the names listed, and, after an
// operation on an fd, its fstat (as Attr). For a tree: every name, with
// its type, permission bits, set-id and sticky bits, owner, size, nlink,
// rdev of devices, sparseness, data, symlink target, xattrs, its hard-link
// group (the other names of its inode), any error in reading it, and,
// since the previous snapshot, whether its mtime and ctime changed and
// whether its st_ino changed.
//
// # Normalisations, and why
//
//   - st_dev and st_ino are never compared between the sides: they are two
//     file systems. Inode numbers are used within a side, for hard-link
//     groups and to see whether the object at a name is still the same.
//   - atime is ignored: it depends on relatime and on the snapshots' own
//     reads.
//   - mtime and ctime are compared as changed-or-not since the previous
//     snapshot, never as values: the trees are built at different
//     instants. Only for a name that holds the same object as at the
//     previous snapshot on both sides (same reference inode, same type).
//   - A directory's size is not compared: ext4 sizes a directory by the
//     blocks its entries ever needed, which depends on its history and on
//     the layers of a merged directory, not on what it holds now.
//   - st_blocks is not compared; a regular file is compared as having a
//     hole or not (SEEK_HOLE before its end), on every snapshot: block
//     counts depend on allocation granularity, delayed allocation and
//     whether ext4 keeps an inode's xattrs in the inode or in a block of
//     their own (the layer format's trusted.overlay.* xattrs take room in
//     the inode, so a task's xattrs spill sooner), but a hole that becomes
//     data (a copy-up that fills holes) is visible to a task.
//   - Directory listings are compared as sorted sets of name and d_type,
//     "." and ".." included: the order of getdents is a property of the
//     directory's hash, not of its content.
//   - Data is compared by its SHA-256. A snapshot reads an entry's data,
//     listing and xattrs again only when its inode, size, mtime or ctime
//     changed: on the reference none of these changes without one of
//     those, and if allocfs changes one without, the changed-or-not
//     comparison of mtime or ctime reports it.
//   - Xattrs named trusted.overlay.* are left out of tree snapshots: they
//     are allocfs's own on-disk format in its backing layers. A listxattr
//     operation compares the raw list, so that one shown through the
//     mount is still a divergence.
//   - Device nodes are never opened (the open answers "skipped: device
//     node" on a side that sees one): the mount is nodev by design, the
//     reference directory is not, and opening is what nodev forbids.
//   - Every open adds O_NONBLOCK and O_CLOEXEC, so that a FIFO neither
//     blocks the test nor leaks into the unprivileged helper.
//   - After a renameat2 with RENAME_WHITEOUT that fails, the times of the
//     two parent directories are not compared: ext4 (Linux 6.18) stamps
//     them even then (it makes the whiteout before it finds, say, that
//     the target directory is not empty), and allocfs keeps the rule
//     that a failed operation changes nothing. Both sides then start
//     again from the seeded tree, as after a divergence, since the
//     stamped times would differ in every later comparison.
//   - A FIFO's mtime and ctime are not compared after a read or write
//     through an fd (a read, write or fifo op): the kernel marks every
//     FUSE inode but a regular file S_NOCMTIME (fs/fuse/inode.c,
//     fuse_iget) and serves pipe I/O itself, so the server never learns
//     of it and no FUSE filesystem can show it (kernel overlayfs cannot
//     either: its inodes are S_NOCMTIME too). TestFIFOTimesAreTheKernels
//     in package fs measures it; docs/design/posix-limits.md says more.
//   - An op whose path leads out of the side's root through a symbolic
//     link (a target such as "../b"; openat2 RESOLVE_BENEATH answers EXDEV
//     on the reference) has its result left uncompared: one root is an
//     allocation's volume, the other a temporary directory, and what lies
//     around them differs.
//   - A snapshot also reports the names whose mtime or ctime its own
//     reading changed; reading and listing must change neither.
package difftest
