package api

import (
	"net/url"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
)

// Paths of the control API. Allocation IDs are appended to AllocsPath as
// one escaped path segment.
const (
	AllocsPath = "/v1/allocs"
	StatusPath = "/v1/status"
	GCPath     = "/v1/gc"
)

// allocPath is the path of one allocation: its ID as one escaped segment.
func allocPath(id string) string { return AllocsPath + "/" + url.PathEscape(id) }

// CreateAllocRequest is the body of POST /v1/allocs.
type CreateAllocRequest struct {
	ID    string          `json:"id"`
	Tasks []allocdir.Task `json:"tasks"`
	// Previous is the allocation this one replaces; Migrate says what
	// happens to its data ("none", "sticky" or "migrate"; migrate implies
	// sticky) and Mode how a local handover is done ("adopt" or
	// "snapshot").
	Previous string `json:"previous,omitempty"`
	Migrate  string `json:"migrate,omitempty"`
	Mode     string `json:"mode,omitempty"`
	// From is the base URL of the node that holds Previous, when it is
	// not this one; the snapshot is fetched from it with Token.
	From  string `json:"from,omitempty"`
	Token string `json:"token,omitempty"`
}

// GCResponse is the answer of the GC endpoints: the allocations collected.
type GCResponse struct {
	Collected []string `json:"collected"`
}

// AllocStatus is the answer of GET /v1/allocs/{id}: the allocation's
// record plus where it is mounted and what its layers hold.
type AllocStatus struct {
	store.State

	// Mount is the allocation's directory in the mount: <mount>/<id>.
	Mount string `json:"mount"`
	// Layers has one entry per volume of State.Volumes, with the same
	// keys ("alloc/data", "<task>/local", ...).
	Layers map[string]LayerUsage `json:"layers"`
	// Passthrough tells whether the kernel serves file data from the
	// backing files (fast) or every read and write goes through the
	// daemon.
	Passthrough bool `json:"passthrough"`
}

// LayerUsage is what the writable layer of a volume holds on the backing
// store, measured by walking it there (never through the mount).
type LayerUsage struct {
	Upper  string   `json:"upper"`
	Lowers []string `json:"lowers,omitempty"`
	// Bytes is the sum of the apparent sizes of the regular files of the
	// upper layer.
	Bytes int64 `json:"bytes"`
	// Files counts the entries of the upper layer that are not
	// directories: regular files, symlinks, FIFOs and sockets.
	Files int64 `json:"files"`
}

// NodeStatus is the answer of GET /v1/status.
type NodeStatus struct {
	DataDir     string `json:"data_dir"`
	Mount       string `json:"mount"`
	Passthrough bool   `json:"passthrough"`
	Allocs      int    `json:"allocs"`
	// Goroutines is how many goroutines the daemon runs: steady while
	// idle, so a number that only grows points at a leak (followers that
	// outlive their clients, say).
	Goroutines int `json:"goroutines"`
	// Backing describes the filesystem that holds the data dir.
	Backing BackingStatus `json:"backing"`
}

// BackingStatus holds the statfs(2) numbers of the backing filesystem,
// converted to bytes where they count blocks.
type BackingStatus struct {
	BytesTotal     uint64 `json:"bytes_total"`
	BytesFree      uint64 `json:"bytes_free"`
	BytesAvailable uint64 `json:"bytes_available"`
	FilesTotal     uint64 `json:"files_total"`
	FilesFree      uint64 `json:"files_free"`
	BlockSize      int64  `json:"block_size"`
	NameMax        int64  `json:"name_max"`
}

// errorBody is the body of every error answer.
type errorBody struct {
	Error string `json:"error"`
}

// ProgressEvent reports how far a remote fetch got; POST /v1/allocs with
// ?progress=1 streams them, one JSON object per line, before the result.
type ProgressEvent struct {
	Attempt   int     `json:"attempt"`
	Bytes     int64   `json:"bytes"`
	Total     int64   `json:"total"`
	Rate      float64 `json:"rate"`
	ElapsedMS int64   `json:"elapsed_ms"`
	Done      bool    `json:"done,omitempty"`
	Err       string  `json:"error,omitempty"`
}

// createLine is one line of a streamed create: a progress event, or the
// final outcome (the new record, or an error with the status code a
// plain request would have had).
type createLine struct {
	Progress *ProgressEvent `json:"progress,omitempty"`
	State    *store.State   `json:"state,omitempty"`
	Error    string         `json:"error,omitempty"`
	Status   int            `json:"status,omitempty"`
}
