package metrics

import (
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/prometheus/client_golang/prometheus"
)

// migrationBuckets bound a local migration (one journaled intent: a few
// milliseconds) and the import of a fetched snapshot (a sync of what was
// received: seconds for a large one).
var migrationBuckets = []float64{1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 1, 5, 30, 120}

// gcPassBuckets bound a pass of the collector: destroying allocations
// means removing their layers' trees.
var gcPassBuckets = []float64{1e-3, 10e-3, 100e-3, 1, 10, 60, 600}

// gcReasons are the reasons an allocation is collected for, and
// gcPressures those a timer's pass can find the node under.
var (
	gcReasons   = []store.GCReason{store.GCMaxAllocs, store.GCDisk, store.GCInodes, store.GCRequested}
	gcPressures = []store.GCReason{store.GCMaxAllocs, store.GCDisk, store.GCInodes}
)

// Store counts the store's migrations and its collector's decisions. It
// is a store.Observer.
type Store struct {
	migrations  *prometheus.HistogramVec
	collections *prometheus.CounterVec
	passes      *prometheus.HistogramVec
	pressure    *prometheus.GaugeVec
	pinned      prometheus.Counter
	swept       prometheus.Counter
	merges      prometheus.Counter
}

func newStore(reg prometheus.Registerer) *Store {
	s := &Store{
		migrations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "migration", Name: "duration_seconds",
			Help:    "Time the store took to hand a previous allocation's data to a new one, by kind (adopt, snapshot, remote) and result (ok, error: refused or failed). The count is the number of migrations. For remote, the import of the fetched snapshot only: the fetch is allocfs_migration_fetch_duration_seconds.",
			Buckets: migrationBuckets,
		}, []string{"kind", "result"}),
		collections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "gc", Name: "collections_total",
			Help: "Allocations the collector destroyed (result ok) or failed to (error), by reason: max_allocs, disk and inodes are Nomad's thresholds (gc_max_allocs, gc_disk_usage_threshold, gc_inode_usage_threshold), requested an explicit gc.",
		}, []string{"reason", "result"}),
		passes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "gc", Name: "pass_duration_seconds",
			Help:    "Time a pass of the collector took, orphan sweep and flatten included, by trigger (interval: the timer; requested: an explicit gc). The count is the number of passes.",
			Buckets: gcPassBuckets,
		}, []string{"trigger"}),
		pressure: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "gc", Name: "pressure",
			Help: "1 for the threshold the node was over at the start of the collector's last timer pass (max_allocs, disk, inodes), 0 for the others. Over a threshold with nothing collected means no terminal allocation was left to collect.",
		}, []string{"reason"}),
		pinned: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "gc", Name: "pinned_skips_total",
			Help: "Terminal allocations a collector pass left because a migration was streaming their snapshot (pinned), counted once per pass.",
		}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "gc", Name: "orphan_layers_removed_total",
			Help: "Layers no allocation names that the collector's sweeps removed (left by a crash, a failed removal, or merged away by a flatten).",
		}),
		merges: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "flatten", Name: "merges_total",
			Help: "Pairs of lower layers the collector merged to keep snapshot chains short (at most four lowers per volume).",
		}),
	}
	for _, kind := range []store.MigrationKind{store.MigrationAdopt, store.MigrationSnapshot, store.MigrationRemote} {
		for _, result := range []string{"ok", "error"} {
			s.migrations.WithLabelValues(string(kind), result)
		}
	}
	for _, r := range gcReasons {
		s.collections.WithLabelValues(string(r), "ok")
	}
	for _, t := range []string{"interval", "requested"} {
		s.passes.WithLabelValues(t)
	}
	for _, r := range gcPressures {
		s.pressure.WithLabelValues(string(r))
	}
	reg.MustRegister(s.migrations, s.collections, s.passes, s.pressure, s.pinned, s.swept, s.merges)
	return s
}

var _ store.Observer = (*Store)(nil)

// Migrated records one migration.
func (s *Store) Migrated(kind store.MigrationKind, d time.Duration, err error) {
	s.migrations.WithLabelValues(string(kind), result(err)).Observe(d.Seconds())
}

// Collected records one allocation the collector tried to destroy.
func (s *Store) Collected(reason store.GCReason, err error) {
	s.collections.WithLabelValues(string(reason), result(err)).Inc()
}

// CollectorPass records one pass of the collector.
func (s *Store) CollectorPass(p store.CollectorPass) {
	trigger := "interval"
	if p.Requested {
		trigger = "requested"
	} else {
		for _, r := range gcPressures {
			v := 0.0
			if r == p.Pressure {
				v = 1
			}
			s.pressure.WithLabelValues(string(r)).Set(v)
		}
	}
	s.passes.WithLabelValues(trigger).Observe(p.Duration.Seconds())
	s.pinned.Add(float64(p.Pinned))
	s.swept.Add(float64(p.Swept))
	s.merges.Add(float64(p.Merges))
}

// result is the result label of an outcome.
func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
