//go:build linux

// The TCP listener is a node's, and nodes run on Linux: this file, unlike
// the client's, needs the migration package, which only builds there.

package api

import (
	"io"
	"net/http"

	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/allocfs/allocfs/migrate"
)

// NodeTokens are the secrets that admit requests from other machines, as
// the files that hold them read when last loaded.
type NodeTokens struct {
	// Snapshots admits snapshot requests; nil admits none.
	Snapshots migrate.TokenChecker
	// API admits the client API, the allocation stubs, the health check
	// and the metrics; "" admits none.
	API string
}

// NodeRoutes are the handlers a node serves other machines over TCP. A nil
// handler is a route not served at all (404, whatever the token): which
// routes exist follows the daemon's flags, and a reload of the tokens
// never adds or removes one.
type NodeRoutes struct {
	// Snapshots serves GET /v1/client/allocation/{id}/snapshot, behind
	// the snapshot token.
	Snapshots http.Handler
	// Client serves the client API (/v1/client/*), the allocation stubs
	// a client resolves ID prefixes with and the health check, behind the
	// API token.
	Client http.Handler
	// Metrics, at MetricsPath, is behind the API token too: its series
	// name the node's allocations, and whoever may browse their files may
	// read them, nobody else.
	Metrics     http.Handler
	MetricsPath string
}

// NodeHandler is what other machines reach over TCP: routes, each behind
// its token, the one tokens returns at each request; nothing else (the
// control API stays on the unix socket). Refusals are logged through
// refusals, at a bounded rate: anyone who can connect can cause them.
func NodeHandler(refusals *netlimit.LogLimiter, tokens func() NodeTokens, routes NodeRoutes) http.Handler {
	mux := http.NewServeMux()
	if routes.Snapshots != nil {
		mux.Handle("GET /v1/client/allocation/{id}/snapshot", RequireSnapshotToken(refusals, tokens, routes.Snapshots))
	}
	if routes.Client != nil {
		mux.Handle("/v1/client/", RequireToken(refusals, tokens, routes.Client))
		mux.Handle("GET "+AllocationsPath, RequireToken(refusals, tokens, routes.Client))
		mux.Handle("GET "+HealthPath, RequireToken(refusals, tokens, routes.Client))
		if routes.Metrics != nil {
			mux.Handle(routes.MetricsPath, RequireToken(refusals, tokens, routes.Metrics))
		}
	}
	return mux
}

// RequireToken admits requests that present the API token as
// X-Nomad-Token or as an "Authorization: Bearer" header, as Nomad's API
// does, and answers 403 to the rest.
func RequireToken(refusals *netlimit.LogLimiter, tokens func() NodeTokens, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := tokens().API
		if token == "" || !migrate.SharedToken(token).Check("", migrate.RequestToken(r)) {
			refusals.Warn("token/client_api", "refused a client API request: bad or missing token", "remote", r.RemoteAddr, "path", r.URL.Path)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, "Permission denied")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// RequireSnapshotToken answers 403 to a snapshot request whose token the
// snapshot checker refuses for the allocation it names. The snapshot
// handler checks again, but logs every refusal; checked here first,
// refusals are logged at a bounded rate.
func RequireSnapshotToken(refusals *netlimit.LogLimiter, tokens func() NodeTokens, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := migrate.RequestToken(r)
		check := tokens().Snapshots
		if token == "" || check == nil || !check.Check(r.PathValue("id"), token) {
			refusals.Warn("token/snapshot", "refused a snapshot request: bad or missing token", "remote", r.RemoteAddr, "path", r.URL.Path)
			// The snapshot handler's own answer, word for word.
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}
