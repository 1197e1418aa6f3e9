package migrate

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/hashicorp/go-hclog"
)

// Defaults and bounds of FetchOptions.
const (
	// DefaultRetries is how many attempts Fetch makes in all.
	DefaultRetries = 5
	// DefaultBackoff is the wait before the first retry; it doubles after
	// every failed attempt up to MaxBackoff.
	DefaultBackoff = 500 * time.Millisecond
	// MaxBackoff caps the wait between attempts (unless Backoff itself is
	// larger).
	MaxBackoff = 10 * time.Second
	// DefaultStallTimeout is how long an attempt may go without receiving
	// a byte, response headers included, before it is abandoned.
	DefaultStallTimeout = 60 * time.Second
	// DefaultDeadline bounds a whole fetch, every attempt and every wait
	// between attempts included.
	DefaultDeadline = 30 * time.Minute
	// DefaultMinProgressBytes and DefaultMinProgressWindow: an attempt
	// whose body brings fewer than 1 KiB in a minute is abandoned. A
	// sender that trickles a byte now and then never stalls, yet could
	// hold a fetch until its deadline.
	DefaultMinProgressBytes  = 1 << 10
	DefaultMinProgressWindow = 60 * time.Second
)

const (
	// recvBufSize is the read-ahead between the network and the
	// extractor: the tar reader's 512-byte header reads are then served
	// from memory.
	recvBufSize = 1 << 20
	// progressInterval is the shortest interval between two progress
	// reports of one attempt.
	progressInterval = 200 * time.Millisecond
	// maxErrorBody caps how much of an error response is kept.
	maxErrorBody = 4 << 10
	// maxTrailingBytes caps what is read after the archive's end while
	// looking for the integrity trailer.
	maxTrailingBytes = 64 << 10
	// tarTrailerSize is tar's end-of-archive marker: two zero blocks.
	tarTrailerSize = 2 * 512
)

var (
	// ErrPermissionDenied: the source refused the token (HTTP 403).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrIntegrity: the archive arrived complete but its CRC-32C is not
	// the one the source sent, or the source's trailer is unusable.
	ErrIntegrity = errors.New("snapshot integrity check failed")
	// ErrDeadline: the fetch did not complete within
	// FetchOptions.Deadline. It is not retried.
	ErrDeadline = errors.New("snapshot fetch deadline exceeded")
	// ErrTooSlow: an attempt received fewer than
	// FetchOptions.MinProgressBytes in a MinProgressWindow. The attempt is
	// retried, as a stalled one is.
	ErrTooSlow = errors.New("transfer too slow")
	// errStalled is the cause an attempt is cancelled with when no byte
	// arrived for StallTimeout.
	errStalled = errors.New("transfer stalled")
)

// StatusError is a response other than 200 OK. It wraps
// ErrPermissionDenied for 403, allocdir.ErrUnknownAlloc for 404 and
// allocdir.ErrGone for 410.
type StatusError struct {
	StatusCode int
	// Message is the start of the response body, trimmed.
	Message string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("unexpected response code: %d (%s)", e.StatusCode, e.Message)
}

// Unwrap returns the sentinel the status stands for, if any.
func (e *StatusError) Unwrap() error {
	switch e.StatusCode {
	case http.StatusForbidden:
		return ErrPermissionDenied
	case http.StatusNotFound:
		return allocdir.ErrUnknownAlloc
	case http.StatusGone:
		return allocdir.ErrGone
	}
	return nil
}

// transient reports whether another attempt may get a different answer:
// the source is overloaded or failing, not refusing.
func (e *StatusError) transient() bool {
	return e.StatusCode >= 500 || e.StatusCode == http.StatusTooManyRequests
}

