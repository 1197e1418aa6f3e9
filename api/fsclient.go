package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api/fsapi"
)

// fsPath is the path of one client fs endpoint for an allocation.
func fsPath(endpoint, id string, q url.Values) string {
	return fsapi.Prefix + endpoint + "/" + url.PathEscape(id) + "?" + q.Encode()
}

// List lists the directory p of allocation id.
func (c *Client) List(ctx context.Context, id, p string) ([]*allocdir.FileInfo, error) {
	var out []*allocdir.FileInfo
	err := c.call(ctx, http.MethodGet, fsPath("ls", id, url.Values{"path": {p}}), nil, http.StatusOK, &out)
	return out, err
}

// Stat describes the file p of allocation id.
func (c *Client) Stat(ctx context.Context, id, p string) (*allocdir.FileInfo, error) {
	var out allocdir.FileInfo
	if err := c.call(ctx, http.MethodGet, fsPath("stat", id, url.Values{"path": {p}}), nil, http.StatusOK, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Cat returns the content of the file p of allocation id; the caller
// closes it.
func (c *Client) Cat(ctx context.Context, id, p string) (io.ReadCloser, error) {
	return c.stream(ctx, fsPath("cat", id, url.Values{"path": {p}}))
}

// LogsQuery is the request of a task's logs, with Nomad's parameters.
type LogsQuery struct {
	Task string
	// Type is "stdout" or "stderr".
	Type string
	// Origin is "start" or "end"; Offset counts bytes from it, across
	// rotated files.
	Origin string
	Offset int64
	Follow bool
}

// Logs streams a task's logs as frames; the caller closes the stream.
func (c *Client) Logs(ctx context.Context, id string, q LogsQuery) (*FrameReader, error) {
	v := url.Values{
		"task":   {q.Task},
		"type":   {q.Type},
		"offset": {strconv.FormatInt(q.Offset, 10)},
		"follow": {strconv.FormatBool(q.Follow)},
	}
	return c.frames(ctx, "logs", id, v, q.Origin)
}

// stream sends a GET and returns the body of a 200 answer.
func (c *Client) stream(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, http.MethodGet, path, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
		return nil, c.answerError(resp.StatusCode, data)
	}
	return resp.Body, nil
}

// FrameReader decodes a framed stream.
type FrameReader struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// NewFrameReader decodes the framed stream body, which it closes on
// Close.
func NewFrameReader(body io.ReadCloser) *FrameReader {
	return &FrameReader{body: body, dec: json.NewDecoder(body)}
}

// Next returns the next frame; io.EOF at the clean end of the stream.
func (r *FrameReader) Next() (*fsapi.Frame, error) {
	var f fsapi.Frame
	if err := r.dec.Decode(&f); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("the log stream broke off: %w", err)
	}
	return &f, nil
}

// Close ends the stream.
func (r *FrameReader) Close() error { return r.body.Close() }

// StreamQuery is the request of a file's content as frames, with Nomad's
// parameters.
type StreamQuery struct {
	Path string
	// Origin is "start" or "end"; Offset counts bytes from it.
	Origin string
	Offset int64
	Follow bool
}

// Stream streams the file q.Path of allocation id as frames, following
// it as it grows when q.Follow; the caller closes the stream.
func (c *Client) Stream(ctx context.Context, id string, q StreamQuery) (*FrameReader, error) {
	v := url.Values{
		"path":   {q.Path},
		"offset": {strconv.FormatInt(q.Offset, 10)},
		"follow": {strconv.FormatBool(q.Follow)},
	}
	return c.frames(ctx, "stream", id, v, q.Origin)
}

// frames sends a framed request to endpoint with v (and origin, when
// set) and returns its frames.
func (c *Client) frames(ctx context.Context, endpoint, id string, v url.Values, origin string) (*FrameReader, error) {
	if origin != "" {
		v.Set("origin", origin)
	}
	body, err := c.stream(ctx, fsPath(endpoint, id, v))
	if err != nil {
		return nil, err
	}
	return NewFrameReader(body), nil
}

// AllocStubs returns the allocations whose ID starts with prefix, sorted
// by ID, as Nomad's /v1/allocations?prefix= does.
func (c *Client) AllocStubs(ctx context.Context, prefix string) ([]AllocStub, error) {
	var out []AllocStub
	err := c.call(ctx, http.MethodGet, AllocationsPath+"?"+url.Values{"prefix": {prefix}}.Encode(), nil, http.StatusOK, &out)
	return out, err
}
