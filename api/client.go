package api

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

const (
	// DefaultSocket is where `allocfs serve` listens unless told
	// otherwise: <default data dir>/allocfs.sock.
	DefaultSocket = "/var/lib/allocfs/allocfs.sock"
	// SocketEnv names the environment variable the CLI reads the socket
	// path from when --socket is not given.
	SocketEnv = "ALLOCFS_SOCKET"
)

// socketBase is the base URL of requests over the socket: its host is
// never dialed, the transport always dials the socket.
const socketBase = "http://allocfs"

// maxAnswerBytes caps what the client reads of an answer; a listing of
// many thousand allocations stays well below it.
const maxAnswerBytes = 64 << 20

// Client talks to one daemon: over its unix socket (NewClient), where
// every endpoint answers, or over a node's TCP listener (NewRemoteClient),
// where only the client API does. It is safe for concurrent use.
type Client struct {
	// where names what the client reaches, for messages: the socket's
	// path or the node's address.
	where string
	base  string
	token string
	hc    *http.Client
}

// NewClient returns a client for the daemon listening on socket. No
// connection is made until the first call.
func NewClient(socket string) *Client {
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, &UnreachableError{Where: socket, Err: err}
		}
		return conn, nil
	}
	return &Client{
		where: socket,
		base:  socketBase,
		hc: &http.Client{Transport: &http.Transport{
			DialContext:        dial,
			DisableCompression: true,
			MaxIdleConns:       2,
		}},
	}
}

// Remote is how to reach a node over TCP, as Nomad's CLI is told with
// -address, -token, -ca-cert, -client-cert and -client-key.
type Remote struct {
	// Address is the node's base URL: http://host:port or
	// https://host:port.
	Address string
	// Token is sent as X-Nomad-Token.
	Token string
	// CACert is a PEM file of the roots that authenticate the node;
	// empty: the system's. ClientCert and ClientKey are PEM files of
	// this client's certificate, for a node that asks for one.
	CACert, ClientCert, ClientKey string
}

// NewRemoteClient returns a client of the node r describes. It reads the
// TLS files now, so that a wrong path fails before any request.
func NewRemoteClient(r Remote) (*Client, error) {
	u, err := url.Parse(r.Address)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("address %q is not a node's base URL: want http://HOST:PORT or https://HOST:PORT", r.Address)
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if r.CACert != "" {
		pem, err := os.ReadFile(r.CACert)
		if err != nil {
			return nil, fmt.Errorf("failed to read the CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no PEM certificate in the CA file %q", r.CACert)
		}
		tlsCfg.RootCAs = pool
	}
	if (r.ClientCert == "") != (r.ClientKey == "") {
		return nil, errors.New("a client certificate needs its key, and a key its certificate")
	}
	if r.ClientCert != "" {
		cert, err := tls.LoadX509KeyPair(r.ClientCert, r.ClientKey)
		if err != nil {
			return nil, fmt.Errorf("failed to load the client certificate: %w", err)
		}
		tlsCfg.Certificates = []tls.Certificate{cert}
	}
	where := u.Scheme + "://" + u.Host
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, &UnreachableError{Where: where, Remote: true, Err: err}
		}
		return conn, nil
	}
	return &Client{
		where: where,
		base:  where,
		token: r.Token,
		hc: &http.Client{Transport: &http.Transport{
			DialContext:         dial,
			TLSClientConfig:     tlsCfg,
			TLSHandshakeTimeout: 10 * time.Second,
			MaxIdleConns:        2,
		}},
	}, nil
}

// Where names what the client reaches: a socket's path or an address.
func (c *Client) Where() string { return c.where }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// UnreachableError is returned when nothing answers: the daemon is not
// running, or the socket path or address is wrong.
type UnreachableError struct {
	Where string
	// Remote: Where is a node's address, not a local socket.
	Remote bool
	Err    error
}