// FetchOptions says where a snapshot comes from and where it goes.
type FetchOptions struct {
	// URL is the source node's base URL, e.g. http://10.0.0.1:4646.
	URL string
	// AllocID is the previous allocation, the one to snapshot.
	AllocID string
	// Token is sent in the X-Nomad-Token header (see TokenChecker).
	Token string
	// StagingDir must exist; the snapshot is extracted into a new
	// directory inside it (see Fetched.Dir).
	StagingDir string
	// HTTPClient makes the requests. nil means a client with connect,
	// TLS handshake and response header timeouts but no overall timeout:
	// a transfer takes as long as it takes while bytes flow.
	HTTPClient *http.Client
	// TLS configures the default client's TLS (trusted roots, a client
	// certificate for mutual TLS) for an https URL; nil means the
	// system's roots and no client certificate. Ignored with HTTPClient.
	TLS *tls.Config
	// Retries is how many attempts are made in all; 0 (or less) means
	// DefaultRetries. 1 means no retry.
	Retries int
	// Backoff is the wait before the first retry; 0 (or less) means
	// DefaultBackoff. It doubles after each failed attempt, up to
	// MaxBackoff. A Retry-After header of a 429 or 5xx response may
	// lengthen one wait, up to MaxBackoff.
	Backoff time.Duration
	// StallTimeout abandons an attempt that received nothing for that
	// long, response headers included; 0 means DefaultStallTimeout and a
	// negative value disables it.
	StallTimeout time.Duration
	// Deadline bounds the whole fetch, every attempt and every wait
	// between attempts included: when it passes, the attempt under way
	// is abandoned and Fetch fails with ErrDeadline. 0 means
	// DefaultDeadline and a negative value disables it.
	Deadline time.Duration
	// MinProgressBytes and MinProgressWindow: an attempt whose body
	// brings fewer than MinProgressBytes in a MinProgressWindow (windows
	// counted from the response) is abandoned with ErrTooSlow and
	// retried. 0 means DefaultMinProgressBytes and
	// DefaultMinProgressWindow; a negative MinProgressBytes disables the
	// rule.
	MinProgressBytes  int64
	MinProgressWindow time.Duration
	// Limits are passed to snapshot.Extract.
	Limits snapshot.ExtractOptions
	// Progress, when set, is called from the goroutine that runs Fetch
	// (so it must not block) at most every 200 ms while bytes arrive, and
	// once more with Done set when an attempt that got a response ends.
	Progress func(Progress)
	// Logger receives one line per attempt; nil discards.
	Logger hclog.Logger
	// Observer is told of the fetch when it ends (the node's metrics);
	// nil: nobody.
	Observer FetchObserver
}

// Fetched describes a snapshot that was received, checked and extracted.
type Fetched struct {
	// Dir is the extracted snapshot, a new directory inside StagingDir
	// laid out like an allocation directory (alloc/data, <task>/local).
	// It belongs to the caller, who moves it into place or removes it.
	Dir string
	// Bytes is the size of the tar stream received.
	Bytes int64
	// Entries is the number of archive entries read.
	Entries int
	// Duration is the time from the first request to the end of the
	// successful attempt, waits between attempts included.
	Duration time.Duration
	// Attempts is how many attempts it took.
	Attempts int
	// Verified is true when the source sent the CRC-32C trailer and it
	// matched. A stock Nomad source sends none; the archive's own
	// end-of-archive check still applied.
	Verified bool
}

// Fetch streams the snapshot of opts.AllocID from the node at opts.URL
// and extracts it, with snapshot.Extract, into a new directory
// inside opts.StagingDir, which it returns once the archive was read to
// its end, every entry was accepted and, when the source sent one, the
// CRC-32C trailer matched, all within opts.Deadline.
//
// It is all or nothing: an attempt that fails leaves nothing inside
// StagingDir. Transient failures are retried with a doubling backoff, up
// to opts.Retries attempts in all: errors connecting, a connection cut,
// stalled or too slow mid-transfer (an archive that ends early, however it
// ends), an integrity mismatch, 5xx and 429. Everything else fails at
// once: the deadline (ErrDeadline), 403
// (ErrPermissionDenied), 404 (allocdir.ErrUnknownAlloc), 410
// (allocdir.ErrGone) and other 4xx (all as *StatusError), an archive
// refused for what it holds (allocdir.ErrArchive: a malicious entry, a
// limit, the sender's error entry), a refused TLS certificate, a local
// failure such as a full disk, and the cancellation of ctx, whose error is
// then wrapped.
func Fetch(ctx context.Context, opts FetchOptions) (*Fetched, error) {
	f, err := newFetcher(opts)
	if err != nil {
		return nil, err
	}
	if f.ownClient {
		defer f.client.CloseIdleConnections()
	}
	start := time.Now()
	res, err := f.run(ctx)
	if obs := f.opts.Observer; obs != nil {
		obs.Fetched(FetchReport{Attempts: f.attempts, Bytes: f.received, Duration: time.Since(start), Err: err})
	}
	return res, err
}

