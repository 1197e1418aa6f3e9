// Package disk is the store's one way of changing its data dir: the Disk
// interface, each of whose calls is one step a crash can fall before or
// after, and OS, whose every step is the system call.
//
// # Why it is a package of its own
//
// The store promises that whatever instant the daemon dies at, the next
// start shows each change whole or not at all. That promise is only as
// good as the tests that break it on purpose, and they can only break
// what they can see: so the store takes every step through a Disk, and
// its tests pass one that kills it at the Nth step (and, for a power cut,
// throws away what was not synced), or fails one step as a full disk
// would. A step is small and named by what the kernel does (mkdir,
// fsync, renameat2, link(2) of fd-relative names), never by what the
// store means by it, so that the list of steps is the list of what a
// crash can interrupt.
//
// # What a step may touch
//
// Paths are absolute and lie under the data dir:
//
//	<data-dir>/state/<allocID>.json   written to a .tmp and renamed in; synced
//	                                  at a checkpoint
//	<data-dir>/state/journal          appended and synced, truncated
//	<data-dir>/layers/<layerID>/      made (Mkdir, Lchown, Chmod, a note by
//	                                  WriteFile), renamed in from staging/,
//	                                  removed whole (RemoveAll)
//	<data-dir>/staging/               merges built by MkdirAt and LinkAt,
//	                                  synced by Syncfs
//
// The store builds them from its own directory names and IDs it made or
// checked, never from a request. What tasks write into layers goes
// through the mount, not through a Disk.
package disk
