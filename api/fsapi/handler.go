package fsapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"net/http"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/hashicorp/go-hclog"
)

// Nomad's validation messages, word for word.
const (
	msgAllocID   = "must provide a valid alloc id"
	msgFileName  = "must provide a file name"
	msgTask      = "must provide task name"
	msgLogType   = "must provide log type (stdout/stderr)"
	msgOrigin    = "origin must be start or end"
	msgUnknownTk = "unknown task name"
)

const (
	originStart = "start"
	originEnd   = "end"
)

// Prefix is the common prefix of every path this package serves.
const Prefix = "/v1/client/fs/"

// Lookup returns the read side of an allocation. It fails with
// allocdir.ErrUnknownAlloc or allocdir.ErrGone for an allocation the node
// does not have.
type Lookup func(allocID string) (allocdir.FS, error)

// Handler serves the API for the allocations lookup finds.
type Handler struct {
	logger hclog.Logger
	lookup Lookup
	mux    *http.ServeMux
	// following counts the streams waiting at the end of a file for
	// more; see Following.
	following atomic.Int64
	// streams is the parent of every stream's context: StopStreams ends
	// them all, so that a shutdown need not wait for followers that would
	// never finish by themselves.
	streams     context.Context
	stopStreams context.CancelFunc
}

// NewHandler returns the API's handler.
func NewHandler(logger hclog.Logger, lookup Lookup) *Handler {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	h := &Handler{logger: logger.Named("fsapi"), lookup: lookup, mux: http.NewServeMux()}
	h.streams, h.stopStreams = context.WithCancel(context.Background())
	h.mux.HandleFunc("GET "+Prefix+"ls/{alloc...}", h.ls)
	h.mux.HandleFunc("GET "+Prefix+"stat/{alloc...}", h.stat)
	h.mux.HandleFunc("GET "+Prefix+"cat/{alloc...}", h.cat)
	h.mux.HandleFunc("GET "+Prefix+"readat/{alloc...}", h.readAt)
	h.mux.HandleFunc("GET "+Prefix+"stream/{alloc...}", h.stream)
	h.mux.HandleFunc("GET "+Prefix+"logs/{alloc...}", h.logs)
	return h
}

// StopStreams ends every stream in progress, and those started later at
// once: for a server that is shutting down (http.Server.RegisterOnShutdown).
func (h *Handler) StopStreams() { h.stopStreams() }