type fetcher struct {
	opts      FetchOptions
	url       string
	source    string // the URL without credentials, for logs and errors
	client    *http.Client
	ownClient bool
	logger    hclog.Logger
	// attempts counts the attempts made, and received the bytes of
	// their bodies, failed attempts' included.
	attempts int
	received int64
}

func newFetcher(opts FetchOptions) (*fetcher, error) {
	if err := allocdir.ValidID(opts.AllocID); err != nil {
		return nil, fmt.Errorf("failed to fetch snapshot: allocation ID: %w", err)
	}
	base, err := url.Parse(opts.URL)
	if err != nil {
		return nil, fmt.Errorf("failed to fetch snapshot of alloc %s: invalid URL: %w", opts.AllocID, err)
	}
	if (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("failed to fetch snapshot of alloc %s: invalid URL %q: want http(s)://host[:port]", opts.AllocID, base.Redacted())
	}
	if fi, err := os.Stat(opts.StagingDir); err != nil {
		return nil, fmt.Errorf("failed to fetch snapshot of alloc %s: staging dir: %w", opts.AllocID, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("failed to fetch snapshot of alloc %s: staging dir %q is not a directory", opts.AllocID, opts.StagingDir)
	}
	if opts.Retries <= 0 {
		opts.Retries = DefaultRetries
	}
	if opts.Backoff <= 0 {
		opts.Backoff = DefaultBackoff
	}
	if opts.StallTimeout == 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.Deadline == 0 {
		opts.Deadline = DefaultDeadline
	}
	if opts.MinProgressBytes == 0 {
		opts.MinProgressBytes = DefaultMinProgressBytes
	}
	if opts.MinProgressWindow <= 0 {
		opts.MinProgressWindow = DefaultMinProgressWindow
	}
	f := &fetcher{
		opts:   opts,
		url:    base.JoinPath("v1/client/allocation", url.PathEscape(opts.AllocID), "snapshot").String(),
		source: base.Redacted(),
		client: opts.HTTPClient,
	}
	if f.client == nil {
		f.client = defaultClient(opts.TLS)
		f.ownClient = true
	}
	logger := opts.Logger
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	f.logger = logger.Named("migrate").With("alloc_id", opts.AllocID, "source", f.source)
	return f, nil
}

// defaultClient has timeouts for every step that precedes the body, and
// none for the body itself: the stall watchdog covers it.
func defaultClient(tlsCfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:       tlsCfg,
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: DefaultStallTimeout,
		IdleConnTimeout:       90 * time.Second,
		ReadBufferSize:        256 << 10,
	}}
}

