//go:build linux

package daemon

import (
	"time"

	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/gc"
	"github.com/hashicorp/go-hclog"
)

// Config is what a daemon needs, with every path absolute and free of
// symbolic links as far as it exists.
type Config struct {
	DataDir  string
	MountDir string
	// Socket is the control API's unix socket.
	Socket string
	Mount  fs.MountOptions
	// Live keeps the connection alive across restarts (package restart).
	Live bool
	// AllowNonEmpty mounts over a mount point that holds files.
	AllowNonEmpty bool
	// Stored is the FUSE connection systemd passed from its descriptor
	// store (restart.ListenedFds), or -1; StoredMem are the memory
	// volumes' descriptors it passed with it, by their names there.
	Stored    int
	StoredMem map[string]int
	// Node is what other machines reach over TCP, and Secrets what its
	// files held at the start (Node.Load).
	Node    NodeConfig
	Secrets *NodeSecrets
	GC      gc.Config
	// UsageInterval is how often the metrics' allocation usage is
	// measured.
	UsageInterval time.Duration
	// StoreOpts are the store's options: its disk limits.
	StoreOpts store.Options
	// NomadAddr, when set, is the Nomad agent each allocation Nomad's
	// client makes through the mount takes its disk limit from, read with
	// the token in NomadTokenFile.
	NomadAddr, NomadTokenFile string
	// Reload, when set, is what a SIGHUP applies; nil: nothing to reload.
	Reload func() (*Reload, error)
}

// Reload is what a SIGHUP changes in a running daemon: the caller reads
// its configuration again, and says what it changed.
type Reload struct {
	Level hclog.Level
	// Secrets are the listener's tokens and TLS, read again.
	Secrets *NodeSecrets
	// Waiting names the changed settings that only a start applies.
	Waiting []string
	// Config names the file the configuration was read from, for the log.
	Config string
}
