// Package store is allocfs's backing store: the records of allocations
// and the layers they stack, on a plain data directory, changed crash-
// atomically. It knows nothing of FUSE; the tree in package fs serves
// what it records, and the layer format (package layer) says what a
// layer's entries mean.
//
// Its own job is to change records and layers crash-atomically; the rest
// is in packages of one job each: record (what a record holds, and when
// it is valid), disk (the steps a crash can fall between), lock (one
// store per data dir), frame (the journal's framing), quota (what makes
// the kernel enforce disk limits) and, above the store and through its
// exported methods only, gc (what to destroy, and when).
//
// # Layout on disk
//
// All bytes live as plain files under the data directory:
//
//	<data-dir>/lock                   flock(2)ed by the one store that has the
//	                                  data dir open; says its PID and mount
//	<data-dir>/state/<allocID>.json   the allocation's record (tasks, status,
//	                                  which layers back which mount point)
//	<data-dir>/state/journal          the write-ahead log of record changes
//	<data-dir>/layers/<layerID>/      a layer: an ordinary directory tree
//	<data-dir>/staging/               half-received snapshots, merges in
//	                                  progress; emptied at every start
//
// A volume is a stack of layers (one writable upper over read-only lowers)
// attached at a fixed point of an allocation: alloc/data, alloc/logs,
// alloc/tmp, <task>, <task>/local and <task>/tmp each have their own.
// Layers use the kernel overlayfs's on-disk format (package layer:
// whiteouts are character devices 0/0, opaque directories carry
// trusted.overlay.opaque), so `mount -t overlay` can always recover a
// volume: a write to a lower
// entry copies it up first (FICLONE where the filesystem can). A volume
// can be frozen read-only (EROFS).
//
// # Crash-atomic changes
//
// Every change of the records is one intent in the journal (journal.go):
// the records as the change leaves them, and the empty layers it made.
// Appending and syncing the intent is the change's one fsync and the
// instant it happens; the state files are rewritten afterwards without a
// sync, and a checkpoint (at open, at close, and when the journal grows
// past a megabyte) syncs them and empties the journal. So a migration,
// which changes two records, or a flatten, which changes every record
// stacking the merged pair, is as atomic as a change of one: whatever
// instant the daemon dies at, the next Open replays the journal and
// shows the state before or after, never a data layer writable under two
// allocations. Every step that changes the data dir goes through one
// small interface, disk.Disk, which OpenWith takes: tests pass one that
// kills the store at each step, or drops what a power cut would
// (crash_test.go).
//
// A layer that no record names is an orphan: what a crash left between
// making a layer and journaling the change that names it, a removal that
// failed, a placeholder a migration replaced, or layers a flatten merged
// away once the allocations that retained them are gone. Nothing else can
// be unnamed, since handing layers over is one intent, so every
// collector pass removes orphans (Sweep), logging each, and a failed
// removal is tried again by the next pass.
//
// # Disk limits
//
// With Options.Quotas on a btrfs data dir, every new layer is a subvolume
// and every allocation with a limit (record.State.Disk) a qgroup over the
// upper layers of its volumes; on xfs or ext4 with project quotas, a
// project whose ID its upper layers carry. Package quota holds both
// mechanisms; the store decides when they act. Either way the kernel
// holds the allocation to its limit for every write, the daemon's or
// passthrough's. After each intent is applied the store settles the
// kernel's groups with the records; at open it settles them all.
// Subvolumes number their inodes alike, so on btrfs each record tags its
// layers (record.State.Tags) for the mount to tell their files apart.
// docs/design/quotas.md has the whole design.
//
// # Migration and collection
//
// Migration between two allocations of one store changes two records and
// nothing else: adopt (MigrationAdopt, the remap) gives the new allocation
// the previous one's layers and leaves the previous one a read-only
// MIGRATED-TO note; snapshot (MigrationSnapshot, the seal) freezes the
// previous volumes and stacks a fresh writable layer over them for the
// new one. Create, told the previous allocation and the kind by its
// CreateOptions, makes the new allocation and hands it the data in the
// same intent; Migrate hands it to an allocation that exists already (the
// allocdir contract's Move). A remote snapshot is extracted into
// staging/, synced, and becomes layers by rename (Create with
// MigrationRemote and the received directories). Both share one set of
// checks: a previous allocation that has not handed its data over yet
// and, for Create, is terminal. Destroy only removes layers no other allocation
// references, so layers stacked under a live allocation survive their
// owner; Pin keeps an allocation whose snapshot is streaming from being
// destroyed. The collector (package gc), the node's only one, decides
// which terminal allocations to destroy and when, and asks the store to,
// then to sweep and flatten: all through the store's exported methods,
// since deciding is a policy of the node's and the store only makes
// changes. An Observer (SetObserver; package metrics is one) is told of
// every migration and of every decision of the collector, reasons
// reduced to a fixed set (GCReason) fit for a metric's label.
//
// # Flattening
//
// Every snapshot migration stacks one more layer, and a lookup that misses
// the upper layer costs one lstat per lower, so Flatten (run by the
// collector after each pass) merges adjacent lower layers of any volume
// with more than MaxLowers of them. Two layers merge only when every
// volume that references either stacks them the same way, which a stopped
// previous allocation's frozen view (its sealed layer as a read-only
// upper) prevents until it is collected; pinned allocations are left
// alone. The merged layer is built in staging/ by link(2) (layer.Merge),
// so no byte is copied and inodes, and the open files on them, stay as
// they were; whiteouts and opaque marks are kept only where layers remain
// below it.
// It is synced, renamed into layers/, and every record that stacked the
// pair is switched to it in one intent, each retaining the pair
// (record.State.Retained): a view the mount built before the switch keeps
// reading the pair's paths for as long as the kernel holds it. Once those
// allocations are gone the pair is an orphan, and the sweep removes it.
package store
