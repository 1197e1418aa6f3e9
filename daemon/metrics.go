//go:build linux

package daemon

import (
	"net/http"
	"time"

	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/metrics"
)

// withMetrics answers metrics.Path with metricsHandler and everything
// else with api: the node's registry is the daemon's, not the control
// API's, which only gets requests for its own paths.
func withMetrics(api, metricsHandler http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(metrics.Path, metricsHandler)
	mux.Handle("/", api)
	return mux
}

// watchNode starts the series of the node read at scrape time and the
// background measure of the allocations' usage; the returned func stops
// it, and must run before the store is closed.
func watchNode(nm *metrics.Metrics, m *fs.Mount, s *store.Store, followers func() int64, usageInterval time.Duration) func() {
	return nm.WatchNode(metrics.Node{
		Store:         s,
		Passthrough:   func() (bool, bool) { return m.Passthrough(), m.PassthroughLost() },
		FileOpens:     m.FileOpens,
		Followers:     followers,
		UsageInterval: usageInterval,
	})
}
