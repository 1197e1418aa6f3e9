package metrics

import (
	"net/http"
	"strconv"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
)

// Path is where the daemon serves its metrics: Nomad's agent path.
const Path = "/v1/metrics"

// namespace prefixes every series of allocfs's own.
const namespace = "allocfs"

// Metrics is the daemon's registry and the series of each part of it.
// The parts take what they are told through their own small interfaces
// (transport.Observer, layer.CopyUpObserver, store.Observer,
// migrate.FetchObserver), which the values FUSE, CopyUps, Store and
// Fetches implement; what is read rather than told (the node, the
// allocations) is collected at scrape time (Node). All methods are safe
// for concurrent use.
type Metrics struct {
	logger  hclog.Logger
	reg     *prometheus.Registry
	fuse    *FUSE
	copyUps *CopyUps
	store   *Store
	fetches *Fetches
}

// New returns a registry of the daemon's own (never the process-wide
// default one, which any imported package may add to) holding allocfs's
// series, the Go runtime's and the process's.
func New(logger hclog.Logger) *Metrics {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	m := &Metrics{logger: logger.Named("metrics"), reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.fuse = newFUSE(m.reg)
	m.copyUps = newCopyUps(m.reg)
	m.store = newStore(m.reg)
	m.fetches = newFetches(m.reg)
	return m
}

// Registry is the registry every series is in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// FUSE is what fs/transport tells of each request.
func (m *Metrics) FUSE() *FUSE { return m.fuse }

// CopyUps is what fs/layer tells of each copy-up.
func (m *Metrics) CopyUps() *CopyUps { return m.copyUps }

// Store is what fs/store tells of migrations and collections.
func (m *Metrics) Store() *Store { return m.store }

// Fetches is what migrate tells of each snapshot fetch.
func (m *Metrics) Fetches() *Fetches { return m.fetches }

// Handler serves the registry in Prometheus's text format, whatever the
// client's Accept header asks for: one format means that what curl shows
// is what a scraper stores. `?format=prometheus` (Nomad's spelling) is
// the same; any other format is refused with 400, since a client asking
// for Nomad's JSON would otherwise get text it cannot read. Collection
// errors are logged and the rest of the series served.
func (m *Metrics) Handler() http.Handler {
	prom := promhttp.InstrumentMetricHandler(m.reg, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:        m.logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}),
		ErrorHandling:   promhttp.ContinueOnError,
		AcceptedFormats: []expfmt.Format{expfmt.FmtText},
	}))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed: "+Path+" answers GET", http.StatusMethodNotAllowed)
			return
		}
		switch f := r.URL.Query().Get("format"); f {
		case "", "prometheus":
		default:
			http.Error(w, "unsupported format "+quote(f)+": "+Path+" serves the Prometheus text format only (leave format out, or format=prometheus)", http.StatusBadRequest)
			return
		}
		prom.ServeHTTP(w, r)
	})
}

// quote quotes a client's string for a message, bounded so that a long
// one does not come back whole.
func quote(s string) string {
	const most = 64
	if len(s) > most {
		s = s[:most] + "..."
	}
	return strconv.Quote(s)
}
