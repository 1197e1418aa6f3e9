//go:build linux

package api

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/allocfs/allocfs/migrate"
	"github.com/hashicorp/go-hclog"
)

// refusalsEvery is the interval of the tests' refusal logs.
const refusalsEvery = 10 * time.Second

// TestNodeHandlerRefusalsRateLimited: requests with a bad or missing
// token are answered 403 without reaching the API or the snapshot
// handler, and are logged once per kind per interval, with the count of
// those left out on the next line.
func TestNodeHandlerRefusalsRateLimited(t *testing.T) {
	var logs allocdirtest.SyncBuffer
	now := time.Unix(1_700_000_000, 0)
	refusals := netlimit.NewLogLimiter(hclog.New(&hclog.LoggerOptions{Output: &logs, JSONFormat: true}), refusalsEvery, func() time.Time { return now })
	secret := migrate.NodeSecretToken("node-secret")
	tokens := func() NodeTokens { return NodeTokens{API: "api-token", Snapshots: secret} }
	var reached []string
	next := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			reached = append(reached, name+" "+r.URL.Path)
			io.WriteString(w, "ok")
		})
	}
	h := NodeHandler(refusals, tokens, NodeRoutes{Snapshots: next("snapshot"), Client: next("client"), Metrics: next("metrics"), MetricsPath: "/v1/metrics"})
	do := func(path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if token != "" {
			r.Header.Set("X-Nomad-Token", token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	const n = 50
	for i := range n {
		token := []string{"", "wrong"}[i%2]
		if w := do("/v1/client/fs/ls/a1", token); w.Code != http.StatusForbidden || w.Body.String() != "Permission denied" {
			t.Fatalf("client API with token %q: %d %q, want 403 Permission denied", token, w.Code, w.Body)
		}
		// A token for another allocation is no token for this one.
		token = []string{"", "wrong", secret.Derive("other")}[i%3]
		if w := do("/v1/client/allocation/a1/snapshot", token); w.Code != http.StatusForbidden {
			t.Fatalf("snapshot with token %q: %d %q, want 403", token, w.Code, w.Body)
		}
	}
	if len(reached) != 0 {
		t.Fatalf("refused requests reached the handlers: %v", reached)
	}
	lines := logs.JSONLines(t)
	if len(lines) != 2 {
		t.Fatalf("%d refusals of each kind wrote %d lines, want 2: %v", n, len(lines), lines)
	}
	now = now.Add(refusalsEvery)
	do("/v1/client/fs/ls/a1", "")
	do("/v1/client/allocation/a1/snapshot", "")
	lines = logs.JSONLines(t)
	if len(lines) != 2 {
		t.Fatalf("after the interval: %d lines, want 2: %v", len(lines), lines)
	}
	for _, l := range lines {
		if l["suppressed"] != float64(n-1) {
			t.Errorf("line after the interval: %v, want suppressed=%d", l, n-1)
		}
	}

	if w := do("/v1/client/fs/ls/a1", "api-token"); w.Code != http.StatusOK {
		t.Errorf("client API with the token: %d, want 200", w.Code)
	}
	if w := do("/v1/client/allocation/a1/snapshot", secret.Derive("a1")); w.Code != http.StatusOK {
		t.Errorf("snapshot with the allocation's token: %d, want 200", w.Code)
	}
	for _, path := range []string{"/v1/metrics", "/v1/allocations", "/v1/agent/health"} {
		for _, token := range []string{"", "wrong", secret.Derive("a1")} {
			if w := do(path, token); w.Code != http.StatusForbidden {
				t.Errorf("%s with token %q: %d, want 403", path, token, w.Code)
			}
		}
		if w := do(path, "api-token"); w.Code != http.StatusOK {
			t.Errorf("%s with the API token: %d, want 200", path, w.Code)
		}
	}
	if w := do("/v1/allocs", "api-token"); w.Code != http.StatusNotFound {
		t.Errorf("the control API on TCP, with the API token: %d, want 404", w.Code)
	}
	if want := []string{"client /v1/client/fs/ls/a1", "snapshot /v1/client/allocation/a1/snapshot", "metrics /v1/metrics", "client /v1/allocations", "client /v1/agent/health"}; strings.Join(reached, ",") != strings.Join(want, ",") {
		t.Errorf("admitted requests reached %v, want %v", reached, want)
	}
}

// TestNodeHandlerMetricsNeedTheAPIToken: without the client API (no
// --token-file) the TCP listener serves no metrics at all, whatever the
// token; the snapshot token, which other nodes hold, never admits them.
func TestNodeHandlerMetricsNeedTheAPIToken(t *testing.T) {
	refusals := netlimit.NewLogLimiter(hclog.NewNullLogger(), refusalsEvery, nil)
	tokens := func() NodeTokens { return NodeTokens{Snapshots: migrate.SharedToken("migrate-token")} }
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	h := NodeHandler(refusals, tokens, NodeRoutes{Snapshots: ok, Metrics: ok, MetricsPath: "/v1/metrics"})
	r := httptest.NewRequest(http.MethodGet, "/v1/metrics", nil)
	r.Header.Set("X-Nomad-Token", "migrate-token")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusNotFound {
		t.Errorf("metrics on a listener without --token-file: %d, want 404", w.Code)
	}
}
