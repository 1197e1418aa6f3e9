package migrate

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strings"
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

// NodeSecretToken is the secret of the node that holds the allocations
// (Nomad's Node.SecretID plays this role). Whoever knows it — the control
// plane — hands out one token per allocation, Derive(allocID), and a token
// for one allocation grants nothing for another. An empty NodeSecretToken
// refuses everything.
type NodeSecretToken string

var _ TokenChecker = NodeSecretToken("")

// Derive returns the token for allocID: the URL-safe base64 encoding,
// padded, of HMAC-SHA256 keyed with the node secret over allocID. It
// returns "" when the secret is empty.
func (n NodeSecretToken) Derive(allocID string) string {
	if n == "" {
		return ""
	}
	return base64.URLEncoding.EncodeToString(n.mac(allocID))
}

func (n NodeSecretToken) mac(allocID string) []byte {
	m := hmac.New(sha256.New, []byte(n))
	m.Write([]byte(allocID))
	return m.Sum(nil)
}

// Check implements TokenChecker. The token may be padded or not.
func (n NodeSecretToken) Check(allocID, token string) bool {
	if n == "" || token == "" {
		return false
	}
	got, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(token, "="))
	if err != nil {
		return false
	}
	return hmac.Equal(n.mac(allocID), got)
}

// requestToken returns the token a request presents, or "".
func requestToken(r *http.Request) string {
	if t := r.Header.Get(TokenHeader); t != "" {
		return t
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok)
	}
	return ""
}
