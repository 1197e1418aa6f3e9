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
// What the fs package keeps for the next daemon (node IDs, handles,
// outcomes of namespace requests, passthrough backing IDs) is its own;
// see fs/takeover.go.
package restart
