package api

import (
	"fmt"
	"io"
	"net/http"
)

// Paths of Nomad's client API that allocfs answers besides the fs
// endpoints (package fsapi).
const (
	ClientGCPath    = "/v1/client/gc"
	clientAllocPath = "/v1/client/allocation/"
)

// clientError answers err in Nomad's style: its status and bare message.
func (s *Server) clientError(w http.ResponseWriter, r *http.Request, err error) {
	code := StatusCode(err)
	switch {
	case code == http.StatusGone:
		// Nomad's client no longer knows a collected allocation.
		code = http.StatusNotFound
	case code == http.StatusInternalServerError:
		s.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	io.WriteString(w, err.Error())
}

// clientGCAlloc is Nomad's forced GC of one allocation: only a terminal
// one is collected. Its answer is Nomad's (nomadOK).
func (s *Server) clientGCAlloc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.clientError(w, r, fmt.Errorf("%w: %v", ErrBadRequest, err))
		return
	}
	if err := s.node.Collect(r.Context(), id, "requested through the client API"); err != nil {
		s.clientError(w, r, err)
		return
	}
	nomadOK(w)
}

// clientGCAll is Nomad's node GC: every terminal allocation, oldest
// stopped first.
func (s *Server) clientGCAll(w http.ResponseWriter, r *http.Request) {
	if _, err := s.node.CollectAll(r.Context(), "node gc requested through the client API"); err != nil {
		s.clientError(w, r, err)
		return
	}
	nomadOK(w)
}

// nomadOK is the answer of a Nomad endpoint that returns nothing: 200
// with an empty body, as Nomad's agent sends. Nomad's Go client asks
// these endpoints for nothing (Nodes.GC and Nodes.GcAlloc decode into
// nil), and decodes a body of any length but 0 into nil, which fails
// ("json: Unmarshal(nil)").
func nomadOK(w http.ResponseWriter) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}
