package metrics

import (
	"github.com/allocfs/allocfs/migrate"
	"github.com/prometheus/client_golang/prometheus"
)

// fetchBuckets bound a snapshot fetch: from a small allocation on the
// next rack to migrate's 30-minute deadline.
var fetchBuckets = []float64{0.1, 0.5, 1, 5, 15, 60, 300, 900, 1800}

// Fetches counts and times the snapshot fetches of remote migrations.
// It is a migrate.FetchObserver.
type Fetches struct {
	durations *prometheus.HistogramVec
	bytes     prometheus.Counter
	attempts  prometheus.Counter
}

func newFetches(reg prometheus.Registerer) *Fetches {
	f := &Fetches{
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "migration", Name: "fetch_duration_seconds",
			Help:    "Time a remote migration's snapshot fetch took, retries and waits between them included, by result (ok, error). The count is the number of fetches.",
			Buckets: fetchBuckets,
		}, []string{"result"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "migration", Name: "fetch_bytes_total",
			Help: "Bytes of snapshot received from other nodes, failed attempts' included.",
		}),
		attempts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "migration", Name: "fetch_attempts_total",
			Help: "Attempts made by snapshot fetches: more than one per fetch means transfers were cut or sources overloaded.",
		}),
	}
	for _, r := range []string{"ok", "error"} {
		f.durations.WithLabelValues(r)
	}
	reg.MustRegister(f.durations, f.bytes, f.attempts)
	return f
}

var _ migrate.FetchObserver = (*Fetches)(nil)

// Fetched records one fetch.
func (f *Fetches) Fetched(r migrate.FetchReport) {
	f.durations.WithLabelValues(result(r.Err)).Observe(r.Duration.Seconds())
	f.bytes.Add(float64(r.Bytes))
	f.attempts.Add(float64(r.Attempts))
}
