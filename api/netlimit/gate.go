package netlimit

import (
	"fmt"
	"io"
	"net/http"
)

// Gate runs at most a fixed number of requests at once; see NewGate. All
// methods are safe for concurrent use.
type Gate struct {
	slots chan struct{}
}

// NewGate returns a gate that admits max requests at once.
func NewGate(max int) (*Gate, error) {
	if max < 1 {
		return nil, fmt.Errorf("request cap must be at least 1, not %d", max)
	}
	return &Gate{slots: make(chan struct{}, max)}, nil
}

// Handler runs next for the requests the gate admits, and answers the others
// 503 Service Unavailable with Retry-After at once, after calling full (which
// may be nil) with the refused request. It never waits for a slot: a
// client that waited would hold its connection meanwhile.
func (g *Gate) Handler(next http.Handler, full func(*http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case g.slots <- struct{}{}:
		default:
			if full != nil {
				full(r)
			}
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "too many requests in progress: retry later")
			return
		}
		defer func() { <-g.slots }()
		next.ServeHTTP(w, r)
	})
}

// Running returns how many requests the gate admitted are running.
func (g *Gate) Running() int { return len(g.slots) }

// Cap returns the most requests that may run at once.
func (g *Gate) Cap() int { return cap(g.slots) }
