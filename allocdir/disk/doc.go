// Package disk is the plain on-disk implementation of the allocation
// directory contract ([allocdir.Interface]): real directories under
// <root>/<allocID>, laid out and behaving as Nomad's own. It is the
// reference that the FUSE-backed implementation of package fs is compared
// against, and the conformance suite (allocdir/allocdirtest) runs against
// both.
//
// Everything the agent creates is created relative to an open directory
// fd and opened with openat2(2) beneath it, refusing symbolic links, so a
// task that swaps one of its directories for a link cannot steer the
// agent outside the allocation. As root, secrets/ and private/ are
// size-capped tmpfs mounts, which Destroy unmounts before it removes the
// tree; without root they are plain directories.
//
// Move between two on-disk allocations renames the migrated directories;
// from any other implementation it copies through that implementation's
// snapshot.
//
// The package needs Linux (openat2, tmpfs, mount); it is empty elsewhere.
package disk
