// Package restart keeps an allocfs mount alive while its daemon restarts,
// crashes or is upgraded, and hands it to the next daemon.
//
// # What must outlive the daemon
//
// A FUSE connection lives while any process holds its /dev/fuse file, and
// a memory volume (a task's secrets/ and private/, a tmpfs instance) while
// any descriptor of it is open. When the daemon is the only holder, its
// end (kill -9, the OOM killer, an upgrade) ends the mount under every
// running task and loses their secrets. So something else keeps a copy of
// each while no daemon runs:
//
//   - the holder (holder.go): a small process, `allocfs fuse-holder`,
//     started by serve in a session of its own with the connection as
//     HolderFD; it answers a few one-line requests on a unix socket in
//     the data dir (version, fd, keep, drop, names, get, stop) and never
//     reads the connection. It ends when the connection does.
//   - or, under a systemd unit of Type=notify, systemd's descriptor store
//     (systemd.go): FDSTORE=1 with the names "fuse" and "mem-<hash>",
//     passed back to the next start as LISTEN_FDS. No library is needed
//     for sd_notify's datagrams.
//
// HolderKeeper and SystemdKeeper are the two fs.MemoryKeeper
// implementations; a daemon gives its mount the one in use.
//
// # Handing over
//
// A daemon stopping with a running allocation leaves the mount to the
// keeper (Mount.Park) instead of unmounting; the next serve takes the
// connection (TakeHeld, or ListenedFds under systemd), checks that it is
// the one the data dir recorded for its mount point (CheckHeld), and
// adopts it (fs.AdoptMount): the kernel resends what the old daemon had
// read and not answered. An upgrade asks the running daemon to hand over
// with SigHandOver (TakeOverRunning), after checking that it can take the
// mount at all: a refusal (RefuseHandOver: memory volumes in use, no
// keeper) leaves the running daemon serving. SigFullStop unmounts
// whatever runs.
//
// # What the next daemon inherits from the kernel
//
// A daemon that adopts a connection inherits the kernel's view of it:
// node IDs and file handles handed out by a process that is gone, and the
// requests that process read and never answered, which the kernel sends
// again. Each daemon keeps, in <data-dir>/fuse (StateFile), what the next
// one needs to make sense of them:
//
//   - the session (session.go): the INIT the kernel and the first daemon
//     agreed, and the generation, which the next daemon counts on from;
//   - the outcomes of namespace requests (Outcomes): a resent mkdir or
//     unlink whose outcome is recorded is answered from the record, not
//     run again;
//   - the passthrough backing IDs (BackingIDs), which the next daemon
//     must release;
//   - the files unlinked while open (Unlinked), which no path leads to
//     and the kernel still names;
//   - and, the tree's own, how node IDs map to files (fs/identity.go).
//
// TakeoverFS stands in front of go-fuse's bridge and resolves, on first
// use, each node ID and handle of an earlier daemon (fs/takeover.go).
package restart
