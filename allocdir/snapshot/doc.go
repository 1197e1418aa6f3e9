// Package snapshot writes and unpacks the tar archives that carry an
// allocation's migrated data between nodes: Nomad's migration snapshot,
// which holds alloc/data and then each task's local/.
//
// [Write] archives an allocation directory through an fs.FS, so that the
// on-disk and the FUSE-backed implementations share one walk. The format
// is Nomad's: a Nomad agent reads what Write produces, and Extract reads
// what Nomad's writer produces. A failure after the HTTP status was sent
// is reported in-band, by the error entry Nomad uses.
//
// [Extract] is the only way a snapshot received from another node should
// ever be unpacked. The sender may be compromised, so every entry is
// checked against the layout and the entry types a writer produces,
// nothing is written through a symbolic link or outside the destination,
// and the destination appears only once the whole archive was accepted.
// Refusals wrap allocdir.ErrArchive, which tells an archive's fault (a
// crafted entry, a limit, a truncated stream) from this node's (a full
// disk, a failing read).
//
// The package needs Linux (openat2, renameat2, raw fd I/O); it is empty
// elsewhere.
package snapshot