// attemptError is the outcome of a failed attempt: whether it is worth
// another, and how long the source asked to wait.
type attemptError struct {
	err        error
	transient  bool
	retryAfter time.Duration
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

func transientErr(err error) error { return &attemptError{err: err, transient: true} }

func (f *fetcher) run(ctx context.Context) (*Fetched, error) {
	start := time.Now()
	if f.opts.Deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, f.opts.Deadline,
			fmt.Errorf("%w: not done within %s", ErrDeadline, f.opts.Deadline))
		defer cancel()
	}
	backoff := f.opts.Backoff
	maxBackoff := max(MaxBackoff, f.opts.Backoff)
	for attempt := 1; ; attempt++ {
		f.attempts = attempt
		f.logger.Info("fetching snapshot", "attempt", attempt, "max_attempts", f.opts.Retries)
		res, err := f.attempt(ctx, attempt)
		if err == nil {
			res.Attempts = attempt
			res.Duration = time.Since(start)
			f.logger.Info("fetched snapshot", "attempt", attempt, "dir", res.Dir, "bytes", res.Bytes,
				"entries", res.Entries, "verified", res.Verified, "duration", res.Duration)
			return res, nil
		}
		if ctx.Err() != nil {
			cause := ended(ctx)
			f.logger.Info("snapshot fetch abandoned", "attempt", attempt, "reason", cause, "error", err)
			return nil, fmt.Errorf("failed to fetch snapshot of alloc %s from %s (attempt %d): %w",
				f.opts.AllocID, f.source, attempt, cause)
		}
		var ae *attemptError
		transient := errors.As(err, &ae) && ae.transient
		if !transient || attempt >= f.opts.Retries {
			f.logger.Error("failed to fetch snapshot", "attempt", attempt, "transient", transient, "error", err)
			if ae != nil {
				err = ae.err
			}
			return nil, fmt.Errorf("failed to fetch snapshot of alloc %s from %s (attempt %d of %d): %w",
				f.opts.AllocID, f.source, attempt, f.opts.Retries, err)
		}
		wait := backoff
		if ae.retryAfter > wait {
			wait = min(ae.retryAfter, maxBackoff)
		}
		f.logger.Warn("snapshot fetch attempt failed; retrying", "attempt", attempt, "max_attempts", f.opts.Retries,
			"retry_in", wait, "error", err)
		if f.opts.Progress != nil {
			f.opts.Progress(Progress{AllocID: f.opts.AllocID, Attempt: attempt, Total: -1, Done: true, Err: err, RetryIn: wait})
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("failed to fetch snapshot of alloc %s from %s (after attempt %d): %w",
				f.opts.AllocID, f.source, attempt, ended(ctx))
		case <-t.C:
		}
		backoff = min(backoff*2, maxBackoff)
	}
}

// ended is why ctx is done: the caller's cancellation, or the deadline,
// which then also wraps context.DeadlineExceeded.
func ended(ctx context.Context) error {
	cause, err := context.Cause(ctx), ctx.Err()
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w (%w)", cause, err)
}

