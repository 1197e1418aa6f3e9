package migrate

import "time"

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
