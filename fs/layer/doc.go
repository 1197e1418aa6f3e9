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
// # Extended attributes
//
// The format's own marks live in trusted.overlay.*; they are never shown
// to a task. A task's own trusted.overlay.* attributes (root may set them)
// are stored escaped as trusted.overlay.overlay.*, as overlayfs stores
// those of a nested overlay, so they round-trip and a task can never
// forge a mark (StoredXattr, ShownXattr).
package layer