// attempt makes one request and, on success, returns the extracted
// snapshot. Whatever it fails with, nothing it created is left.
func (f *fetcher) attempt(ctx context.Context, attempt int) (*Fetched, error) {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	wd := newWatchdog(f.opts.StallTimeout, cancel)
	defer wd.stop()

	req, err := http.NewRequestWithContext(actx, http.MethodGet, f.url, nil)
	if err != nil {
		return nil, fmt.Errorf("failed to build request: %w", err)
	}
	if f.opts.Token != "" {
		req.Header.Set(TokenHeader, f.opts.Token)
	}
	req.Header.Set("Accept", "application/x-tar")
	resp, err := f.client.Do(req)
	if err != nil {
		err = fmt.Errorf("failed to request snapshot: %w", err)
		if badCertificate(err) {
			// Another attempt would meet the same certificate.
			return nil, err
		}
		return nil, transientErr(f.aborted(actx, err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		se := &StatusError{StatusCode: resp.StatusCode, Message: strings.TrimSpace(strings.ToValidUTF8(string(msg), "\uFFFD"))}
		if se.Message == "" {
			se.Message = http.StatusText(resp.StatusCode)
		}
		return nil, &attemptError{err: se, transient: se.transient(), retryAfter: retryAfter(resp.Header)}
	}

	pg := newPaceGuard(f.opts.MinProgressBytes, f.opts.MinProgressWindow, cancel)
	defer pg.stop()
	m := &meter{
		r:        resp.Body,
		hash:     crc32.New(castagnoli),
		wd:       wd,
		pace:     pg,
		progress: f.opts.Progress,
		base:     Progress{AllocID: f.opts.AllocID, Attempt: attempt, Total: resp.ContentLength},
		start:    time.Now(),
	}
	m.last = m.start
	defer func() { f.received += m.n }()
	br := bufio.NewReaderSize(m, recvBufSize)
	dest := filepath.Join(f.opts.StagingDir, "snapshot-"+randomSuffix())
	stats, err := snapshot.Extract(br, dest, f.opts.Limits)
	if err != nil {
		err = f.classify(actx, err, m, br)
		m.done(err)
		return nil, err
	}
	verified, err := f.verify(actx, br, m, resp)
	if err != nil {
		if rerr := allocdir.RemoveAll(dest); rerr != nil {
			f.logger.Error("failed to remove refused snapshot", "dir", dest, "error", rerr)
			err = errors.Join(err, fmt.Errorf("failed to remove %q: %w", dest, rerr))
		}
		m.done(err)
		return nil, err
	}
	m.done(nil)
	return &Fetched{Dir: dest, Bytes: m.n, Entries: stats.Entries, Verified: verified}, nil
}

// classify tells a transfer that broke (worth another attempt) from an
// archive or a node that refuses (not worth it).
func (f *fetcher) classify(actx context.Context, err error, m *meter, br *bufio.Reader) error {
	switch cause := context.Cause(actx); {
	case errors.Is(cause, errStalled), errors.Is(cause, ErrTooSlow):
		return transientErr(f.aborted(actx, err))
	case m.err != nil && errors.Is(err, m.err):
		// The extractor stopped on the connection's error.
		return transientErr(err)
	case errors.Is(err, allocdir.ErrArchive) && truncated(err, m, br):
		return transientErr(err)
	}
	return err
}

// truncated reports whether a refused archive was refused for ending
// early rather than for what it holds. A body that ends mid-block makes
// the tar reader fail with io.ErrUnexpectedEOF; one that ends at a block
// boundary is consumed to its end without the end-of-archive marker. An
// archive refused for an entry was not read to its end, or was, with its
// marker. (A stream cut right after a body that ends in 1 KiB of zeros
// looks like it has its marker: it is still refused, only not retried.)
func truncated(err error, m *meter, br *bufio.Reader) bool {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	return m.eof && br.Buffered() == 0 && !m.endsWithTrailer()
}

// aborted names the watchdog that cancelled an attempt, if one did.
func (f *fetcher) aborted(actx context.Context, err error) error {
	switch cause := context.Cause(actx); {
	case errors.Is(cause, errStalled):
		return fmt.Errorf("%w: nothing received for %s: %w", errStalled, f.opts.StallTimeout, err)
	case errors.Is(cause, ErrTooSlow):
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// verify reads what follows the archive, which makes the HTTP trailers
// available, and checks the CRC-32C trailer if the source sent one.
func (f *fetcher) verify(actx context.Context, br *bufio.Reader, m *meter, resp *http.Response) (bool, error) {
	_, declared := resp.Trailer[http.CanonicalHeaderKey(TrailerCRC32C)]
	n, err := io.Copy(io.Discard, io.LimitReader(br, maxTrailingBytes+1))
	if err != nil {
		return false, transientErr(f.aborted(actx, fmt.Errorf("failed to read the end of the snapshot: %w", err)))
	}
	if n > maxTrailingBytes {
		if declared {
			return false, fmt.Errorf("%w: more than %d bytes follow the end of the archive", ErrIntegrity, maxTrailingBytes)
		}
		// Not ours to check: the archive itself was complete.
		return false, nil
	}
	want := resp.Trailer.Get(TrailerCRC32C)
	if want == "" {
		if declared {
			f.logger.Warn("source declared an integrity trailer but did not send it; snapshot not verified")
		}
		return false, nil
	}
	got := m.hash.Sum(nil)
	wantSum, err := hex.DecodeString(want)
	if err != nil || len(wantSum) != crc32.Size {
		return false, transientErr(fmt.Errorf("%w: malformed %s trailer %q", ErrIntegrity, TrailerCRC32C, want))
	}
	if !bytes.Equal(got, wantSum) {
		return false, transientErr(fmt.Errorf("%w: received %d bytes with crc32c %x, source sent %s", ErrIntegrity, m.n, got, want))
	}
	return true, nil
}

// badCertificate reports a TLS certificate that was refused.
func badCertificate(err error) bool {
	var (
		verr *tls.CertificateVerificationError
		uerr x509.UnknownAuthorityError
		herr x509.HostnameError
		cerr x509.CertificateInvalidError
	)
	return errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &cerr)
}

// retryAfter parses a Retry-After header given in seconds; the HTTP-date
// form is ignored.
func retryAfter(h http.Header) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(h.Get("Retry-After")))
	if err != nil || s <= 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// randomSuffix names an attempt's directory: unique, so no attempt meets
// another's leftovers, and short, so the extractor's temporary name next
// to it stays within NAME_MAX whatever the allocation ID.
func randomSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b[:])
}
