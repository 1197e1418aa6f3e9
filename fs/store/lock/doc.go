// Package lock keeps a data dir to one store at a time: the flock(2) of
// <data-dir>/lock, taken by the store's Open and dropped by its Close.
//
// Two daemons on one data dir would each create allocations the other
// does not know of and collect layers the other still uses, so the
// second one must fail at once, and say why: the file holds what the
// holder wrote about itself,
//
//	pid 4242, mount /var/lib/allocfs/mnt
//
// which ErrLocked's message repeats, and which Holder reads for the
// daemon that wants to know whom to ask for a hand-over or which stale
// mount is its own. The kernel drops the lock with the last descriptor,
// so a crashed daemon never leaves the data dir locked; Release unlocks
// explicitly all the same, since a child forked at that moment holds a
// copy of the descriptor until it execs.
//
// It is a package of its own because nothing in it is about records or
// layers: it is the data dir's answer to "who has me open", which the
// daemon and the live-restart machinery ask without opening a store.
package lock
