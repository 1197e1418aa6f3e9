package allocdir

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