// streamContext is the context of one stream: it ends with the request or
// with StopStreams.
func (h *Handler) streamContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(r.Context())
	stop := context.AfterFunc(h.streams, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// Following returns how many clients follow a file now (stream or logs
// with follow), for the node's metrics.
func (h *Handler) Following() int64 { return h.following.Load() }

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// codedError is an answer other than 500, with its message as the body.
type codedError struct {
	code int
	msg  string
}

func (e *codedError) Error() string { return e.msg }

func badRequest(format string, a ...any) error {
	return &codedError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

// statusOf maps an error to its status code: Nomad's where Nomad has one,
// and what the refusal is where Nomad would answer 500.
func statusOf(err error) int {
	var ce *codedError
	switch {
	case errors.As(err, &ce):
		return ce.code
	case errors.Is(err, allocdir.ErrUnknownAlloc), errors.Is(err, allocdir.ErrGone),
		errors.Is(err, iofs.ErrNotExist):
		return http.StatusNotFound
	case errors.Is(err, allocdir.ErrSecret), errors.Is(err, allocdir.ErrPrivate):
		return http.StatusForbidden
	case errors.Is(err, allocdir.ErrEscapes), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOTDIR),
		errors.Is(err, allocdir.ErrNotRegular):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

// writeError answers err as Nomad does: the status and the bare message.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := statusOf(err)
	msg := err.Error()
	if code == http.StatusInternalServerError {
		// The detail (which may name backing paths) goes to the log only.
		h.logger.Error("request failed", "path", r.URL.Path, "error", err)
		msg = "internal error: see the allocfs log"
	}
	safeHeaders(w, "text/plain; charset=utf-8")
	w.WriteHeader(code)
	io.WriteString(w, msg)
}

// safeHeaders sets a content type and forbids browsers from guessing
// another one: nothing served here is for a browser to render.
func safeHeaders(w http.ResponseWriter, contentType string) {
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; sandbox")
}

// alloc looks up the allocation a request names.
func (h *Handler) alloc(r *http.Request) (allocdir.FS, string, error) {
	id := r.PathValue("alloc")
	if id == "" {
		return nil, "", badRequest(msgAllocID)
	}
	fsys, err := h.lookup(id)
	if err != nil {
		// A collected allocation's error is also ErrUnknownAlloc: the
		// more precise answer goes first.
		if errors.Is(err, allocdir.ErrGone) {
			return nil, id, &codedError{code: http.StatusNotFound, msg: fmt.Sprintf("state for allocation %s not found on client", id)}
		}
		if errors.Is(err, allocdir.ErrUnknownAlloc) {
			return nil, id, &codedError{code: http.StatusNotFound, msg: fmt.Sprintf("Unknown allocation %q", id)}
		}
		return nil, id, err
	}
	return fsys, id, nil
}

// allocPath is alloc for the endpoints whose path parameter is required.
func (h *Handler) allocPath(r *http.Request) (allocdir.FS, string, string, error) {
	fsys, id, err := h.alloc(r)
	if err != nil {
		return nil, id, "", err
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		return nil, id, "", badRequest(msgFileName)
	}
	return fsys, id, p, nil
}

func (h *Handler) writeJSON(w http.ResponseWriter, v any) {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		h.logger.Error("failed to encode an answer", "error", err)
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	safeHeaders(w, "application/json")
	w.Write(buf.Bytes())
}

func (h *Handler) ls(w http.ResponseWriter, r *http.Request) {
	fsys, _, err := h.alloc(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	p := r.URL.Query().Get("path")
	if p == "" {
		p = "/"
	}
	files, err := fsys.List(p)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if files == nil {
		files = []*allocdir.FileInfo{}
	}
	h.writeJSON(w, files)
}

func (h *Handler) stat(w http.ResponseWriter, r *http.Request) {
	fsys, _, p, err := h.allocPath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	fi, err := fsys.Stat(p)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	h.writeJSON(w, fi)
}

func (h *Handler) cat(w http.ResponseWriter, r *http.Request) {
	fsys, _, p, err := h.allocPath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	fi, err := fsys.Stat(p)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if fi.IsDir {
		h.writeError(w, r, badRequest("file %q is a directory", p))
		return
	}
	h.raw(w, r, fsys, p, 0, -1)
}

func (h *Handler) readAt(w http.ResponseWriter, r *http.Request) {
	fsys, _, p, err := h.allocPath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	offset, err := strconv.ParseInt(q.Get("offset"), 10, 64)
	if err != nil {
		h.writeError(w, r, badRequest("error parsing offset: %v", err))
		return
	}
	if offset < 0 {
		h.writeError(w, r, badRequest("offset must be non-negative, got %d", offset))
		return
	}
	limit := int64(-1)
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.ParseInt(s, 10, 64); err != nil {
			h.writeError(w, r, badRequest("error parsing limit: %v", err))
			return
		}
		if limit <= 0 {
			limit = -1
		}
	}
	h.raw(w, r, fsys, p, offset, limit)
}

// raw answers the bytes of p from offset, up to limit (-1: to the end),
// with nothing around them.
func (h *Handler) raw(w http.ResponseWriter, r *http.Request, fsys allocdir.FS, p string, offset, limit int64) {
	rc, err := fsys.ReadAt(p, offset)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer rc.Close()
	var src io.Reader = rc
	if limit >= 0 {
		src = io.LimitReader(rc, limit)
	}
	safeHeaders(w, "application/octet-stream")
	buf := make([]byte, frameSize)
	if _, err := io.CopyBuffer(w, src, buf); err != nil {
		h.logger.Debug("raw read ended early", "path", p, "error", err)
	}
}

// boolParam parses an optional boolean parameter with Nomad's message.
func boolParam(r *http.Request, name string, def bool) (bool, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return false, badRequest("failed to parse %s field to boolean: %v", name, err)
	}
	return v, nil
}

// offsetOrigin parses the optional offset and origin parameters.
func offsetOrigin(r *http.Request) (int64, string, error) {
	q := r.URL.Query()
	var offset int64
	if s := q.Get("offset"); s != "" {
		var err error
		if offset, err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, "", badRequest("error parsing offset: %v", err)
		}
		if offset < 0 {
			return 0, "", badRequest("offset must be non-negative, got %d", offset)
		}
	}
	origin := q.Get("origin")
	switch origin {
	case "":
		origin = originStart
	case originStart, originEnd:
	default:
		return 0, "", badRequest(msgOrigin)
	}
	return offset, origin, nil
}

