package api

import "net/http"

// HealthPath is Nomad's agent health endpoint, which allocfs answers for
// its node.
const HealthPath = "/v1/agent/health"

// Health is the answer of GET /v1/agent/health. Client is the part
// Nomad's own answer has, which tools that check a Nomad client read
// ({"client": {"ok": true, "message": "ok"}}); Checks are allocfs's.
type Health struct {
	Client HealthStatus  `json:"client"`
	Checks []HealthCheck `json:"checks"`
}

// HealthStatus is whether the node is healthy, and why not.
type HealthStatus struct {
	OK      bool   `json:"ok"`
	Message string `json:"message"`
}

// HealthCheck is one thing the node checked.
type HealthCheck struct {
	// Name is what was checked: "mount", "passthrough" or "store".
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Detail says what was found, or what is wrong.
	Detail string `json:"detail"`
}

// agentHealth answers 200 when every check passes, and 500, as Nomad
// does, when one fails; the body says which.
func (s *Server) agentHealth(w http.ResponseWriter, r *http.Request) {
	checks := s.node.Health(r.Context())
	h := Health{Client: HealthStatus{OK: true, Message: "ok"}, Checks: checks}
	for _, c := range checks {
		if !c.OK {
			h.Client = HealthStatus{OK: false, Message: c.Name + ": " + c.Detail}
			break
		}
	}
	code := http.StatusOK
	if !h.Client.OK {
		code = http.StatusInternalServerError
	}
	s.writeJSON(w, code, h)
}
