package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/readside"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/internal/inotify"
	"github.com/hashicorp/go-hclog"
)

// AllocDir implements allocdir.Interface for one allocation of a store.
// It works on the store directly and never through the mount (a daemon
// that reads its own mount can deadlock); its paths (AllocDirPath and the
// TaskDir fields) are those of the mount, which is what task drivers use.
// All methods are safe for concurrent use.
type AllocDir struct {
	logger   hclog.Logger
	store    *store.Store
	mount    *Mount
	mountDir string
	id       string

	allocdir.TaskDirs
}

var _ allocdir.Interface = (*AllocDir)(nil)

// NewAllocDir returns the allocation id of store as seen under mountDir.
// mount, when not nil, is the live mount of store: its memory-only
// secrets and private directories are then listed too.
func NewAllocDir(logger hclog.Logger, store *store.Store, mount *Mount, mountDir, id string) *AllocDir {
	// The store's notifier starts with its first AllocDir rather than with
	// its first follower, so that following never starts a goroutine that
	// outlives it.
	store.Notifier()
	return &AllocDir{
		logger:   logger.Named("alloc_dir").With("alloc_id", id),
		store:    store,
		mount:    mount,
		mountDir: mountDir,
		id:       id,
	}
}

// AllocDirPath implements allocdir.Interface.
func (a *AllocDir) AllocDirPath() string { return path.Join(a.mountDir, a.id) }

// ShareDirPath implements allocdir.Interface.
func (a *AllocDir) ShareDirPath() string {
	return path.Join(a.AllocDirPath(), allocdir.SharedAllocName)
}

// NewTaskDir implements allocdir.Interface.
func (a *AllocDir) NewTaskDir(task allocdir.Task) *allocdir.TaskDir {
	return a.Register(allocdir.NewTaskDirPaths(a.AllocDirPath(), task, a.buildTask))
}

// Build implements allocdir.Interface: the allocation and its alloc-level
// volumes exist in the store afterwards.
func (a *AllocDir) Build() error {
	if _, err := a.store.Build(a.id); err != nil {
		return fmt.Errorf("failed to build alloc dir %s: %w", a.id, err)
	}
	return nil
}

func (a *AllocDir) buildTask(td *allocdir.TaskDir) error {
	_, err := a.store.EnsureTask(a.id, td.Task)
	if errors.Is(err, allocdir.ErrUnknownAlloc) {
		return fmt.Errorf("failed to build task dir %q: %w: %w", td.Task.Name, allocdir.ErrNotBuilt, err)
	}
	if err != nil {
		return fmt.Errorf("failed to build task dir %q: %w", td.Task.Name, err)
	}
	return nil
}

// Destroy implements allocdir.Interface. Destroying an allocation that was
// never built, or is gone already, is not an error.
func (a *AllocDir) Destroy() error {
	err := a.store.Destroy(a.id)
	if err == nil || errors.Is(err, allocdir.ErrUnknownAlloc) {
		return nil
	}
	return fmt.Errorf("failed to destroy alloc dir %s: %w", a.id, err)
}

// Move implements allocdir.Interface. Between two allocations of the same
// store it is the adopt remap: this allocation's alloc/data and each named
// task's local/ take over the previous allocation's layers, which gets
// fresh empty ones in their place. No byte is copied and nothing is
// deleted but this allocation's own empty placeholders.
func (a *AllocDir) Move(other allocdir.Interface, tasks []string) error {
	st, err := a.store.Get(a.id)
	if err != nil {
		return fmt.Errorf("unable to move to %q: %w: %w", a.AllocDirPath(), allocdir.ErrNotBuilt, err)
	}
	prev, ok := other.(*AllocDir)
	if !ok || prev.store != a.store {
		return fmt.Errorf("unable to move from %q into %s: only allocations of the same store can be remapped", other.AllocDirPath(), a.id)
	}
	start := time.Now()
	keys, err := allocdir.MigratedDirs(tasks)
	if err != nil {
		return fmt.Errorf("unable to move into %s: %w", a.id, err)
	}
	for _, task := range tasks {
		if st.TaskIndex(task) < 0 {
			if _, err := a.store.EnsureTask(a.id, allocdir.Task{Name: task}); err != nil {
				return fmt.Errorf("unable to move task %q: %w", task, err)
			}
		}
	}
	moved, err := a.store.Migrate(prev.id, a.id, keys, store.MigrationAdopt)
	if err != nil {
		return fmt.Errorf("failed to remap %s into %s: %w", prev.id, a.id, err)
	}
	a.logger.Info("migrated by remap", "previous_alloc_id", prev.id, "mode", "adopt", "volumes", moved, "bytes_copied", 0, "duration", time.Since(start))
	return nil
}

