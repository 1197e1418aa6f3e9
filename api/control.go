// Package api is the HTTP side of allocfs: the control API that `allocfs
// serve` answers on its unix socket, and the Go client the CLI uses to talk
// to it.
//
// # The control API
//
// Requests and answers are JSON. Every error answer has the body
// {"error": "..."} and a status code chosen from the error's sentinel in one
// place (statusCode):
//
//	POST   /v1/allocs            create an allocation, migrating
//	                             a previous one's data   201, 400, 404, 409
//	GET    /v1/allocs            list allocations        200
//	GET    /v1/allocs/{id}       status of one           200, 400, 404, 410
//	POST   /v1/allocs/{id}/stop  make it terminal        200, 404, 410
//	POST   /v1/allocs/{id}/gc    collect a terminal one  200, 404, 409, 410
//	DELETE /v1/allocs/{id}       destroy one             204, 400, 404, 410
//	POST   /v1/gc                collect every terminal  200
//	GET    /v1/status            the node                200
//
// 404 means the daemon never knew the allocation; 410 means it was
// destroyed since the daemon started.
//
// The handlers never read or write through the mount: a FUSE server that
// reads its own mount can deadlock. Everything they report comes from the
// store and from the backing directories under the data dir; the changes
// they make reach the kernel's caches through the store's OnChange hook,
// before the response is sent.
package api

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"net/http"
	"os/user"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/migrate"
	"github.com/hashicorp/go-hclog"
)

// ErrBadRequest: a request the server could not decode (malformed JSON,
// unknown fields, a body too large). The client also returns it for a 400
// answer, whatever the reason the server gave.
var ErrBadRequest = errors.New("bad request")

// maxBodyBytes caps request bodies; a create request is a few hundred
// bytes.
const maxBodyBytes = 1 << 20

// Server answers the control API for one store and its mount. It is an
// http.Handler; all methods are safe for concurrent use.
type Server struct {
	logger      hclog.Logger
	store       *store.Store
	collector   *store.Collector
	mountDir    string
	passthrough func() bool
	mux         *http.ServeMux
	// background is work a request started and did not wait for (the
	// migration log line); Wait waits for it.
	background sync.WaitGroup
	// stopStreams ends the client API's streams; see StopStreams.
	stopStreams func()
	// fetchTLS is the TLS of remote migrations' fetches; see SetFetchTLS.
	fetchTLS atomic.Pointer[tls.Config]
	// health runs the checks of GET /v1/agent/health; see SetHealth.
	health func() []HealthCheck
}

// SetFetchTLS sets the TLS configuration of the fetches of remote
// migrations (--from https://...): the roots that authenticate other
// nodes and this node's client certificate. A fetch takes the one set
// when it starts: a reload may set another at any time.
func (s *Server) SetFetchTLS(cfg *tls.Config) { s.fetchTLS.Store(cfg) }

// Wait waits for work that requests left running in the background.
func (s *Server) Wait() { s.background.Wait() }

// NewServer returns the control API of store, whose mount is at mountDir.
// Garbage collection asked for over the API goes through collector, the
// node's one collector. passthrough reports whether the mount serves file
// data by passthrough now (fs.Mount.Passthrough): it can turn off after
// mount time.
func NewServer(logger hclog.Logger, store *store.Store, collector *store.Collector, mountDir string, passthrough func() bool) *Server {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	s := &Server{
		logger:      logger.Named("api"),
		store:       store,
		collector:   collector,
		mountDir:    mountDir,
		passthrough: passthrough,
		mux:         http.NewServeMux(),
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
	return s
}

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
	if err := checkTaskUsers(req.Tasks); err != nil {
		s.writeError(w, r, err)
		return
	}
	if r.URL.Query().Get("progress") == "1" {
		s.createStreaming(w, r, req)
		return
	}
	st, err := s.create(r.Context(), req, nil)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	w.Header().Set("Location", allocPath(st.ID))
	s.writeJSON(w, http.StatusCreated, st)
}

func (s *Server) listAllocs(w http.ResponseWriter, r *http.Request) {
	s.writeJSON(w, http.StatusOK, s.store.List())
}