// startStream writes the headers of a streamed answer and returns its
// framer.
func startStream(w http.ResponseWriter, plain bool) *framer {
	ct := "application/json"
	if plain {
		ct = "text/plain; charset=utf-8"
	}
	safeHeaders(w, ct)
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	return newFramer(w, func() { _ = rc.Flush() }, plain)
}

func (h *Handler) stream(w http.ResponseWriter, r *http.Request) {
	fsys, id, p, err := h.allocPath(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	offset, origin, err := offsetOrigin(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	follow, err := boolParam(r, "follow", true)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	fi, err := fsys.Stat(p)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if fi.IsDir {
		h.writeError(w, r, badRequest("file %q is a directory", p))
		return
	}
	if origin == originEnd {
		offset = max(fi.Size-offset, 0)
	}
	rc, err := fsys.ReadAt(p, offset)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	start := time.Now()
	f := startStream(w, false)
	// Deferred, so that the framer's timer stops however the stream ends:
	// a heartbeat written after the handler returned would bring the
	// process down.
	defer func() { h.finish(r, id, f, err, start) }()
	ctx, cancel := h.streamContext(r)
	defer cancel()
	s := &streamer{fs: fsys, f: f, following: &h.following}
	_, _, err = s.streamFile(ctx, p, rc, offset, follow, nil)
}

func (h *Handler) logs(w http.ResponseWriter, r *http.Request) {
	fsys, id, err := h.alloc(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	q := r.URL.Query()
	task := q.Get("task")
	if task == "" {
		h.writeError(w, r, badRequest(msgTask))
		return
	}
	typ := q.Get("type")
	if typ != "stdout" && typ != "stderr" {
		h.writeError(w, r, badRequest(msgLogType))
		return
	}
	offset, origin, err := offsetOrigin(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	follow, err := boolParam(r, "follow", false)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	plain, err := boolParam(r, "plain", false)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if allocdir.ValidTaskName(task) != nil {
		h.writeError(w, r, badRequest(msgUnknownTk))
		return
	}
	if fi, err := fsys.Stat(task); err != nil || !fi.IsDir {
		if err != nil && !errors.Is(err, iofs.ErrNotExist) {
			h.writeError(w, r, err)
			return
		}
		h.writeError(w, r, badRequest(msgUnknownTk))
		return
	}
	files, err := listLogs(fsys, task, typ)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if len(files) == 0 {
		h.writeError(w, r, &codedError{code: http.StatusNotFound,
			msg: fmt.Sprintf("log entry for task %q and log type %q not found", task, typ)})
		return
	}
	index, at := startOfLogs(files, origin, offset)
	// The first file is opened before the status line goes out, so that a
	// refusal (a log file that is a link into secrets/) is a status code.
	rc, err := fsys.ReadAt(logName(task, typ, index), at)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	start := time.Now()
	f := startStream(w, plain)
	defer func() { h.finish(r, id, f, err, start) }()
	ctx, cancel := h.streamContext(r)
	defer cancel()
	s := &streamer{fs: fsys, f: f, following: &h.following}
	err = s.logs(ctx, task, typ, rc, index, at, files[len(files)-1].index, follow)
}

// finish flushes a stream and logs how it ended. The status line is out
// by now, so an error can only end the answer early.
func (h *Handler) finish(r *http.Request, id string, f *framer, err error, start time.Time) {
	closeErr := f.Close()
	switch {
	case err == nil, errors.Is(err, errClientGone), errors.Is(err, context.Canceled):
	case statusOf(err) != http.StatusInternalServerError:
		// What a task did to its files (a FIFO swapped in for a log
		// file, say) is not the daemon's trouble, and must not let a
		// task fill its log.
		h.logger.Debug("stream ended by a refusal", "alloc_id", id, "path", r.URL.Path, "error", err)
	default:
		h.logger.Warn("stream ended by an error", "alloc_id", id, "path", r.URL.Path, "error", err)
	}
	h.logger.Debug("stream ended", "alloc_id", id, "query", r.URL.RawQuery,
		"client_gone", errors.Is(closeErr, errClientGone) || r.Context().Err() != nil, "duration", time.Since(start))
}
