package allocdir

import (
	"context"
	"io"
)

// FS is the read side of an allocation directory: what the fs API, log
// followers and migration use. Every path is relative to the allocation
// directory ("/" and "" mean its root) and is resolved by [Resolve]: a
// path that escapes, directly or through a symbolic link, fails with
// [ErrEscapes] and nothing is read.
type FS interface {
	// List returns the entries of a directory sorted by name, with lstat
	// information (a symbolic link is reported as itself) and no content
	// type. Listing secrets/ and private/ is allowed.
	List(path string) ([]*FileInfo, error)

	// Stat follows symbolic links and fills ContentType by Nomad's rules.
	// Stat of secrets/ and private/ content is allowed.
	Stat(path string) (*FileInfo, error)

	// ReadAt opens a file positioned at offset. Content under any task's
	// secrets/ or private/, after resolution, fails with [ErrSecret] or
	// [ErrPrivate]. An offset past the end is not an error.
	ReadAt(path string, offset int64) (io.ReadCloser, error)

	// Snapshot writes Nomad's migration tar of alloc/data and every
	// registered task's local/ to w, as package allocdir/snapshot's
	// Write does.
	Snapshot(w io.Writer) error

	// BlockUntilExists checks path for escape synchronously, then returns
	// a channel that receives nil when the path exists, an error if
	// watching fails, or ctx's error on cancellation; it is closed after
	// that one value and nothing keeps running.
	BlockUntilExists(ctx context.Context, path string) (chan error, error)

	// ChangeEvents watches an existing file (its initial stat error is
	// returned) and reports growth beyond curOffset, truncation and
	// deletion or replacement until ctx is done.
	ChangeEvents(ctx context.Context, path string, curOffset int64) (*FileChanges, error)
}

// Interface is the whole allocation-directory contract: the read side plus
// the lifecycle a task runner drives. All methods are safe for concurrent
// use.
type Interface interface {
	FS

	// NewTaskDir registers a task and returns its paths. It does no I/O;
	// TaskDir.Build creates the directories. Registering a name again
	// replaces the previous registration.
	NewTaskDir(task Task) *TaskDir

	// GetTaskDir returns a registered task's directory, or nil.
	GetTaskDir(name string) *TaskDir

	// WalkTaskDirs calls fn for every registered task in name order and
	// stops at the first error, which it returns.
	WalkTaskDirs(fn func(*TaskDir) error) error

	// AllocDirPath is the absolute host path of <root>/<allocID>.
	AllocDirPath() string

	// ShareDirPath is the absolute host path of <root>/<allocID>/alloc.
	ShareDirPath() string

	// Build creates the allocation-level layout (alloc/{logs,tmp,data}).
	// It is idempotent.
	Build() error

	// Destroy removes everything the allocation holds, unmounting first
	// what it mounted. It keeps going after a failure and returns every
	// error joined. It is safe to call again and on a never-built
	// allocation.
	Destroy() error

	// Move takes over other's alloc/data and, for each named task,
	// other's <task>/local. It fails with [ErrNotBuilt] before Build.
	// Only data and local move: other keeps its logs and everything else.
	Move(other Interface, tasks []string) error
}