func (s *Server) allocStatus(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.store.Get(id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := AllocStatus{
		State:       *st,
		Mount:       filepath.Join(s.mountDir, st.ID),
		Layers:      make(map[string]LayerUsage, len(st.Volumes)),
		Passthrough: s.passthrough(),
	}
	for key, v := range st.Volumes {
		if v == nil {
			continue
		}
		u, err := layerUsage(s.store.LayerPath(v.Upper))
		if err != nil {
			s.writeError(w, r, fmt.Errorf("failed to measure layer %s of %s/%s: %w", v.Upper, id, key, err))
			return
		}
		u.Upper, u.Lowers = v.Upper, v.Lowers
		out.Layers[key] = u
	}
	s.writeJSON(w, http.StatusOK, out)
}

func (s *Server) destroyAlloc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.store.Destroy(id); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) nodeStatus(w http.ResponseWriter, r *http.Request) {
	sf, err := s.store.Statfs()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	bsize := uint64(sf.Bsize)
	if sf.Frsize > 0 {
		// f_blocks, f_bfree and f_bavail count fragments.
		bsize = uint64(sf.Frsize)
	}
	s.writeJSON(w, http.StatusOK, NodeStatus{
		DataDir:     s.store.DataDir(),
		Mount:       s.mountDir,
		Passthrough: s.passthrough(),
		Allocs:      s.store.Len(),
		Goroutines:  runtime.NumGoroutine(),
		Backing: BackingStatus{
			BytesTotal:     sf.Blocks * bsize,
			BytesFree:      sf.Bfree * bsize,
			BytesAvailable: sf.Bavail * bsize,
			FilesTotal:     sf.Files,
			FilesFree:      sf.Ffree,
			BlockSize:      sf.Bsize,
			NameMax:        sf.Namelen,
		},
	})
}

// statusCode is the one place that maps an error to an HTTP status.
// ErrGone is tested before ErrUnknownAlloc: the store's "gone" error is
// both, and the more precise answer wins.
func statusCode(err error) int {
	switch {
	case errors.Is(err, allocdir.ErrGone):
		return http.StatusGone
	case errors.Is(err, allocdir.ErrUnknownAlloc):
		return http.StatusNotFound
	case errors.Is(err, store.ErrExists), errors.Is(err, store.ErrNotTerminal), errors.Is(err, store.ErrPinned):
		return http.StatusConflict
	case errors.Is(err, migrate.ErrPermissionDenied):
		return http.StatusForbidden
	case errors.Is(err, allocdir.ErrArchive), errors.Is(err, migrate.ErrIntegrity):
		return http.StatusBadGateway
	case errors.Is(err, allocdir.ErrInvalidName), errors.Is(err, store.ErrNoTasks), errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// writeError answers with the status of err and its message. Errors that
// are the daemon's fault are logged: the caller only sees the message.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := statusCode(err)
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

// checkTaskUsers refuses a create whose task names a user this node does
// not have, before anything is created, with the message `allocfs exec
// --user` gives: accepted, it would only make the task's secrets silently
// the agent's alone. A lookup that fails for another reason is the
// node's trouble, not the request's.
func checkTaskUsers(tasks []allocdir.Task) error {
	for _, t := range tasks {
		if t.User == "" {
			continue
		}
		_, err := allocdir.LookupUser(t.User)
		var (
			unknownName user.UnknownUserError
			unknownID   user.UnknownUserIdError
		)
		switch {
		case err == nil:
		case errors.As(err, &unknownName), errors.As(err, &unknownID):
			return fmt.Errorf("%w: task %q: %w", ErrBadRequest, t.Name, err)
		default:
			return fmt.Errorf("task %q: %w", t.Name, err)
		}
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

// layerUsage walks a layer directory on the backing store without
// following symbolic links and counts its non-directory entries and the
// bytes of its regular files. Entries removed while it walks (a task
// deleting files) are skipped, not errors.
func layerUsage(dir string) (LayerUsage, error) {
	var u LayerUsage
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) && p != dir {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		u.Files++
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info() // lstat
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) {
				u.Files--
				return nil
			}
			return err
		}
		u.Bytes += fi.Size()
		return nil
	})
	return u, err
}
