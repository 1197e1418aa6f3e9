package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
)

const (
	// DefaultSocket is where `allocfs serve` listens unless told
	// otherwise: <default data dir>/allocfs.sock.
	DefaultSocket = "/var/lib/allocfs/allocfs.sock"
	// SocketEnv names the environment variable the CLI reads the socket
	// path from when --socket is not given.
	SocketEnv = "ALLOCFS_SOCKET"
)

// maxAnswerBytes caps what the client reads of an answer; a listing of
// many thousand allocations stays well below it.
const maxAnswerBytes = 64 << 20

// Client talks to the control API of one daemon over its unix socket. It
// is safe for concurrent use.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the daemon listening on socket. No
// connection is made until the first call.
func NewClient(socket string) *Client {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, &UnreachableError{Socket: socket, Err: err}
		}
		return conn, nil
	}
	return &Client{
		socket: socket,
		hc: &http.Client{Transport: &http.Transport{
			DialContext:        dial,
			DisableCompression: true,
			MaxIdleConns:       2,
		}},
	}
}

// Socket returns the socket path the client dials.
func (c *Client) Socket() string { return c.socket }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// UnreachableError is returned when nothing answers on the socket: the
// daemon is not running, or the socket path is wrong.
type UnreachableError struct {
	Socket string
	Err    error
}

func (e *UnreachableError) Error() string {
	var op *net.OpError
	cause := e.Err
	if errors.As(e.Err, &op) && op.Err != nil {
		cause = op.Err
	}
	return fmt.Sprintf("cannot reach allocfs at %s: is `allocfs serve` running? (%v)", e.Socket, cause)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Error is an error answer of the server. errors.Is matches it against the
// sentinels the status code stands for: allocdir.ErrUnknownAlloc (404),
// allocdir.ErrGone (410, which is also ErrUnknownAlloc, as in the store),
// store.ErrExists (409) and ErrBadRequest (400).
type Error struct {
	StatusCode int
	Message    string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("allocfs answered %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	}
	return e.Message
}

func (e *Error) Is(target error) bool {
	switch e.StatusCode {
	case http.StatusNotFound:
		return target == allocdir.ErrUnknownAlloc
	case http.StatusGone:
		return target == allocdir.ErrGone || target == allocdir.ErrUnknownAlloc
	case http.StatusConflict:
		return target == store.ErrExists
	case http.StatusBadRequest:
		return target == ErrBadRequest
	}
	return false
}

// CreateAlloc creates an allocation with tasks and returns its record.
func (c *Client) CreateAlloc(ctx context.Context, id string, tasks []allocdir.Task) (*store.State, error) {
	return c.Create(ctx, CreateAllocRequest{ID: id, Tasks: tasks})
}

// Create creates the allocation req describes, taking over a previous
// allocation's data when it names one.
func (c *Client) Create(ctx context.Context, req CreateAllocRequest) (*store.State, error) {
	var st store.State
	if err := c.call(ctx, http.MethodPost, AllocsPath, req, http.StatusCreated, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// CreateWithProgress is Create for a request that fetches from another
// node: fn is called with each progress report of the transfer.
func (c *Client) CreateWithProgress(ctx context.Context, req CreateAllocRequest, fn func(ProgressEvent)) (*store.State, error) {
	resp, err := c.send(ctx, http.MethodPost, AllocsPath+"?progress=1", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		return nil, answerError(resp.StatusCode, data)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var line createLine
		if err := dec.Decode(&line); err != nil {
			return nil, fmt.Errorf("the create request ended without an outcome: %w", err)
		}
		switch {
		case line.Progress != nil:
			if fn != nil {
				fn(*line.Progress)
			}
		case line.State != nil:
			return line.State, nil
		case line.Error != "":
			return nil, &Error{StatusCode: line.Status, Message: line.Error}
		}
	}
}

// StopAlloc makes allocation id terminal: kept and browsable until GC.
func (c *Client) StopAlloc(ctx context.Context, id string) (*store.State, error) {
	var st store.State
	if err := c.call(ctx, http.MethodPost, allocPath(id)+"/stop", nil, http.StatusOK, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// GC collects allocation id, which must be terminal, or every terminal
// allocation when id is empty, and returns what it collected.
func (c *Client) GC(ctx context.Context, id string) ([]string, error) {
	path := GCPath
	if id != "" {
		path = allocPath(id) + "/gc"
	}
	var out GCResponse
	if err := c.call(ctx, http.MethodPost, path, nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return out.Collected, nil
}

// ListAllocs returns every allocation, sorted by ID.
func (c *Client) ListAllocs(ctx context.Context) ([]*store.State, error) {
	var out []*store.State
	if err := c.call(ctx, http.MethodGet, AllocsPath, nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// AllocStatus returns the status of allocation id.
func (c *Client) AllocStatus(ctx context.Context, id string) (*AllocStatus, error) {
	var out AllocStatus
	if err := c.call(ctx, http.MethodGet, allocPath(id), nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AllocStatusJSON returns the status of allocation id as the server sent
// it, including fields this client does not know.
func (c *Client) AllocStatusJSON(ctx context.Context, id string) ([]byte, error) {
	return c.do(ctx, http.MethodGet, allocPath(id), nil, http.StatusOK)
}

// DestroyAlloc destroys allocation id and the layers only it used.
func (c *Client) DestroyAlloc(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, allocPath(id), nil, http.StatusNoContent)
	return err
}

// NodeStatus returns the daemon's view of its node.
func (c *Client) NodeStatus(ctx context.Context) (*NodeStatus, error) {
	var out NodeStatus
	if err := c.call(ctx, http.MethodGet, StatusPath, nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// call is do followed by decoding the answer into out.
func (c *Client) call(ctx context.Context, method, path string, in any, want int, out any) error {
	data, err := c.do(ctx, method, path, in, want)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("failed to decode answer to %s %s: %w", method, path, err)
	}
	return nil
}

// do sends one request with in (if not nil) as its JSON body and returns
// the answer's body if its status is want, or an *Error.
func (c *Client) do(ctx context.Context, method, path string, in any, want int) ([]byte, error) {
	resp, err := c.send(ctx, method, path, in)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return nil, fmt.Errorf("failed to read answer to %s %s: %w", method, path, err)
	}
	if resp.StatusCode != want {
		return nil, answerError(resp.StatusCode, data)
	}
	return data, nil
}

// send sends one request with in (if not nil) as its JSON body; the
// caller closes the answer's body.
func (c *Client) send(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("failed to encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	// The host is never dialed: the transport always dials the socket.
	req, err := http.NewRequestWithContext(ctx, method, "http://allocfs"+path, body)
	if err != nil {
		return nil, fmt.Errorf("failed to build request %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *UnreachableError
		if errors.As(err, &ue) {
			return nil, ue
		}
		return nil, fmt.Errorf("request to allocfs at %s failed: %w", c.socket, err)
	}
	return resp, nil
}

// answerError is the *Error of an answer with an unexpected status.
func answerError(code int, body []byte) error {
	apiErr := &Error{StatusCode: code}
	var eb errorBody
	if json.Unmarshal(body, &eb) == nil {
		apiErr.Message = eb.Error
	} else {
		// Nomad's client endpoints answer errors as bare text.
		apiErr.Message = strings.TrimSpace(string(body))
	}
	return apiErr
}
