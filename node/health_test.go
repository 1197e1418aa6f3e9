package node

import (
	"net/http"
	"testing"

	"github.com/allocfs/allocfs/api"
)

// TestAgentHealth: with every check passing the answer is 200 with
// Nomad's {"client": {"ok": true}}; with one failing it is 500 and says
// which, as Nomad's does.
func TestAgentHealth(t *testing.T) {
	var checks []api.HealthCheck
	_, srv := newTestServer(t, func(c *Config) { c.Health = func() []api.HealthCheck { return checks } })
	rec := request(t, srv, http.MethodGet, api.HealthPath, "")
	var h api.Health
	decode(t, rec, &h)
	if rec.Code != http.StatusOK || !h.Client.OK || h.Client.Message != "ok" {
		t.Errorf("health with no checks: %d %+v, want 200 and ok", rec.Code, h)
	}

	checks = []api.HealthCheck{{Name: "mount", OK: true, Detail: "connection 42"}, {Name: "store", OK: true}}
	rec = request(t, srv, http.MethodGet, api.HealthPath, "")
	decode(t, rec, &h)
	if rec.Code != http.StatusOK || !h.Client.OK || len(h.Checks) != 2 {
		t.Errorf("health with passing checks: %d %+v, want 200, ok and both checks", rec.Code, h)
	}

	checks[1] = api.HealthCheck{Name: "store", OK: false, Detail: "read-only file system"}
	rec = request(t, srv, http.MethodGet, api.HealthPath, "")
	h = api.Health{}
	decode(t, rec, &h)
	if rec.Code != http.StatusInternalServerError || h.Client.OK || h.Client.Message != "store: read-only file system" {
		t.Errorf("health with a failing check: %d %+v, want 500 naming the store", rec.Code, h)
	}
	if rec := request(t, srv, http.MethodPost, api.HealthPath, ""); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", api.HealthPath, rec.Code)
	}
}
