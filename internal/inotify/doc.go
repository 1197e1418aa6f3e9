// Package inotify wakes followers of files when the kernel reports a
// change near them, so that log followers and BlockUntilExists need not
// poll.
//
// The kernel reports every change to a directory's entries, and every
// write to a file in it, to inotify watches on that directory, whichever
// path the change came through: a write that FUSE passthrough hands
// straight to a backing file never reaches the daemon, yet its backing
// directory's watch sees it. Followers therefore wait on inotify instead of
// polling, and one [Notifier] serves them all with a single inotify
// instance and at most one watch per directory.
//
// A follower takes a [Subscription], arms it on the path it follows and
// waits on its channel. A wake-up only says "look again": the follower
// stats the file and decides what changed, then re-arms, because the
// deepest existing directory on its path may have changed. A follower
// whose Arm fails (the watch limit, say) must poll instead.
//
// inotify exists only on Linux: the package is empty elsewhere.
package inotify
