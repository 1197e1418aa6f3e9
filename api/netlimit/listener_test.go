package netlimit

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func dial(t *testing.T, addr net.Addr) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type accepted struct {
	c   net.Conn
	err error
}

func acceptAsync(l net.Listener) chan accepted {
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ch <- accepted{c, err}
	}()
	return ch
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("%s: nothing within %v", what, patience)
	}
	var zero T
	return zero
}

// TestListenerCap: at the cap, Accept reports the listener full and waits,
// the waiting connection costs no descriptor of ours (it is still in the
// kernel's queue), and closing one accepted connection lets exactly one
// more in.
func TestListenerCap(t *testing.T) {
	inner := listen(t)
	full := make(chan struct{}, 10)
	l, err := NewListener(inner, 2, func() { full <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	clients := []net.Conn{dial(t, l.Addr()), dial(t, l.Addr()), dial(t, l.Addr())}
	var conns []net.Conn
	for range 2 {
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	if got := l.Open(); got != 2 {
		t.Fatalf("open connections: got %d, want 2", got)
	}
	third := acceptAsync(l)
	wait(t, full, "full callback")
	// full is called before Accept waits and nothing can free a slot
	// meanwhile: the third connection must not have been accepted.
	select {
	case a := <-third:
		t.Fatalf("a third connection was accepted at a cap of 2: %v, %v", a.c, a.err)
	default:
	}

	// The client of the connection accepted first writes; the one we
	// close next must be that one, so we know who got in.
	if _, err := clients[0].Write([]byte("0")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(conns[0], buf); err != nil || buf[0] != '0' {
		t.Fatalf("first accepted connection: read %q, %v; want the first client's byte", buf, err)
	}
	if err := conns[0].Close(); err != nil {
		t.Fatal(err)
	}
	a := wait(t, third, "third Accept")
	if a.err != nil {
		t.Fatalf("third Accept after a slot freed: %v", a.err)
	}
	defer a.c.Close()
	if _, err := clients[2].Write([]byte("2")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(a.c, buf); err != nil || buf[0] != '2' {
		t.Fatalf("third accepted connection: read %q, %v; want the third client's byte", buf, err)
	}
	if got := l.Open(); got != 2 {
		t.Errorf("open connections after one closed and one accepted: got %d, want 2", got)
	}
}

// TestListenerDoubleClose: a connection closed twice frees one slot, not
// two.
func TestListenerDoubleClose(t *testing.T) {
	l, err := NewListener(listen(t), 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	for range 2 {
		dial(t, l.Addr())
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	conns[0].Close()
	if err := conns[0].Close(); err == nil {
		t.Error("second Close of a connection: nil error, want the inner connection's")
	}
	if got := l.Open(); got != 1 {
		t.Errorf("open connections after closing one of two twice: got %d, want 1", got)
	}
	conns[1].Close()
	if got := l.Open(); got != 0 {
		t.Errorf("open connections after closing both: got %d, want 0", got)
	}
}

// TestListenerCloseEndsWait: closing the listener ends an Accept that
// waits for a slot, with net.ErrClosed, and leaves accepted connections
// open.
func TestListenerCloseEndsWait(t *testing.T) {
	full := make(chan struct{}, 1)
	l, err := NewListener(listen(t), 1, func() { full <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	client := dial(t, l.Addr())
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	second := acceptAsync(l)
	wait(t, full, "full callback")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	a := wait(t, second, "Accept after Close")
	if !errors.Is(a.err, net.ErrClosed) {
		t.Errorf("Accept waiting for a slot when the listener closed: %v, %v; want net.ErrClosed", a.c, a.err)
	}
	if _, err := client.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Errorf("accepted connection after the listener closed: %v; want it open", err)
	}
}

// failingListener fails every Accept with err.
type failingListener struct {
	net.Listener
	err error
}

func (f failingListener) Accept() (net.Conn, error) { return nil, f.err }

// TestListenerAcceptErrorFreesSlot: an Accept that fails (EMFILE, say)
// gives its slot back, so that failures cannot use up the cap.
func TestListenerAcceptErrorFreesSlot(t *testing.T) {
	emfile := &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	l, err := NewListener(failingListener{Listener: listen(t), err: emfile}, 1, func() {
		t.Error("the listener reported itself full after failed accepts")
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := l.Accept(); !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("Accept: %v, want EMFILE", err)
		}
	}
	if got := l.Open(); got != 0 {
		t.Errorf("open connections after failed accepts: got %d, want 0", got)
	}
}

// TestNewListenerBadCap: a cap below 1 is refused, and the listener it
// was given is left as it was.
func TestNewListenerBadCap(t *testing.T) {
	inner := listen(t)
	for _, n := range []int{0, -1} {
		if l, err := NewListener(inner, n, nil); err == nil {
			t.Errorf("NewListener with a cap of %d: %v, nil error; want an error", n, l)
		}
	}
	dial(t, inner.Addr())
	c, err := inner.Accept()
	if err != nil {
		t.Fatalf("the listener after refused caps: %v; want it still open", err)
	}
	c.Close()
}
