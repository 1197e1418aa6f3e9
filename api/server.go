package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api/fsapi"
	"github.com/hashicorp/go-hclog"
)

// maxBodyBytes caps request bodies; a create request is a few hundred
// bytes.
const maxBodyBytes = 1 << 20

// Node is what the API serves: the node's lifecycle service. The server
// is a thin adapter over it: it decodes requests, calls one method, and
// encodes the answer or maps the error (marked with Kind) to its status.
// Every method is safe for concurrent use.
type Node interface {
	// Create makes the allocation req describes, taking over a previous
	// allocation's data when it names one; progress, when not nil, hears
	// how a fetch from another node goes.
	Create(ctx context.Context, req CreateAllocRequest, progress func(ProgressEvent)) (*Alloc, error)
	// List returns every allocation, sorted by ID.
	List(ctx context.Context) ([]*Alloc, error)
	// Status returns one allocation with where it is mounted and what
	// its layers hold.
	Status(ctx context.Context, id string) (*AllocStatus, error)
	// Stop makes an allocation terminal: kept and browsable until GC.
	Stop(ctx context.Context, id string) (*Alloc, error)
	// Destroy removes an allocation and the layers only it uses.
	Destroy(ctx context.Context, id string) error
	// Collect garbage-collects one terminal, unpinned allocation, and
	// CollectAll every one; reason is what the log says asked for it.
	Collect(ctx context.Context, id, reason string) error
	CollectAll(ctx context.Context, reason string) ([]string, error)
	// NodeStatus and Health describe the node.
	NodeStatus(ctx context.Context) (*NodeStatus, error)
	Health(ctx context.Context) []HealthCheck
	// FS is the read side of one allocation for the client API: its
	// files, read from the store and never through the mount.
	FS(id string) (allocdir.FS, error)
}

// Server answers the control API and Nomad's client API over a Node. It
// is an http.Handler; all methods are safe for concurrent use.
type Server struct {
	logger hclog.Logger
	node   Node
	mux    *http.ServeMux
	client *http.ServeMux
	// fsh serves Nomad's fs endpoints; see StopStreams and Followers.
	fsh *fsapi.Handler
}

// NewServer returns the API of node: the control API, and Nomad's client
// API (ClientAPI) under /v1/client/ and AllocationsPath.
func NewServer(logger hclog.Logger, node Node) *Server {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &Server{
		logger: logger.Named("api"),
		node:   node,
		mux:    http.NewServeMux(),
		client: http.NewServeMux(),
	}
	s.mux.HandleFunc("POST "+AllocsPath, s.createAlloc)
	s.mux.HandleFunc("GET "+AllocsPath, s.listAllocs)
	s.mux.HandleFunc("GET "+AllocsPath+"/{id}", s.allocStatus)
	s.mux.HandleFunc("DELETE "+AllocsPath+"/{id}", s.destroyAlloc)
	s.mux.HandleFunc("POST "+AllocsPath+"/{id}/stop", s.stopAlloc)
	s.mux.HandleFunc("POST "+AllocsPath+"/{id}/gc", s.gcAlloc)
	s.mux.HandleFunc("POST "+GCPath, s.gcAll)
	s.mux.HandleFunc("GET "+StatusPath, s.nodeStatus)
	s.mux.HandleFunc("GET "+HealthPath, s.agentHealth)

	s.fsh = fsapi.NewHandler(s.logger, node.FS)
	s.client.Handle(fsapi.Prefix, s.fsh)
	s.client.HandleFunc("GET "+clientAllocPath+"{id}/gc", s.clientGCAlloc)
	s.client.HandleFunc("GET "+ClientGCPath, s.clientGCAll)
	s.client.HandleFunc("GET "+AllocationsPath, s.allocStubs)
	s.client.HandleFunc("GET "+HealthPath, s.agentHealth)
	s.mux.Handle("/v1/client/", s.client)
	s.mux.Handle("GET "+AllocationsPath, s.client)
	return s
}

// ClientAPI is the part of the API that other machines may reach: Nomad's
// client endpoints, the allocation stubs and the health check, without
// the control API.
func (s *Server) ClientAPI() http.Handler { return s.client }

// StopStreams ends the client API's streams (followers): register it with
// http.Server.RegisterOnShutdown, or a shutdown waits for them in vain.
func (s *Server) StopStreams() { s.fsh.StopStreams() }

// Followers returns how many clients follow a file or a task's logs now.
func (s *Server) Followers() int64 { return s.fsh.Following() }

// ServeHTTP serves one request and logs it at debug level.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
	s.mux.ServeHTTP(rec, r)
	s.logger.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "duration", time.Since(start))
}

// statusRecorder remembers the status code a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

// Unwrap lets http.ResponseController reach the connection's writer, so
// that streaming handlers can flush.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (s *Server) createAlloc(w http.ResponseWriter, r *http.Request) {
	var req CreateAllocRequest
	if err := decodeBody(w, r, &req); err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.URL.Query().Get("progress") == "1" {
		s.createStreaming(w, r, req)
		return
	}
	a, err := s.node.Create(r.Context(), req, nil)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", allocPath(a.ID))
	s.writeJSON(w, http.StatusCreated, a)
}

