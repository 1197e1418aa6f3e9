package api

import (
	"net/url"
	"time"
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

// The JSON of the control API names every field in snake_case and leaves
// out what is unset, so that no answer shows a zero time or an empty
// string that means "none". Nomad's own shapes (the client API, the
// allocation stubs of AllocationsPath) keep Nomad's names.

// Task is one task of an allocation, as the control API shows it.
type Task struct {
	// Name is the task's name and its directory's name.
	Name string `json:"name"`
	// SecretsMB caps the memory of the task's secrets/; 0 is the default.
	SecretsMB int `json:"secrets_mb,omitempty"`
	// User owns secrets/ and private/ when the daemon runs as root.
	User string `json:"user,omitempty"`
}

// Status values of Alloc.Status.
const (
	StatusRunning  = "running"
	StatusTerminal = "terminal"
)

// Alloc is the record of an allocation.
type Alloc struct {
	ID    string `json:"id"`
	Tasks []Task `json:"tasks"`
	// Status is StatusRunning or StatusTerminal.
	Status  string    `json:"status"`
	Created time.Time `json:"created"`
	// Stopped is when the allocation became terminal; absent while it
	// runs.
	Stopped *time.Time `json:"stopped,omitempty"`
	// Volumes maps a directory of the allocation ("alloc/data",
	// "<task>/local", ...) to its layers.
	Volumes map[string]Volume `json:"volumes"`
	// Previous is the allocation this one took its data from, and
	// MigratedTo the one that took this one's.
	Previous   string `json:"previous,omitempty"`
	MigratedTo string `json:"migrated_to,omitempty"`
	// Origin is OriginMount for an allocation made by a mkdir at the
	// mount root (Nomad's client, with its alloc_dir on the mount), which
	// the node never stops, destroys or collects itself; empty for one
	// made through this API.
	Origin string `json:"origin,omitempty"`
}

// OriginMount is Alloc.Origin of an allocation made through the mount.
const OriginMount = "mount"

// TaskNames returns the names of a's tasks in the order they were given.
func (a *Alloc) TaskNames() []string {
	names := make([]string, 0, len(a.Tasks))
	for _, t := range a.Tasks {
		names = append(names, t.Name)
	}
	return names
}

// Volume is the stack of layers of one directory: Upper is written,
// Lowers (top first) are read through.
type Volume struct {
	Upper  string   `json:"upper"`
	Lowers []string `json:"lowers,omitempty"`
	// ReadOnly: the whole volume refuses writes (a previous allocation's
	// view after its data migrated away).
	ReadOnly bool `json:"read_only,omitempty"`
}

// CreateAllocRequest is the body of POST /v1/allocs.
type CreateAllocRequest struct {
	ID    string `json:"id"`
	Tasks []Task `json:"tasks"`
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
	// DiskMB limits what the allocation's volumes hold (alloc/data,
	// alloc/logs, alloc/tmp, every task's local/ and tmp/), in MiB, as
	// Nomad's ephemeral_disk.size; 0 takes the node's default. A node
	// whose data dir cannot enforce a limit refuses one.
	DiskMB int64 `json:"disk_mb,omitempty"`
	// DiskInodes limits how many files and directories they hold, where
	// the filesystem counts them; 0: none.
	DiskInodes int64 `json:"disk_inodes,omitempty"`
}

// GCResponse is the answer of the GC endpoints: the allocations collected.
type GCResponse struct {
	Collected []string `json:"collected"`
}

// AllocStatus is the answer of GET /v1/allocs/{id}: the allocation's
// record plus where it is mounted and what its layers hold.
type AllocStatus struct {
	Alloc

	// Mount is the allocation's directory in the mount: <mount>/<id>.
	Mount string `json:"mount"`
	// Layers has one entry per volume of Volumes, with the same keys.
	Layers map[string]LayerUsage `json:"layers"`
	// Passthrough tells whether the kernel serves file data from the
	// backing files (fast) or every read and write goes through the
	// daemon.
	Passthrough bool `json:"passthrough"`
	// Disk is the allocation's disk limit and what it holds against it,
	// from the filesystem's quota accounting; absent without a limit.
	Disk *DiskStatus `json:"disk,omitempty"`
}

// DiskStatus is an allocation's disk limit and usage.
type DiskStatus struct {
	LimitBytes int64 `json:"limit_bytes"`
	// UsedBytes is what the upper layers of its volumes hold, or will
	// once the writes under way reach the disk.
	UsedBytes int64 `json:"used_bytes"`
	// Mechanism is what enforces the limit: "btrfs qgroups" or "project
	// quotas".
	Mechanism string `json:"mechanism"`
	// LimitInodes and UsedInodes count files and directories, where the
	// mechanism counts them (project quotas).
	LimitInodes int64 `json:"limit_inodes,omitempty"`
	UsedInodes  int64 `json:"used_inodes,omitempty"`
}

// QuotaStatus says whether the node enforces disk limits, and if not,
// what would make it.
type QuotaStatus struct {
	Enforced   bool   `json:"enforced"`
	Mechanism  string `json:"mechanism,omitempty"`
	Filesystem string `json:"filesystem"`
	// Why says, where limits are not enforced, what would enforce them.
	Why string `json:"why,omitempty"`
	// DefaultMB is the limit of an allocation that asks for none.
	DefaultMB int64 `json:"default_mb,omitempty"`
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
	// Quota says whether allocations' disk limits are enforced.
	Quota QuotaStatus `json:"quota"`
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
	// RetryInMS is set when the attempt failed and another follows in
	// that many milliseconds.
	RetryInMS int64 `json:"retry_in_ms,omitempty"`
}

// createLine is one line of a streamed create: a progress event, or the
// final outcome (the new record, or an error with the status code a
// plain request would have had).
type createLine struct {
	Progress *ProgressEvent `json:"progress,omitempty"`
	Alloc    *Alloc         `json:"alloc,omitempty"`
	Error    string         `json:"error,omitempty"`
	Status   int            `json:"status,omitempty"`
}

// AllocationsPath lists allocations in the shape of Nomad's
// /v1/allocations (AllocListStub), with its ?prefix= filter: what a
// client needs to turn an ID prefix into an ID, and to find an
// allocation's tasks, on the socket and on a node's TCP listener alike.
const AllocationsPath = "/v1/allocations"

// AllocStub is one entry of AllocationsPath: the fields of Nomad's
// AllocListStub that allocfs knows, under Nomad's names.
type AllocStub struct {
	ID   string
	Name string
	// ClientStatus is "running", or "complete" for a terminal allocation.
	ClientStatus string
	// TaskStates has one entry per task, keyed by its name.
	TaskStates map[string]TaskState
	// CreateTime and ModifyTime are Unix nanoseconds, as Nomad's are.
	CreateTime int64
	ModifyTime int64
}

// TaskState is a task's entry of AllocStub.TaskStates.
type TaskState struct {
	// State is "running", or "dead" once the allocation is terminal.
	State string
}
