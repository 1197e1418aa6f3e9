package migrate

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"

	"golang.org/x/crypto/blake2b"
)

// TokenHeader is the request header that carries the migrate token, as
// Nomad's clients send it. An "Authorization: Bearer <token>" header is
// accepted too.
const TokenHeader = "X-Nomad-Token"

// TokenChecker decides whether token grants a snapshot of allocID. A
// checker must compare in constant time and refuse an empty token.
type TokenChecker interface {
	Check(allocID, token string) bool
}

// TokenCheckerFunc adapts a function to TokenChecker.
type TokenCheckerFunc func(allocID, token string) bool

// Check implements TokenChecker.
func (f TokenCheckerFunc) Check(allocID, token string) bool { return f(allocID, token) }

// SharedToken is one secret shared by every node of a cluster: any
// request that presents it may snapshot any allocation of this node. An
// empty SharedToken refuses everything.
type SharedToken string

var _ TokenChecker = SharedToken("")

// Check implements TokenChecker. Both sides are hashed before the
// comparison so that the time taken reveals neither the secret's content
// nor its length.
func (s SharedToken) Check(_, token string) bool {
	if s == "" || token == "" {
		return false
	}
	want := sha256.Sum256([]byte(s))
	got := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(want[:], got[:]) == 1
}

// NodeSecretToken is the secret of the node that holds the allocations:
// Nomad's Node.SecretID plays this role. Whoever knows it (the control
// plane) hands out one token per allocation, Derive(allocID), and a token
// for one allocation grants nothing for another. The derivation is
// Nomad's own, so tokens its servers issue (Node.GetClientAllocs'
// MigrateTokens) are accepted: the URL-safe, padded base64 of BLAKE2b-512
// keyed with the secret, over the allocation ID. An empty NodeSecretToken
// refuses everything.
type NodeSecretToken string

var _ TokenChecker = NodeSecretToken("")

// Validate reports whether the secret can key BLAKE2b-512: non-empty and
// at most 64 bytes (a Nomad SecretID, a UUID, is 36).
func (n NodeSecretToken) Validate() error {
	if n == "" {
		return fmt.Errorf("the node secret is empty")
	}
	if len(n) > blake2b.Size {
		return fmt.Errorf("the node secret is %d bytes long; BLAKE2b takes a key of at most %d", len(n), blake2b.Size)
	}
	return nil
}

// Derive returns the token for allocID, or "" when the secret is not
// valid.
func (n NodeSecretToken) Derive(allocID string) string {
	sum := n.mac(allocID)
	if sum == nil {
		return ""
	}
	return base64.URLEncoding.EncodeToString(sum)
}

func (n NodeSecretToken) mac(allocID string) []byte {
	if n.Validate() != nil {
		return nil
	}
	h, err := blake2b.New512([]byte(n))
	if err != nil {
		return nil
	}
	h.Write([]byte(allocID))
	return h.Sum(nil)
}

// Check implements TokenChecker. The token may be padded or not.
func (n NodeSecretToken) Check(allocID, token string) bool {
	want := n.mac(allocID)
	if want == nil || token == "" {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(token, "="))
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(want, got) == 1
}

// AnyToken admits a request that one of its checkers admits: a node can
// take both its cluster's shared token and the per-allocation tokens
// derived from its secret.
type AnyToken []TokenChecker

var _ TokenChecker = AnyToken(nil)

// Check implements TokenChecker. Every checker runs, so the time taken
// does not say which one admitted the token.
func (a AnyToken) Check(allocID, token string) bool {
	ok := false
	for _, c := range a {
		if c.Check(allocID, token) {
			ok = true
		}
	}
	return ok
}

// RequestToken returns the token a request presents, as X-Nomad-Token or
// as an "Authorization: Bearer" header, or "".
func RequestToken(r *http.Request) string {
	if t := r.Header.Get(TokenHeader); t != "" {
		return t
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok)
	}
	return ""
}
