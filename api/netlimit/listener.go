package netlimit

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Listener is a net.Listener whose accepted connections are capped; see
// NewListener. All methods are safe for concurrent use.
type Listener struct {
	net.Listener
	// slots holds one token per open connection, and one for the
	// connection Accept is waiting for: a send takes a slot, a receive
	// frees one, so its capacity is the cap.
	slots chan struct{}
	// open counts the connections accepted and not yet closed.
	open atomic.Int64
	// full is called each time Accept finds no free slot, before it waits.
	full func()

	closeOnce sync.Once
	closed    chan struct{}
}

// NewListener returns ln with at most max accepted connections open at
// once: at the cap, Accept calls full (which may be nil) and then waits
// until a connection it returned is closed, or the listener is. A
// connection counts until its Close is called, whoever calls it (the HTTP
// server, or a handler that hijacked it).
func NewListener(ln net.Listener, max int, full func()) (*Listener, error) {
	if max < 1 {
		return nil, fmt.Errorf("connection cap of %s must be at least 1, not %d", ln.Addr(), max)
	}
	return &Listener{Listener: ln, slots: make(chan struct{}, max), full: full, closed: make(chan struct{})}, nil
}

// Accept waits for a free slot, then for a connection.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		if l.full != nil {
			l.full()
		}
		select {
		case l.slots <- struct{}{}:
		case <-l.closed:
			return nil, &net.OpError{Op: "accept", Net: l.Addr().Network(), Addr: l.Addr(), Err: net.ErrClosed}
		}
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Add(1)
	return &conn{Conn: c, release: func() {
		l.open.Add(-1)
		<-l.slots
	}}, nil
}

// Close closes the listener and ends an Accept that waits for a slot.
// Connections already accepted stay open.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Open returns how many accepted connections are open.
func (l *Listener) Open() int { return int(l.open.Load()) }

// Cap returns the most connections that may be open at once.
func (l *Listener) Cap() int { return cap(l.slots) }

// conn frees its listener's slot once, on its first Close.
type conn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// ReadFrom keeps the connection's own ReadFrom (sendfile, splice) reachable:
// net/http looks for it on the connection to serve files without copies.
func (c *conn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }
