package allocdir

import "os"

// Names of the fixed directories of an allocation. They are part of the
// contract with task drivers and with Nomad's HTTP API, so they never change.
const (
	// SharedAllocName is <alloc>/alloc/, the directory every task shares.
	SharedAllocName = "alloc"
	// SharedDataName is <alloc>/alloc/data/, the migrated ephemeral disk.
	SharedDataName = "data"
	// LogDirName is <alloc>/alloc/logs/.
	LogDirName = "logs"
	// TmpDirName is <alloc>/alloc/tmp/ and <alloc>/<task>/tmp/.
	TmpDirName = "tmp"
	// TaskLocal is <alloc>/<task>/local/, the migrated task directory.
	TaskLocal = "local"
	// TaskSecrets is <alloc>/<task>/secrets/, memory only, never readable
	// through the FS read side.
	TaskSecrets = "secrets"
	// TaskPrivate is <alloc>/<task>/private/, memory only, agent-owned.
	TaskPrivate = "private"
)

// SharedAllocDirs are created under alloc/ by Build, in this order.
var SharedAllocDirs = []string{LogDirName, TmpDirName, SharedDataName}

// Modes of the layout. Directories are chmod-ed to these values after
// creation so the process umask never matters.
const (
	AllocDirMode  os.FileMode = 0o755
	SharedDirMode os.FileMode = 0o777
	TaskDirMode   os.FileMode = 0o777
	TaskTmpMode   os.FileMode = 0o777 | os.ModeSticky
)

// DefaultSecretsMB is the size cap of secrets/ when a task asks for none,
// and the fixed size of private/.
const DefaultSecretsMB = 1

// Task describes what an implementation needs to know about a task to lay
// out its directory.
type Task struct {
	// Name is the task's name, used as its directory name.
	Name string
	// SecretsMB caps the memory of secrets/; 0 means DefaultSecretsMB.
	SecretsMB int
	// User, when set and the agent runs as root, owns secrets/ and
	// private/ (mode 0700) instead of nobody.
	User string
}

// SecretsBytes is the size cap of the task's secrets/ in bytes.
func (t Task) SecretsBytes() int64 {
	mb := t.SecretsMB
	if mb <= 0 {
		mb = DefaultSecretsMB
	}
	return int64(mb) << 20
}