// createStreaming answers a create with ?progress=1: 200, then one JSON
// line per progress report of a remote fetch, then the outcome. Until the
// first report the answer is not started, so that a create that fails or
// succeeds before any transfer (a bad request, a conflict, a local
// handover) is answered as without ?progress=1, with its own status.
func (s *Server) createStreaming(w http.ResponseWriter, r *http.Request, req CreateAllocRequest) {
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	var (
		mu      sync.Mutex
		started bool
	)
	send := func(line createLine) {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		enc.Encode(line)
		rc.Flush()
	}
	a, err := s.node.Create(r.Context(), req, func(ev ProgressEvent) { send(createLine{Progress: &ev}) })
	mu.Lock()
	streaming := started
	mu.Unlock()
	switch {
	case !streaming && err != nil:
		s.writeError(w, r, err)
	case !streaming:
		w.Header().Set("Location", allocPath(a.ID))
		s.writeJSON(w, http.StatusCreated, a)
	case err != nil:
		code := StatusCode(err)
		if code == http.StatusInternalServerError {
			s.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		}
		send(createLine{Error: err.Error(), Status: code})
	default:
		send(createLine{Alloc: a})
	}
}

func (s *Server) listAllocs(w http.ResponseWriter, r *http.Request) {
	allocs, err := s.node.List(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, allocs)
}

func (s *Server) allocStatus(w http.ResponseWriter, r *http.Request) {
	s.withID(w, r, func(id string) (any, error) { return s.node.Status(r.Context(), id) })
}

func (s *Server) stopAlloc(w http.ResponseWriter, r *http.Request) {
	s.withID(w, r, func(id string) (any, error) { return s.node.Stop(r.Context(), id) })
}

// gcAlloc collects one terminal allocation; a running one is refused.
func (s *Server) gcAlloc(w http.ResponseWriter, r *http.Request) {
	s.withID(w, r, func(id string) (any, error) {
		if err := s.node.Collect(r.Context(), id, "requested"); err != nil {
			return nil, err
		}
		return GCResponse{Collected: []string{id}}, nil
	})
}

// gcAll collects every terminal allocation, oldest stopped first.
func (s *Server) gcAll(w http.ResponseWriter, r *http.Request) {
	collected, err := s.node.CollectAll(r.Context(), "node gc requested")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, GCResponse{Collected: collected})
}

func (s *Server) destroyAlloc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err == nil {
		err = s.node.Destroy(r.Context(), id)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nodeStatus(w http.ResponseWriter, r *http.Request) {
	st, err := s.node.NodeStatus(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, st)
}

// allocStubs answers AllocationsPath as Nomad answers /v1/allocations:
// the stubs of every allocation whose ID starts with ?prefix=.
func (s *Server) allocStubs(w http.ResponseWriter, r *http.Request) {
	allocs, err := s.node.List(r.Context())
	if err != nil {
		s.clientError(w, r, err)
		return
	}
	prefix := r.URL.Query().Get("prefix")
	stubs := []AllocStub{}
	for _, a := range allocs {
		if strings.HasPrefix(a.ID, prefix) {
			stubs = append(stubs, stubOf(a))
		}
	}
	sort.Slice(stubs, func(i, j int) bool { return stubs[i].ID < stubs[j].ID })
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(stubs)
}

// stubOf is a's entry of AllocationsPath.
func stubOf(a *Alloc) AllocStub {
	client, task := "running", "running"
	modified := a.Created
	if a.Status == StatusTerminal {
		client, task = "complete", "dead"
		if a.Stopped != nil {
			modified = *a.Stopped
		}
	}
	states := make(map[string]TaskState, len(a.Tasks))
	for _, t := range a.Tasks {
		states[t.Name] = TaskState{State: task}
	}
	return AllocStub{ID: a.ID, Name: a.ID, ClientStatus: client, TaskStates: states,
		CreateTime: a.Created.UnixNano(), ModifyTime: modified.UnixNano()}
}

// withID answers a request on one allocation: the {id} of its path,
// checked, then fn's value as JSON or its error.
func (s *Server) withID(w http.ResponseWriter, r *http.Request, fn func(id string) (any, error)) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	v, err := fn(id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, v)
}

// writeError answers with the status of err and its message. Errors that
// are the daemon's fault are logged: the caller only sees the message.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := StatusCode(err)
	if code == http.StatusInternalServerError {
		s.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	s.writeJSON(w, code, errorBody{Error: err.Error()})
}

func (s *Server) writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		// The status line is out: all that is left is to tell the log.
		s.logger.Warn("failed to write response", "error", err)
	}
}

// decodeBody decodes one JSON value from the request body into v,
// refusing unknown fields, trailing data and bodies over maxBodyBytes.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: cannot decode body: %v", ErrBadRequest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: body holds more than one JSON value", ErrBadRequest)
	}
	return nil
}

// pathID returns the {id} of the request path, checked to be a valid
// allocation ID.
func pathID(r *http.Request) (string, error) {
	id := r.PathValue("id")
	if err := allocdir.ValidID(id); err != nil {
		return "", fmt.Errorf("invalid allocation ID: %w", err)
	}
	return id, nil
}
