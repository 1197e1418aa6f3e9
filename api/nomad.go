package api

import (
	"fmt"
	"io"
	"net/http"

	"github.com/allocfs/allocfs/api/fsapi"
)

// Paths of Nomad's client API that allocfs answers besides the fs
// endpoints (package fsapi).
const (
	ClientGCPath    = "/v1/client/gc"
	clientAllocPath = "/v1/client/allocation/"
)

// ServeClientAPI adds Nomad's client endpoints to the server: the file
// system API of package fsapi over lookup, GET
// /v1/client/allocation/<id>/gc and GET /v1/client/gc. They answer as
// Nomad does (errors are the bare message, not JSON). The returned handler
// serves those endpoints alone, for listeners other than the control
// socket. Call it once, before serving.
func (s *Server) ServeClientAPI(lookup fsapi.Lookup) http.Handler {
	client := http.NewServeMux()
	fsh := fsapi.NewHandler(s.logger, lookup)
	s.stopStreams = fsh.StopStreams
	client.Handle(fsapi.Prefix, fsh)
	client.HandleFunc("GET "+clientAllocPath+"{id}/gc", s.clientGCAlloc)
	client.HandleFunc("GET "+ClientGCPath, s.clientGCAll)
	s.mux.Handle("/v1/client/", client)
	return client
}

// StopStreams ends the client API's streams (followers): register it with
// http.Server.RegisterOnShutdown, or a shutdown waits for them in vain.
func (s *Server) StopStreams() {
	if s.stopStreams != nil {
		s.stopStreams()
	}
}

// clientError answers err in Nomad's style: its status and bare message.
func (s *Server) clientError(w http.ResponseWriter, r *http.Request, err error) {
	code := statusCode(err)
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
// one is collected.
func (s *Server) clientGCAlloc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.clientError(w, r, fmt.Errorf("%w: %v", ErrBadRequest, err))
		return
	}
	if err := s.collector.CollectAlloc(id, "requested through the client API"); err != nil {
		s.clientError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// clientGCAll is Nomad's node GC: every terminal allocation, oldest
// stopped first.
func (s *Server) clientGCAll(w http.ResponseWriter, r *http.Request) {
	if _, err := s.collector.CollectAll("node gc requested through the client API"); err != nil {
		s.clientError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusOK)
}