func (e *UnreachableError) Error() string {
	var op *net.OpError
	cause := e.Err
	if errors.As(e.Err, &op) && op.Err != nil {
		cause = op.Err
	}
	if e.Remote {
		return fmt.Sprintf("cannot reach allocfs at %s: is the address right, and does that node serve with --http-addr? (%v)", e.Where, cause)
	}
	return fmt.Sprintf("cannot reach allocfs at %s: is `allocfs serve` running? (%v)", e.Where, cause)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Error is an error answer of the server. errors.Is matches it against the
// sentinels the status code stands for: allocdir.ErrUnknownAlloc (404),
// allocdir.ErrGone (410, which is also ErrUnknownAlloc, as in the store),
// ErrConflict (409), ErrForbidden (403), ErrUpstream (502) and
// ErrBadRequest or allocdir.ErrInvalidName (400).
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
		return target == ErrConflict
	case http.StatusForbidden:
		return target == ErrForbidden
	case http.StatusBadGateway:
		return target == ErrUpstream
	case http.StatusBadRequest:
		return target == ErrBadRequest || target == allocdir.ErrInvalidName
	}
	return false
}

// CreateAlloc creates an allocation with tasks and returns its record.
func (c *Client) CreateAlloc(ctx context.Context, id string, tasks []Task) (*Alloc, error) {
	return c.Create(ctx, CreateAllocRequest{ID: id, Tasks: tasks})
}

// Create creates the allocation req describes, taking over a previous
// allocation's data when it names one.
func (c *Client) Create(ctx context.Context, req CreateAllocRequest) (*Alloc, error) {
	var st Alloc
	if err := c.call(ctx, http.MethodPost, AllocsPath, req, http.StatusCreated, &st); err != nil {
		return nil, err
	}
	return &st, nil
}

// CreateWithProgress is Create for a request that fetches from another
// node: fn is called with each progress report of the transfer.
func (c *Client) CreateWithProgress(ctx context.Context, req CreateAllocRequest, fn func(ProgressEvent)) (*Alloc, error) {
	resp, err := c.send(ctx, http.MethodPost, AllocsPath+"?progress=1", req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusCreated:
		// Done before any transfer began: a plain answer.
		var a Alloc
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswerBytes)).Decode(&a); err != nil {
			return nil, fmt.Errorf("failed to decode answer to the create request: %w", err)
		}
		return &a, nil
	default:
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		return nil, c.answerError(resp.StatusCode, data)
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
		case line.Alloc != nil:
			return line.Alloc, nil
		case line.Error != "":
			return nil, &Error{StatusCode: line.Status, Message: line.Error}
		}
	}
}

// StopAlloc makes allocation id terminal: kept and browsable until GC.
func (c *Client) StopAlloc(ctx context.Context, id string) (*Alloc, error) {
	var st Alloc
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
func (c *Client) ListAllocs(ctx context.Context) ([]*Alloc, error) {
	var out []*Alloc
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
		return nil, c.answerError(resp.StatusCode, data)
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
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return nil, fmt.Errorf("failed to build request %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("X-Nomad-Token", c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ue *UnreachableError
		if errors.As(err, &ue) {
			return nil, ue
		}
		return nil, fmt.Errorf("request to allocfs at %s failed: %w", c.where, err)
	}
	return resp, nil
}

// answerError is the *Error of an answer with an unexpected status.
func (c *Client) answerError(code int, body []byte) error {
	apiErr := &Error{StatusCode: code}
	var eb errorBody
	if json.Unmarshal(body, &eb) == nil {
		apiErr.Message = eb.Error
	} else {
		// Nomad's client endpoints answer errors as bare text.
		apiErr.Message = strings.TrimSpace(string(body))
	}
	if code == http.StatusForbidden && c.token == "" && c.base != socketBase {
		apiErr.Message = fmt.Sprintf("allocfs at %s refused the request (%d %s): it wants its API token (-token)", c.where, code, apiErr.Message)
	} else if code == http.StatusForbidden && c.base != socketBase {
		apiErr.Message = fmt.Sprintf("allocfs at %s refused the request (%d %s): is the token right?", c.where, code, apiErr.Message)
	}
	return apiErr
}
