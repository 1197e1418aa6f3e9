package metrics

import (
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs/transport"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// fuseBuckets bound the time the daemon spends on one request: a few
// microseconds for a cached lookup, tens for one that reaches the
// backing filesystem, milliseconds for a copy-up or an fsync.
var fuseBuckets = []float64{5e-6, 10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 50e-3, 250e-3, 1}

// otherOp names the opcodes fs/transport has no name for.
const otherOp = "OTHER"

// FUSE counts and times the requests of the mount, by opcode. It is a
// transport.Observer, called once per request on the goroutine that
// served it, so its Request does no label lookup: the first request of
// each opcode resolves that opcode's histogram and stores it in an array
// indexed by opcode, and every later one loads it with one atomic read.
// Opcodes the kernel never sent have no series, rather than dozens of
// empty histograms on every node.
type FUSE struct {
	durations *prometheus.HistogramVec
	errors    *prometheus.CounterVec
	// ops holds the resolved series of each opcode; the last slot is
	// every opcode fs/transport has no name for.
	ops [transport.NumOpcodes + 1]atomic.Pointer[fuseOp]
	// errs holds the error counters by opcode and errno: errors are rare
	// enough that a sync.Map lookup costs nothing that shows.
	errs sync.Map
}

// fuseOp is one opcode's series.
type fuseOp struct {
	name     string
	duration prometheus.Observer
}

// errKey names one error counter.
type errKey struct {
	slot  int
	errno syscall.Errno
}

func newFUSE(reg prometheus.Registerer) *FUSE {
	f := &FUSE{
		durations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "fuse", Name: "request_duration_seconds",
			Help:    "Time the daemon took to serve a FUSE request, from the moment it was read to the moment its reply was written, by opcode (LOOKUP, GETATTR, READ...). The count is the number of requests. Requests of allocfs's own loop only: --debug-fuse (go-fuse's server) is not measured.",
			Buckets: fuseBuckets,
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "fuse", Name: "request_errors_total",
			Help: "FUSE replies with an error, by opcode and errno. Most are answers to what a task asked rather than failures: ENOENT a name that does not exist (a LOOKUP of a missing name is answered as a cached negative entry, which counts as no error), ENODATA an extended attribute a file does not have, EEXIST, ENOTEMPTY, EACCES what the task got wrong, ENOSYS an operation allocfs does not offer; EIO is the daemon's own failure (see its log).",
		}, []string{"op", "errno"}),
	}
	reg.MustRegister(f.durations, f.errors)
	return f
}

var _ transport.Observer = (*FUSE)(nil)

// Request records one request.
func (f *FUSE) Request(op uint32, d time.Duration, errno syscall.Errno) {
	slot := min(int(op), transport.NumOpcodes)
	o := f.ops[slot].Load()
	if o == nil {
		o = f.resolve(slot, op)
	}
	o.duration.Observe(d.Seconds())
	if errno != 0 {
		f.countError(slot, o.name, errno)
	}
}

// resolve makes the series of the opcode in slot. Two requests racing
// here resolve the same child of the vector; either pointer serves.
func (f *FUSE) resolve(slot int, op uint32) *fuseOp {
	name := transport.OpName(op)
	if name == "" || slot == transport.NumOpcodes {
		name = otherOp
	}
	o := &fuseOp{name: name, duration: f.durations.WithLabelValues(name)}
	f.ops[slot].Store(o)
	return o
}

func (f *FUSE) countError(slot int, op string, errno syscall.Errno) {
	key := errKey{slot: slot, errno: errno}
	c, ok := f.errs.Load(key)
	if !ok {
		c, _ = f.errs.LoadOrStore(key, f.errors.WithLabelValues(op, errnoName(errno)))
	}
	c.(prometheus.Counter).Inc()
}

// errnoName is the errno's symbol (EIO), or its number where the system
// has no symbol for it.
func errnoName(errno syscall.Errno) string {
	if n := unix.ErrnoName(errno); n != "" {
		return n
	}
	return strconv.Itoa(int(errno))
}
