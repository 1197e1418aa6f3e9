package migrate

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"net/http"
	"net/url"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/hashicorp/go-hclog"
)

const (
	// SnapshotPattern is the route of the snapshot endpoint, in
	// net/http.ServeMux syntax (it also answers HEAD).
	SnapshotPattern = "GET /v1/client/allocation/{id}/snapshot"

	// TrailerCRC32C is the HTTP trailer that carries the lowercase hex
	// CRC-32C of the whole tar stream. It is declared in the Trailer
	// header before the body, sent after it, and ignored by Nomad's
	// clients, so the body stays exactly Nomad's format.
	TrailerCRC32C = "X-Allocfs-Snapshot-Crc32c"
)

// castagnoli is the CRC-32C table: the checksum only has to catch damage
// and truncation in transit (the token authenticates the source, TLS
// protects against tampering), and CRC-32C runs in hardware, where a
// cryptographic hash of every byte on both ends cost the transfer about
// 40% of its CPU.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

const (
	// sendStallTimeout is how long one write to the receiver may block:
	// a receiver that stops reading is given up on, while the server's
	// own WriteTimeout, if any, is replaced so that a large snapshot is
	// not cut for taking long.
	sendStallTimeout = 2 * time.Minute

	// sendBufSize batches the tar writer's small writes (a 512-byte
	// header per entry) into large chunks on the wire.
	sendBufSize = 256 << 10
)

// SnapshotPath returns the path of allocID's snapshot, to be appended to
// a node's base URL.
func SnapshotPath(allocID string) string {
	return "/v1/client/allocation/" + url.PathEscape(allocID) + "/snapshot"
}

// SnapshotHandler serves GET /v1/client/allocation/{id}/snapshot: Nomad's
// migration tar of the allocation that lookup returns, streamed as it is
// written, with its CRC-32C in the TrailerCRC32C trailer. The returned
// handler routes by itself, so it can be registered on a mux with
// SnapshotPattern or under the /v1/client/allocation/ prefix.
//
// The token (see TokenHeader) is checked before anything else: a request
// without one that tokens accepts gets 403 "Permission denied" and
// nothing is looked up or read. A nil tokens refuses every request.
//
// Status codes, all sent before any byte of the archive:
//   - 400 for an ID that cannot be an allocation's;
//   - 403 for a missing or refused token;
//   - 404 when lookup's error wraps allocdir.ErrUnknownAlloc;
//   - 410 when it wraps allocdir.ErrGone;
//   - 500 for any other error of lookup, or of the snapshot before it
//     wrote anything.
//
// Once the archive has started the status is 200 and failures are
// signalled in-band, as Nomad does: a snapshot that fails reading appends
// its error entry, which every receiver refuses. A client that goes away,
// or stops reading for 2 minutes, stops the snapshot at its next write;
// the server's WriteTimeout does not apply (each write gets its own
// deadline), so a large snapshot is not cut for taking long.
func SnapshotHandler(logger hclog.Logger, lookup func(allocID string) (allocdir.FS, error), tokens TokenChecker) http.Handler {
	h := &snapshotHandler{
		logger: logger.Named("migrate_server"),
		lookup: lookup,
		tokens: tokens,
	}
	mux := http.NewServeMux()
	mux.Handle(SnapshotPattern, h)
	return mux
}

type snapshotHandler struct {
	logger hclog.Logger
	lookup func(string) (allocdir.FS, error)
	tokens TokenChecker
}

func (h *snapshotHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	logger := h.logger.With("alloc_id", id, "remote_addr", r.RemoteAddr)
	if err := allocdir.ValidName(id); err != nil {
		logger.Warn("refused snapshot request", "error", err)
		http.Error(w, "invalid allocation ID", http.StatusBadRequest)
		return
	}
	token := RequestToken(r)
	if h.tokens == nil || token == "" || !h.tokens.Check(id, token) {
		logger.Warn("refused snapshot request", "reason", "missing or invalid token")
		http.Error(w, "Permission denied", http.StatusForbidden)
		return
	}
	fsys, err := h.lookup(id)
	if err == nil && fsys == nil {
		err = fmt.Errorf("alloc %s: %w", id, allocdir.ErrUnknownAlloc)
	}
	if err != nil {
		h.fail(w, logger, "failed to look up allocation", err)
		return
	}
	if r.Method == http.MethodHead {
		setArchiveHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		return
	}

	start := time.Now()
	sw := &sendWriter{w: w, rc: http.NewResponseController(w), hash: crc32.New(castagnoli)}
	bw := bufio.NewWriterSize(sw, sendBufSize)
	err = fsys.Snapshot(bw)
	if ferr := bw.Flush(); ferr != nil && err == nil {
		err = ferr
	}
	switch {
	case !sw.started && err != nil:
		h.fail(w, logger, "failed to snapshot allocation", err)
		return
	case sw.err != nil:
		// The connection is gone: nothing more can reach the receiver,
		// which sees a cut stream and retries.
		logger.Warn("snapshot transfer aborted", "bytes", sw.n, "duration", time.Since(start), "error", sw.err)
		return
	}
	sw.start() // an archive is never empty, but the status must go out
	sum := hex.EncodeToString(sw.hash.Sum(nil))
	w.Header().Set(TrailerCRC32C, sum)
	if err != nil {
		// The archive carries the error entry and is complete: the
		// receiver refuses it for what it says.
		logger.Error("snapshot failed; the archive carries the error", "bytes", sw.n, "duration", time.Since(start), "error", err)
		return
	}
	logger.Info("sent snapshot", "bytes", sw.n, "duration", time.Since(start), "crc32c", sum)
}

// fail answers a request that failed before any of the archive was sent.
func (h *snapshotHandler) fail(w http.ResponseWriter, logger hclog.Logger, msg string, err error) {
	switch {
	case errors.Is(err, allocdir.ErrUnknownAlloc):
		logger.Warn(msg, "error", err)
		http.Error(w, allocdir.ErrUnknownAlloc.Error(), http.StatusNotFound)
	case errors.Is(err, allocdir.ErrGone):
		logger.Warn(msg, "error", err)
		http.Error(w, allocdir.ErrGone.Error(), http.StatusGone)
	default:
		// The details (host paths among them) go to the log only.
		logger.Error(msg, "error", err)
		http.Error(w, msg, http.StatusInternalServerError)
	}
}

func setArchiveHeaders(h http.Header) {
	h.Set("Content-Type", "application/x-tar")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
}

// sendWriter hashes and counts what goes out, commits the 200 status with
// the first byte (so that an error before it can still get its own
// status) and remembers the first failed write.
type sendWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	hash    hash.Hash
	n       int64
	err     error
	started bool
	// noDeadline is set once the writer turned out not to support write
	// deadlines.
	noDeadline bool
}

func (s *sendWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	setArchiveHeaders(h)
	h.Set("Trailer", TrailerCRC32C)
	s.w.WriteHeader(http.StatusOK)
}

func (s *sendWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	s.start()
	if !s.noDeadline {
		if err := s.rc.SetWriteDeadline(time.Now().Add(sendStallTimeout)); err != nil {
			s.noDeadline = true
		}
	}
	n, err := s.w.Write(p)
	s.hash.Write(p[:n])
	s.n += int64(n)
	if err != nil {
		s.err = fmt.Errorf("failed to send snapshot: %w", err)
		return n, s.err
	}
	return n, nil
}
