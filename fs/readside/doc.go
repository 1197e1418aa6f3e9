// Package readside is the read side of an allocation: what the allocdir
// contract's List, Stat, ReadAt, followers and snapshots read. It reads
// the store and the layers, never the mount (a daemon that reads its own
// mount from a request handler deadlocks, and the read side serves
// allocations that are not mounted at all).
//
// FS is the allocdir.ReadFS that allocdir.ReadSide resolves paths in. The
// skeleton is synthesised from the allocation's record with the same
// router the FUSE tree uses (fs/layout), so the two never disagree on
// where a path leads. A volume is read from its layers beneath
// descriptors of their roots (ovlReadFS merges a stack in the layer
// format, stackLayerFS reads one layer of it); a memory volume, which
// exists only in the mount, is read beneath a descriptor the mount opens
// (Mount.MemoryRoot), and shows empty where the mount has not made it.
// A chroot task's directory shows the host layer below its own, as the
// mount does (Mount.HostLayer).
//
// FS is also an allocdir.BackedFS: a volume path's backing file is in
// the volume's upper layer, which the followers watch with inotify.
package readside
