package migrate

import (
	"sync/atomic"
	"time"
)

// FetchObserver is told of every snapshot fetch when it ends, for the
// node's metrics (package metrics). It runs on the goroutine that called
// Fetch, and must return at once.
type FetchObserver interface {
	Fetched(FetchReport)
}

// FetchReport is what a fetch did.
type FetchReport struct {
	// Attempts is how many attempts it made, and Bytes what their bodies
	// brought, the failed ones' included: what crossed the network.
	Attempts int
	Bytes    int64
	// Duration is the whole fetch, waits between attempts included.
	Duration time.Duration
	// Err is nil when the snapshot was received, checked and extracted.
	Err error
}

// defaultObserver is the FetchObserver of fetches whose options name
// none.
var defaultObserver atomic.Pointer[FetchObserver]

// SetDefaultFetchObserver makes o the observer of every fetch whose
// FetchOptions.Observer is nil; nil turns it off. A daemon sets it once:
// its fetches are started by the control API, which builds their options
// itself.
func SetDefaultFetchObserver(o FetchObserver) {
	if o == nil {
		defaultObserver.Store(nil)
		return
	}
	defaultObserver.Store(&o)
}

// observer is the fetch's observer, or nil.
func (f *fetcher) observer() FetchObserver {
	if f.opts.Observer != nil {
		return f.opts.Observer
	}
	if o := defaultObserver.Load(); o != nil {
		return *o
	}
	return nil
}
