package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// TestKindAndStatus: an error marked with a kind keeps its message and
// matches both its cause and the kind; the status follows the kind; the
// client's *Error matches the same kind back from the status.
func TestKindAndStatus(t *testing.T) {
	cause := errors.New("allocation \"a1\" is pinned")
	err := Kind(ErrConflict, fmt.Errorf("collect: %w", cause))
	if err.Error() != "collect: allocation \"a1\" is pinned" || !errors.Is(err, cause) || !errors.Is(err, ErrConflict) {
		t.Errorf("Kind: got %q, is cause %v, is conflict %v", err, errors.Is(err, cause), errors.Is(err, ErrConflict))
	}
	if Kind(ErrConflict, nil) != nil {
		t.Error("Kind of nil is not nil")
	}
	for _, c := range []struct {
		err  error
		want int
	}{
		{err, http.StatusConflict},
		{Kind(ErrForbidden, errors.New("x")), http.StatusForbidden},
		{Kind(ErrUpstream, errors.New("x")), http.StatusBadGateway},
		{Kind(ErrBadRequest, errors.New("x")), http.StatusBadRequest},
		{fmt.Errorf("x: %w", allocdir.ErrInvalidName), http.StatusBadRequest},
		{fmt.Errorf("x: %w", allocdir.ErrUnknownAlloc), http.StatusNotFound},
		{errors.Join(allocdir.ErrUnknownAlloc, allocdir.ErrGone), http.StatusGone},
		{errors.New("disk on fire"), http.StatusInternalServerError},
	} {
		code := StatusCode(c.err)
		if code != c.want {
			t.Errorf("StatusCode(%v): got %d, want %d", c.err, code, c.want)
		}
		if code == http.StatusInternalServerError {
			continue
		}
		back := &Error{StatusCode: code, Message: c.err.Error()}
		for _, kind := range []error{ErrConflict, ErrForbidden, ErrUpstream, ErrBadRequest, allocdir.ErrUnknownAlloc, allocdir.ErrGone, allocdir.ErrInvalidName} {
			if errors.Is(c.err, kind) && !errors.Is(back, kind) {
				t.Errorf("%v: is %v on the server, not on the client", c.err, kind)
			}
		}
	}
}

// TestNewRemoteClient: an address that is not a base URL, or TLS files
// that cannot be used, fail before any request, saying which.
func TestNewRemoteClient(t *testing.T) {
	for _, c := range []struct {
		r    Remote
		want string
	}{
		{Remote{Address: "node:4646"}, "not a node's base URL"},
		{Remote{Address: "ftp://node:4646"}, "not a node's base URL"},
		{Remote{Address: "https://node:4646/v1"}, "not a node's base URL"},
		{Remote{Address: "https://node:4646", CACert: "/nonexistent/ca.pem"}, "failed to read the CA certificate"},
		{Remote{Address: "https://node:4646", ClientCert: "/c.pem"}, "needs its key"},
	} {
		if _, err := NewRemoteClient(c.r); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewRemoteClient(%+v): got %v, want an error saying %q", c.r, err, c.want)
		}
	}
	c, err := NewRemoteClient(Remote{Address: "https://node:4646/", Token: "t"})
	if err != nil || c.Where() != "https://node:4646" {
		t.Errorf("NewRemoteClient of a good address: got %v, %v", c, err)
	}
}
