package allocdir

import (
	"sort"
	"sync"
)

// TaskDir holds the host paths of one task's directory. The paths are what
// drivers bind-mount or chroot into; which implementation stands behind
// them is decided by whoever created the TaskDir.
type TaskDir struct {
	// Task is the task this directory belongs to.
	Task Task

	// AllocDir is the allocation root: <root>/<allocID>/
	AllocDir string

	// Dir is the task's working directory: <alloc>/<task>/
	Dir string

	// SharedAllocDir is the directory shared by every task:
	// <alloc>/alloc/
	SharedAllocDir string

	// SharedTaskDir is where the shared directory appears inside the task
	// directory for chroot-isolated tasks: <alloc>/<task>/alloc/
	SharedTaskDir string

	// LocalDir is the task's migrated directory (NOMAD_TASK_DIR):
	// <alloc>/<task>/local/
	LocalDir string

	// LogDir is where every task's logs are written: <alloc>/alloc/logs/
	LogDir string

	// SecretsDir is the task's memory-only secrets (NOMAD_SECRETS_DIR):
	// <alloc>/<task>/secrets/
	SecretsDir string

	// PrivateDir is agent-only material such as tokens:
	// <alloc>/<task>/private/
	PrivateDir string

	// TmpDir is the task's sticky scratch directory: <alloc>/<task>/tmp/
	TmpDir string

	build func(*TaskDir) error
}

// NewTaskDirPaths fills a TaskDir's paths for task under allocDir. build is
// the implementation's way of creating the directory; implementations call
// this from NewTaskDir.
func NewTaskDirPaths(allocDir string, task Task, build func(*TaskDir) error) *TaskDir {
	dir := joinHost(allocDir, task.Name)
	shared := joinHost(allocDir, SharedAllocName)
	return &TaskDir{
		Task:           task,
		AllocDir:       allocDir,
		Dir:            dir,
		SharedAllocDir: shared,
		SharedTaskDir:  joinHost(dir, SharedAllocName),
		LocalDir:       joinHost(dir, TaskLocal),
		LogDir:         joinHost(shared, LogDirName),
		SecretsDir:     joinHost(dir, TaskSecrets),
		PrivateDir:     joinHost(dir, TaskPrivate),
		TmpDir:         joinHost(dir, TmpDirName),
		build:          build,
	}
}

// Build creates the task's directory: the task dir and local/ (0777),
// tmp/ (1777), and the memory-only secrets/ and private/. It is idempotent:
// building an existing task dir re-applies modes and owners.
func (t *TaskDir) Build() error {
	if t.build == nil {
		return ErrNotBuilt
	}
	return t.build(t)
}

// TaskDirs is the task registry every implementation needs for
// GetTaskDir and WalkTaskDirs; embed it and call Register from NewTaskDir.
// Its zero value is ready and it is safe for concurrent use.
type TaskDirs struct {
	mu    sync.RWMutex
	tasks map[string]*TaskDir
}

// Register records td under its task's name, replacing any earlier one.
func (r *TaskDirs) Register(td *TaskDir) *TaskDir {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.tasks == nil {
		r.tasks = make(map[string]*TaskDir)
	}
	r.tasks[td.Task.Name] = td
	return td
}

// GetTaskDir returns a registered task's directory, or nil.
func (r *TaskDirs) GetTaskDir(name string) *TaskDir {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.tasks[name]
}

// WalkTaskDirs calls fn for every registered task in name order, without
// holding the registry's lock, and stops at the first error.
func (r *TaskDirs) WalkTaskDirs(fn func(*TaskDir) error) error {
	r.mu.RLock()
	tds := make([]*TaskDir, 0, len(r.tasks))
	for _, td := range r.tasks {
		tds = append(tds, td)
	}
	r.mu.RUnlock()
	sort.Slice(tds, func(i, j int) bool { return tds[i].Task.Name < tds[j].Task.Name })
	for _, td := range tds {
		if err := fn(td); err != nil {
			return err
		}
	}
	return nil
}
