// Package gc is the node's collector: it decides which terminal
// allocations to destroy, and when, and has the store destroy them.
//
// Nomad's client collects an allocation when the node is over one of its
// triggers (Config, with Nomad's names and defaults): more allocations
// than gc_max_allocs, a data dir fuller than gc_disk_usage_threshold, or
// its inodes more used than gc_inode_usage_threshold. A pass destroys
// terminal allocations, the one stopped longest ago first, until the
// node is under every trigger again, and logs why it took each one.
// Explicit requests (CollectAll for a node GC, CollectAlloc for one
// allocation) take terminal allocations whatever the triggers, through
// the same Collector, so that a request and the timer (Run) never work
// at once.
//
// Some allocations are never taken: a running one, and one whose snapshot
// a migration is streaming (the store's Pin). The timer's passes and
// CollectAll leave alone one Nomad's client made through the mount
// (record.OriginMount), which Nomad removes itself; CollectAlloc, asked
// for one allocation by name, leaves that check to its caller (the node
// service refuses such a request). A
// layer that another allocation still stacks survives its owner: the
// store removes only layers nothing names. Every pass ends by tidying
// the data dir: it sweeps orphan layers, flattens snapshot chains (a
// chain becomes mergeable only once the stopped allocations holding its
// old layers are gone, so here rather than in a migration), and settles
// the disk limits again where a settle failed. A failure never stops a
// pass: it is logged and the pass goes on.
//
// The collector holds no state on disk and reaches the store only
// through its exported methods: what to collect is the node's policy,
// kept apart from how the store changes its records and layers
// crash-atomically. It tells the store's Observer of each allocation it
// tried to destroy and of each pass (store.GCReason,
// store.CollectorPass), for the node's metrics.
package gc
