package netlimit

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestGate: the gate runs max requests at once, answers the next one 503
// with Retry-After without running it, and admits again once one ends.
func TestGate(t *testing.T) {
	g, err := NewGate(2)
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	ran := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		entered <- struct{}{}
		<-release
		io.WriteString(w, "ok")
	})
	var refused []string
	h := g.Handler(next, func(r *http.Request) { refused = append(refused, r.URL.Path) })

	done := make(chan *httptest.ResponseRecorder, 2)
	for range 2 {
		go func() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/held", nil))
			done <- w
		}()
		wait(t, entered, "admitted request")
	}
	if got := g.Running(); got != 2 {
		t.Fatalf("running: got %d, want 2", got)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/third", nil))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("third request: status %d, Retry-After %q; want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if len(refused) != 1 || refused[0] != "/third" {
		t.Errorf("full called with %v, want [/third]", refused)
	}
	if ran != 2 {
		t.Errorf("handler ran %d times, want 2: a refused request must not run", ran)
	}

	release <- struct{}{}
	if w := wait(t, done, "first request"); w.Code != http.StatusOK || w.Body.String() != "ok" {
		t.Errorf("admitted request: %d %q, want 200 ok", w.Code, w.Body)
	}
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/fourth", nil))
		done <- w
	}()
	wait(t, entered, "request after a slot freed")
	close(release)
	for range 2 {
		if w := wait(t, done, "held request"); w.Code != http.StatusOK {
			t.Errorf("admitted request: status %d, want 200", w.Code)
		}
	}
	if got := g.Running(); got != 0 {
		t.Errorf("running after every request ended: got %d, want 0", got)
	}
}

// TestGatePanicFreesSlot: a handler that panics gives its slot back
// (net/http recovers the panic and keeps serving).
func TestGatePanicFreesSlot(t *testing.T) {
	g, err := NewGate(1)
	if err != nil {
		t.Fatal(err)
	}
	h := g.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }), nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the handler's panic did not reach the caller")
			}
		}()
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
	}()
	if got := g.Running(); got != 0 {
		t.Errorf("running after a panic: got %d, want 0", got)
	}
}

// TestNewGateBadCap: a cap below 1 is refused.
func TestNewGateBadCap(t *testing.T) {
	for _, n := range []int{0, -3} {
		if g, err := NewGate(n); err == nil {
			t.Errorf("NewGate(%d): %v, nil error; want an error", n, g)
		}
	}
}
