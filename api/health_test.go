package api

import (
	"net/http"
	"testing"
)

// TestAgentHealth: with every check passing the answer is 200 with
// Nomad's {"client": {"ok": true}}; with one failing it is 500 and says
// which, as Nomad's does.
func TestAgentHealth(t *testing.T) {
	_, srv := newTestServer(t)
	rec := request(t, srv, http.MethodGet, HealthPath, "")
	var h Health
	decode(t, rec, &h)
	if rec.Code != http.StatusOK || !h.Client.OK || h.Client.Message != "ok" {
		t.Errorf("health with no checks: %d %+v, want 200 and ok", rec.Code, h)
	}

	checks := []HealthCheck{{Name: "mount", OK: true, Detail: "connection 42"}, {Name: "store", OK: true}}
	srv.SetHealth(func() []HealthCheck { return checks })
	rec = request(t, srv, http.MethodGet, HealthPath, "")
	decode(t, rec, &h)
	if rec.Code != http.StatusOK || !h.Client.OK || len(h.Checks) != 2 {
		t.Errorf("health with passing checks: %d %+v, want 200, ok and both checks", rec.Code, h)
	}

	checks[1] = HealthCheck{Name: "store", OK: false, Detail: "read-only file system"}
	rec = request(t, srv, http.MethodGet, HealthPath, "")
	h = Health{}
	decode(t, rec, &h)
	if rec.Code != http.StatusInternalServerError || h.Client.OK || h.Client.Message != "store: read-only file system" {
		t.Errorf("health with a failing check: %d %+v, want 500 naming the store", rec.Code, h)
	}
	if rec := request(t, srv, http.MethodPost, HealthPath, ""); rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST %s: %d, want 405", HealthPath, rec.Code)
	}
}
