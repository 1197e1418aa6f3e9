// Package metrics is what a node tells Prometheus: the series of the
// mount, the store, its collector and migrations, and of every
// allocation, served at /v1/metrics (Path) in Prometheus's text format,
// on the unix socket and, behind the client API's token, on TCP.
//
// # Prometheus in one page
//
// A scraper (Prometheus, or Nomad's telemetry pipeline pointed at the
// node) GETs the endpoint every 15 to 60 seconds and stores every line
// as a sample of a series, named by the metric's name and its labels:
//
//	# HELP allocfs_fuse_request_duration_seconds Time the daemon took...
//	# TYPE allocfs_fuse_request_duration_seconds histogram
//	allocfs_fuse_request_duration_seconds_bucket{op="LOOKUP",le="2.5e-05"} 1832
//	allocfs_fuse_request_duration_seconds_bucket{op="LOOKUP",le="+Inf"} 1910
//	allocfs_fuse_request_duration_seconds_sum{op="LOOKUP"} 0.0412
//	allocfs_fuse_request_duration_seconds_count{op="LOOKUP"} 1910
//
// Three kinds of metric are used here. A counter only grows, from 0 at
// the daemon's start (a restart resets it, which rate() and increase()
// understand): one asks how fast it grows. A gauge is a value now. A
// histogram counts observations into cumulative buckets ("le": at most
// this many seconds) and keeps their sum and count, so that a quantile
// can be estimated across time and nodes:
//
//	histogram_quantile(0.99, sum by (le) (rate(allocfs_fuse_request_duration_seconds_bucket{op="LOOKUP"}[5m])))
//
// A histogram's _count is the number of observations, so there is no
// separate counter of FUSE requests, copy-ups, migrations or collector
// passes: each is its histogram's _count.
//
// Every label value comes from a small fixed set (an opcode, a reason,
// a kind) except alloc_id and volume, which are bounded by the node's
// allocations: each label value is a series of its own to store.
//
// # The registry is the daemon's
//
// New makes a registry of its own rather than using client_golang's
// process-wide default, which any imported package may register into:
// what the node serves is exactly what is declared here, plus the Go
// runtime's series (go_*), the process's (process_*: CPU, memory,
// open descriptors against the limit the daemon raised) and the
// handler's own (promhttp_*).
//
// # How each part is told
//
// The packages that do the work import no metrics library. Each declares
// the small interface it calls, and this package implements them:
//
//	fs/transport  Observer.Request(op, duration, errno)   per FUSE request
//	fs/layer      CopyUpObserver.CopiedUp(mode, bytes, d) per copy-up
//	fs/store      Observer: Migrated, Collected, CollectorPass
//	migrate       FetchObserver.Fetched(report)           per snapshot fetch
//
// What is state rather than an event is read when a scrape comes (Node):
// passthrough, the opens by who serves them, followers, the
// allocations by status, the backing filesystem's statfs.
//
// # The hot path
//
// The FUSE observer runs once per request, on the goroutine that served
// it, around a round trip that costs from a few microseconds. It reads
// the clock twice and makes one histogram observation (a few atomic
// additions); the histogram of each opcode is resolved from its label
// once, on the opcode's first request, and kept in an array indexed by
// opcode, so no request hashes a label or looks in a map. Errors, which
// are rarer, find their counter in a sync.Map. docs/benchmarks.md has
// the cost measured ("Metrics overhead").
//
// # Allocation usage is measured in the background
//
// An allocation with a disk limit on a store that enforces it is not
// walked: the filesystem's quota accounting counts it, so a scrape reads
// its allocfs_alloc_bytes (the whole allocation, volume="" and
// layer="upper") and allocfs_alloc_limit_bytes from sysfs, current and
// at the same cost whatever it holds (BenchmarkAllocUsage). The rest of
// this section is about the allocations without one.
//
// allocfs_alloc_bytes and allocfs_alloc_files need a walk of every layer
// of every allocation on the backing store, which on a busy node takes
// longer than a scrape may. So one goroutine walks them every 30 seconds
// (Node.UsageInterval; serve's --metrics-usage-interval), one walk at a
// time, and a scrape reads what the last walk found: it never waits for
// a walk, but for the very first one, and then for at most five seconds.
// The series are up to one interval old, and say so in their help text;
// allocfs_alloc_usage_refreshed_timestamp_seconds says when they were
// measured. Lower layers never change, so each is walked once for as
// long as a volume stacks it. A walk goes from directory descriptors
// and never follows a link, like every walk of a layer (package layer);
// the end of WatchNode stops it at its next directory, so that a
// shutdown or a hand-over never waits for a walk of every layer.
//
// # What is not measured
//
// go-fuse's own server (--debug-fuse) tells nothing: its requests do not
// go through fs/transport. Memory volumes (secrets/, private/) have no
// layer and count in no allocation's usage. The bytes of a file are its
// size, not the blocks it takes: a sparse file or a clone counts whole.
package metrics
