package migrate

import "time"

// Progress reports one attempt of a Fetch.
type Progress struct {
	// AllocID is the allocation being fetched.
	AllocID string
	// Attempt counts from 1; Bytes, Elapsed and Rate restart with it.
	Attempt int
	// Bytes is how much of the tar stream was received.
	Bytes int64
	// Total is the stream's size from Content-Length, or -1 when the
	// source did not say (allocfs sources never do: they stream).
	Total int64
	// Rate is the average since the attempt started, in bytes per second.
	Rate float64
	// Elapsed is the time since the attempt's response arrived.
	Elapsed time.Duration
	// Done marks the attempt's last report; Err is then its error, nil
	// when the snapshot was received.
	Done bool
	Err  error
	// RetryIn is set on the report of a failed attempt that will be
	// retried: how long until the next one. Every retried attempt gets
	// one, whether or not it got as far as a response, so that whoever
	// waits hears of each retry.
	RetryIn time.Duration
}
