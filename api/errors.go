package api

import (
	"errors"
	"net/http"

	"github.com/allocfs/allocfs/allocdir"
)

// The kinds of failure the API tells apart, one per status code. A Node
// marks its errors with Kind; the server maps them to a status in one
// place (StatusCode), and the client maps a status back (Error.Is), so
// that errors.Is works the same on both sides of the wire. Unknown and
// collected allocations are the contract's own sentinels,
// allocdir.ErrUnknownAlloc (404) and allocdir.ErrGone (410).
var (
	// ErrBadRequest: a request the server could not act on as written
	// (malformed JSON, unknown fields, an invalid name or policy).
	ErrBadRequest = errors.New("bad request")
	// ErrConflict: the allocation's state forbids it now (it exists
	// already, still runs, is pinned by a transfer, or was handed over).
	ErrConflict = errors.New("conflict")
	// ErrForbidden: another node refused this one's credentials.
	ErrForbidden = errors.New("forbidden")
	// ErrUpstream: another node's answer was broken (a bad archive, a
	// checksum that does not match).
	ErrUpstream = errors.New("bad answer from another node")
)

// Kind marks err as being of kind (one of the sentinels above): the
// message stays err's and errors.Is matches both.
func Kind(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: kind, err: err}
}

type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.err, e.kind} }

// StatusCode is the one place that maps an error to an HTTP status.
// ErrGone is tested before ErrUnknownAlloc: the store's "gone" error is
// both, and the more precise answer wins.
func StatusCode(err error) int {
	switch {
	case errors.Is(err, allocdir.ErrGone):
		return http.StatusGone
	case errors.Is(err, allocdir.ErrUnknownAlloc):
		return http.StatusNotFound
	case errors.Is(err, ErrConflict):
		return http.StatusConflict
	case errors.Is(err, ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, ErrUpstream):
		return http.StatusBadGateway
	case errors.Is(err, allocdir.ErrInvalidName), errors.Is(err, ErrBadRequest):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
