package restart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/allocfs/allocfs/fs/transport"
)

// stateDir is where a mount keeps what a daemon taking its
// connection over needs, inside the data dir:
//
//	<data-dir>/fuse/session.json   the INIT the kernel and the first
//	                               daemon agreed, and the generation
//	<data-dir>/fuse/slots.json     the slot table (fs/identity.go)
//	<data-dir>/fuse/unlinked/      files unlinked while open
//	                               (unlinked.go)
//	<data-dir>/fuse/memory.json    the memory volumes (fs/memvol.go)
//	<data-dir>/fuse/holder.sock    the holder's socket (holder.go)
//	<data-dir>/fuse/backing        passthrough backing IDs (backingids.go)
//	<data-dir>/fuse/outcomes       outcomes of namespace requests
//	                               (outcomes.go)
const stateDir = "fuse"

// SessionFile is <data-dir>/fuse/session.json:
//
//	{"session": {"Version": 1, "Dir": "/mnt", "Kernel": {...}, ...},
//	 "generation": 2}
type SessionFile struct {
	Session transport.Session `json:"session"`
	// Generation counts the daemons that served the connection before
	// the current one: 0 for the one that mounted.
	Generation uint32 `json:"generation"`
}

// StateFile is the path of name in the data dir's fuse/ directory, where
// a mount, its holder and its hand-over keep what outlives a daemon.
func StateFile(dataDir, name string) string { return filepath.Join(dataDir, stateDir, name) }

func sessionPath(dataDir string) string { return StateFile(dataDir, "session.json") }

// WriteReplace replaces path with b, atomically by rename. It does not
// sync: what it writes matters on this boot only.
func WriteReplace(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// SaveSession records a connection for the daemon that takes it over.
func SaveSession(dataDir string, f SessionFile) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	if err := WriteReplace(sessionPath(dataDir), b); err != nil {
		return fmt.Errorf("failed to record the FUSE session: %w", err)
	}
	return nil
}

// LoadSession reads what the previous daemon of the connection recorded.
func LoadSession(dataDir string) (SessionFile, error) {
	var f SessionFile
	b, err := os.ReadFile(sessionPath(dataDir))
	if err != nil {
		return f, fmt.Errorf("failed to read the FUSE session the previous daemon recorded: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("the FUSE session %s: %w", sessionPath(dataDir), err)
	}
	return f, nil
}

// HeldSession checks that the connection recorded in dataDir can be
// taken over by this allocfs, and returns its mount point.
func HeldSession(dataDir string) (string, error) {
	f, err := LoadSession(dataDir)
	if err != nil {
		return "", err
	}
	if err := transport.CheckSession(f.Session); err != nil {
		return "", err
	}
	return f.Session.Dir, nil
}

// RemoveState removes everything kept for a daemon taking dataDir's
// connection over, once the connection has ended.
func RemoveState(dataDir string) error {
	if err := os.RemoveAll(filepath.Join(dataDir, stateDir)); err != nil {
		return fmt.Errorf("failed to remove the FUSE session record: %w", err)
	}
	return nil
}
