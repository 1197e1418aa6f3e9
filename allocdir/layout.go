package allocdir

import (
	"fmt"
	"os"
)

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

// PrivateBytes is the size cap of the task's private/ in bytes: fixed, as
// in Nomad.
func (t Task) PrivateBytes() int64 { return DefaultSecretsMB << 20 }

// SecretsOwner decides who owns a task's secrets/ and private/, and their
// mode: the task's user with 0700 when one is given, nobody with Nomad's
// 0777 otherwise. Without root nothing can be chowned, so the directories
// are private to the agent (nil owner, 0700). A task user that does not
// exist is an error: its secrets must not fall back to a wider owner.
func SecretsOwner(task Task) (*Owner, os.FileMode, error) {
	if os.Geteuid() != 0 {
		return nil, 0o700, nil
	}
	if task.User == "" {
		return Nobody(), 0o777, nil
	}
	o, err := LookupOwner(task.User)
	if err != nil {
		return nil, 0, fmt.Errorf("failed to look up user %q of task %q: %w", task.User, task.Name, err)
	}
	return o, 0o700, nil
}

// MigratedDirs lists, relative to the allocation directory, what migration
// carries and snapshots contain, in order: alloc/data, then each task's
// local/ in the order given. A task name that is not one path component,
// or is the shared alloc dir's, fails with ErrInvalidName.
func MigratedDirs(tasks []string) ([]string, error) {
	dirs := make([]string, 0, 1+len(tasks))
	dirs = append(dirs, SharedAllocName+"/"+SharedDataName)
	for _, task := range tasks {
		if err := ValidName(task); err != nil || task == SharedAllocName {
			return nil, fmt.Errorf("task %q: %w", task, ErrInvalidName)
		}
		dirs = append(dirs, task+"/"+TaskLocal)
	}
	return dirs, nil
}
