// Package layer is allocfs's on-disk layer format and the functions that
// read and change a stack of layers: what the FUSE tree serves and what
// the store's read side and merges read, so that both agree on what a
// volume holds.
//
// # Layers and stacks
//
// A layer is an ordinary directory tree under <data-dir>/layers/<id>/. A
// volume is a stack of layers: one writable upper layer over read-only
// lower ones, top first. A name is looked up top-down; the first layer
// that holds it shows it. Two marks change that, both in the kernel
// overlayfs's format, so that `mount -t overlay` can always recover a
// volume with no allocfs at hand:
//
//	whiteout   a character device 0/0 in an upper layer: the name is
//	           deleted, whatever lower layers hold under it
//	opaque     trusted.overlay.opaque=y on an upper directory: it hides
//	           what lower layers hold at its path (a directory removed
//	           and made again, or renamed into place)
//
// A directory that is not opaque merges with the directories at its path
// in the layers below it, down to the first opaque one; a non-directory
// hides everything below it.
//
// A host layer (host.go), the host's files a chroot shows below a task's
// layer, is no layer overlayfs could ever show, so what a task removes
// from it alone needs no mark in overlayfs's format: a record in the
// task layer's removal log (Removals, removals.go), one append, hides the
// host's entry at its path and below it, and never the upper layer's. A
// name a lower layer of the store shows too still takes a whiteout. The
// log lives beside the layers (<data-dir>/chroot/removed/<layer>), goes
// with its layer, and reads back right whatever a crash cut off its end.
//
// # Reaching entries: fd-relative, never by path
//
// No function here builds a backing path to reach an entry. A Loc names
// one: the directory that holds it, opened (O_PATH) with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS beneath its layer's root, and its
// name there, which every call passes to an *at() system call
// (getxattrat and its siblings for attributes, fchmodat2 for modes).
// Two things follow:
//
//	depth      PATH_MAX bounds the path a task gives relative to its
//	           own directory, never the data dir's prefix in front of
//	           it; a path inside a layer longer than PATH_MAX is opened
//	           in steps, each beneath the directory the last one opened
//	links      a symbolic link swapped into a layer for a directory (a
//	           task racing an operation) is an error, never a way out
//
// Layer roots, where every walk starts, come from a RootCache: bounded,
// pinned while in use, so a busy mount does not re-walk the data dir for
// each call and never keeps one descriptor per layer it ever served. The
// directories entries are named in come from a DirCache the same way
// (both are an fdCache), which whoever moves or removes a directory of a
// layer tells to forget.
// PathLoc names an absolute path for the store's own walks and tests.
//
// # Copy-up
//
// A write to an entry shown from a lower layer copies it up first
// (Stack.CopyUp): the copy gets the entry's data (cloned with FICLONE
// where the filesystem can, else copied around holes), mode with set-id
// bits, owner, times and extended attributes, all set on an O_TMPFILE
// before it gets its name, so a crash or ENOSPC never leaves half a copy.
// Three more things keep the copy-up invisible to a task:
//
//	origin     trusted.overlay.allocfs.origin on the copy names the inode
//	           number it had below; the tree keeps showing that number,
//	           so the kernel's node, st_ino and hard links stay the same
//	links      a file with more names copies up once, and every other
//	           name the stack still shows is linked to the copy at once
//	           (Links walks a lower layer once to find them), so the
//	           names stay one file with the right link count
//	ctimes     allocfs's own changes (the copy, a directory's times put
//	           back after a copy into it) do not show in ctime (Ctimes)
//
// Copy-up is the cost a snapshot migration puts off until the first
// write, so a stack tells its CopyUps observer of each entry it copies,
// with its type, size and time (the node's metrics count them).
//
// A task's own character device 0/0 (mknod, or a rename with
// RENAME_WHITEOUT) carries trusted.overlay.allocfs.device, so that it is
// never taken for a whiteout, here or in a stack that takes the layer in
// later (IsWhiteoutAt).
//
// # Extended attributes
//
// The format's own marks live in trusted.overlay.*; they are never shown
// to a task. A task's own trusted.overlay.* attributes (root may set them)
// are stored escaped as trusted.overlay.overlay.*, as overlayfs stores
// those of a nested overlay, so they round-trip and a task can never
// forge a mark (StoredXattr, ShownXattr).
package layer
