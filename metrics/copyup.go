package metrics

import (
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/prometheus/client_golang/prometheus"
)

// copyUpBuckets bound a copy-up: microseconds for a directory, a clone
// or a small file, seconds for a large file copied byte by byte (a
// filesystem without FICLONE).
var copyUpBuckets = []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 5e-3, 25e-3, 100e-3, 500e-3, 2.5, 10, 60}

// CopyUps times the copy-ups of the mount's volumes, by the type of the
// entry copied, and counts the bytes of the files copied. It is a
// layer.CopyUpObserver.
type CopyUps struct {
	durations [3]prometheus.Observer // file, dir, other
	bytes     prometheus.Counter
}

func newCopyUps(reg prometheus.Registerer) *CopyUps {
	d := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: "copyup", Name: "duration_seconds",
		Help:    "Time a copy-up took, by the type of the entry copied (file, dir, other): a write to an entry a snapshot migration left in a lower layer copies it into the allocation's own layer first. The count is the number of copy-ups.",
		Buckets: copyUpBuckets,
	}, []string{"type"})
	c := &CopyUps{
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "copyup", Name: "bytes_total",
			Help: "Bytes of the files copied up (their sizes; a clone or a sparse copy may write fewer).",
		}),
	}
	// Three label values, made up front: a dashboard sees them at zero
	// before the first copy-up.
	for i, t := range []string{"file", "dir", "other"} {
		c.durations[i] = d.WithLabelValues(t)
	}
	reg.MustRegister(d, c.bytes)
	return c
}

var _ layer.CopyUpObserver = (*CopyUps)(nil)

// CopiedUp records one copy-up.
func (c *CopyUps) CopiedUp(mode uint32, bytes int64, d time.Duration) {
	i := 2
	switch mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		i = 0
	case syscall.S_IFDIR:
		i = 1
	}
	c.durations[i].Observe(d.Seconds())
	if bytes > 0 {
		c.bytes.Add(float64(bytes))
	}
}
