// Package btrfs speaks to btrfs through its ioctls: subvolumes, and the
// quota groups (qgroups) that count and limit what subvolumes hold. The
// store uses it to give every allocation a disk limit the kernel itself
// enforces, including for writes that never reach the daemon (FUSE
// passthrough).
//
// The model, as the kernel keeps it:
//
//	subvolume     a directory with its own tree of files (and its own
//	              inode numbers, from 256 up: two subvolumes repeat each
//	              other's numbers, and st_dev tells them apart)
//	0/<subvolid>  the level-0 qgroup the kernel makes with each subvolume:
//	              the bytes of every extent the subvolume references
//	1/<n>         a higher-level qgroup made by us; its members are
//	              level-0 qgroups (a relation), and it counts the extents
//	              any member references, once
//	max_rfer      a limit on a qgroup's referenced bytes: a write that
//	              would pass it, on any member, fails with EDQUOT at the
//	              time it reserves space, before any byte is written
//
// Counters are updated when a transaction commits; what a write reserved
// until then is rsv_data. Usage reads both from sysfs
// (/sys/fs/btrfs/<fsid>/qgroups/<level>_<id>/), which costs the same for
// an empty qgroup and one of a million files.
//
// Changing a relation keeps the counters exact only when the member's
// extents are all its own (referenced == exclusive); otherwise the
// kernel marks the accounting inconsistent and a rescan must walk the
// extent tree (Rescan).
package btrfs