// readSide is the shared read side over the store's view of the
// allocation.
func (a *AllocDir) readSide() allocdir.ReadSide {
	return allocdir.ReadSide{
		AllocID:    a.id,
		HostPrefix: a.AllocDirPath(),
		Open: func() (allocdir.ReadFS, func(), error) {
			st, err := a.store.Get(a.id)
			if err != nil {
				return nil, nil, err
			}
			f := readside.New(a.store, a.readMount(), st)
			return f, f.Close, nil
		},
		Notifier: notifier(a.store.Notifier()),
	}
}

// readMount is the mount the read side finds memory volumes and host
// layers in: nil, and no typed nil, without one.
func (a *AllocDir) readMount() readside.Mount {
	if a.mount == nil {
		return nil
	}
	return readSideMount{a.mount}
}

// readSideMount answers the read side's questions of the mount.
type readSideMount struct{ m *Mount }

func (r readSideMount) HostLayer(st *record.State, key string) *layer.HostLayer {
	if !r.m.hasHostLayer(st, key) || st.Volumes[key] == nil {
		return nil
	}
	return r.m.hostLayer(st.ID, key, st.Volumes[key].Upper)
}

func (r readSideMount) MemoryRoot(id, task, name string) (int, error) {
	return r.m.memoryRoot(id, task, name)
}

// inotifyNotifier is the store's notifier as the read side takes it.
type inotifyNotifier struct{ n *inotify.Notifier }

func (i inotifyNotifier) Subscribe(tag string) allocdir.Subscription { return i.n.Subscribe(tag) }

// notifier is n as an allocdir.Notifier: nil, and no typed nil, when the
// store has none, so that followers poll.
func notifier(n *inotify.Notifier) allocdir.Notifier {
	if n == nil {
		return nil
	}
	return inotifyNotifier{n}
}

// List implements allocdir.FS.
func (a *AllocDir) List(p string) ([]*allocdir.FileInfo, error) { return a.readSide().List(p) }

// Stat implements allocdir.FS.
func (a *AllocDir) Stat(p string) (*allocdir.FileInfo, error) { return a.readSide().Stat(p) }

// ReadAt implements allocdir.FS.
func (a *AllocDir) ReadAt(p string, offset int64) (io.ReadCloser, error) {
	return a.readSide().ReadAt(p, offset)
}

// BlockUntilExists implements allocdir.FS.
func (a *AllocDir) BlockUntilExists(ctx context.Context, p string) (chan error, error) {
	return a.readSide().BlockUntilExists(ctx, p)
}

// ChangeEvents implements allocdir.FS.
func (a *AllocDir) ChangeEvents(ctx context.Context, p string, curOffset int64) (*allocdir.FileChanges, error) {
	return a.readSide().ChangeEvents(ctx, p, curOffset)
}

// Snapshot implements allocdir.FS: alloc/data and every task's local/,
// read from the layers.
func (a *AllocDir) Snapshot(w io.Writer) error {
	st, err := a.store.Get(a.id)
	if err != nil {
		return fmt.Errorf("failed to snapshot %s: %w", a.id, err)
	}
	names := make([]string, 0, len(st.Tasks))
	for _, t := range st.Tasks {
		names = append(names, t.Name)
	}
	sort.Strings(names)
	roots, err := allocdir.MigratedDirs(names)
	if err != nil {
		return fmt.Errorf("failed to snapshot %s: %w", a.id, err)
	}
	f := readside.New(a.store, a.readMount(), st)
	defer f.Close()
	return snapshot.Write(w, a.id, f, roots)
}
