package store

import "time"

// Observer is told of the store's migrations and of its collector's
// decisions, for the node's metrics (package metrics). Its methods run
// on the goroutine that made the change, some with the store's writeMu
// held: they must return at once and never call the store.
type Observer interface {
	// Migrated is told of every migration into a new allocation, done
	// (err nil) or refused or failed, with the time the store took: for
	// MigrationRemote that is the import of a fetched snapshot, the fetch
	// itself being migrate.Fetch's.
	Migrated(kind MigrationKind, d time.Duration, err error)
	// Collected is told of every allocation the collector tried to
	// destroy, and why; err is nil when it was collected.
	Collected(reason GCReason, err error)
	// CollectorPass is told of every pass of the collector, with what
	// triggered it, the node's pressure at its start (GCNone when the
	// node was under every threshold, or the pass was requested), how
	// many terminal allocations it left because a migration pinned them,
	// how many orphan layers its sweep removed and how many merges its
	// flatten made.
	CollectorPass(p CollectorPass)
}

// MigrationKind is how a new allocation gets a previous one's data: what
// CreateOptions.Migration and Migrate ask for, and what an Observer is
// told of.
type MigrationKind string

const (
	// MigrationAdopt takes the previous allocation's layers over (the
	// remap): they are written in place from then on.
	MigrationAdopt MigrationKind = "adopt"
	// MigrationSnapshot stacks a writable layer over the previous
	// allocation's layers, which it freezes (the seal).
	MigrationSnapshot MigrationKind = "snapshot"
	// MigrationRemote imports a snapshot fetched from another node
	// (CreateOptions.Imported).
	MigrationRemote MigrationKind = "remote"
)

// GCReason is why the collector destroyed an allocation: one of a small
// fixed set, so that it can label a metric (the log line says more).
type GCReason string

const (
	// GCNone: the node is under every threshold.
	GCNone GCReason = ""
	// GCMaxAllocs: more allocations than gc.Config.MaxAllocs.
	GCMaxAllocs GCReason = "max_allocs"
	// GCDisk: the backing store's disk fuller than DiskUsagePercent.
	GCDisk GCReason = "disk"
	// GCInodes: its inodes more used than InodeUsagePercent.
	GCInodes GCReason = "inodes"
	// GCRequested: someone asked (gc.Collector.CollectAll, CollectAlloc).
	GCRequested GCReason = "requested"
)

// CollectorPass describes one pass of the collector.
type CollectorPass struct {
	// Requested is set for gc.Collector.CollectAll and CollectAlloc,
	// clear for the timer's passes (Collect).
	Requested bool
	// Pressure is the threshold the node was over when a timer's pass
	// started.
	Pressure GCReason
	// Pinned counts the terminal allocations the pass left because a
	// migration pinned them.
	Pinned int
	// Swept counts the orphan layers removed, Merges the flatten's
	// merges.
	Swept, Merges int
	// Duration is how long the pass took, sweep and flatten included.
	Duration time.Duration
}

// nopObserver is the observer of a store nobody observes.
type nopObserver struct{}

func (nopObserver) Migrated(MigrationKind, time.Duration, error) {}
func (nopObserver) Collected(GCReason, error)                    {}
func (nopObserver) CollectorPass(CollectorPass)                  {}

// SetObserver makes o the store's observer. Call it before the store is
// shared: the field is read without a lock.
func (s *Store) SetObserver(o Observer) {
	if o == nil {
		o = nopObserver{}
	}
	s.obs = o
}

// Observer returns the store's observer, for the collector to tell of its
// decisions: it is the node's one, so that every collection reaches the
// metrics the store's migrations reach.
func (s *Store) Observer() Observer { return s.obs }
