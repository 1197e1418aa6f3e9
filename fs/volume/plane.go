package volume

import (
	"context"
	"sync/atomic"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
)

// Plane is what the volume nodes of one mount share: the mount's logger,
// the directories held open below the layers, the passthrough state and
// its counters, and the two questions only the tree can answer (Host).
type Plane struct {
	logger hclog.Logger
	host   Host
	dirs   *layer.DirCache
	// unlinked are the records of files unlinked while open
	// (unlinkedrec.go), in the store's data dir.
	unlinked restart.Unlinked
	// recordUnlinked is set when the mount serves its own connection,
	// which a daemon can take over: only then are those records of use.
	recordUnlinked atomic.Bool

	// passthrough is whether the kernel negotiated passthrough; it is
	// learnt after the mount is up, when requests are already served.
	passthrough atomic.Bool
	// passthroughLost is set when file data reached the daemon although
	// passthrough was negotiated.
	passthroughLost atomic.Bool
	// passthroughOpens and daemonOpens count the handles of volume files
	// given to the kernel to serve by passthrough, and those whose reads
	// and writes the daemon serves (FileOpens).
	passthroughOpens, daemonOpens atomic.Uint64
}

// Host is what the volume nodes ask of the tree they are mounted in.
type Host interface {
	// Identity is the inode number shown for the entry rel of layer i of
	// stack, whose backing stat is st: salted for the layer, or the one
	// the chroot environment gives its host layer's entries.
	Identity(stack *layer.Stack, i int, rel string, st *syscall.Stat_t) uint64
	// LimitStatfs brings what statfs shows inside allocation id down to
	// its disk limit, where it has one.
	LimitStatfs(id string, out *fuse.StatfsOut)
}

// Layout is what the tree presents over the root of a volume that holds
// the entries of a layout directory (an allocation's own directory, its
// alloc/, a task's directory): the layout's children (alloc/, the tasks;
// data/, logs/, tmp/; local/, tmp/, secrets/, private/, alloc/), whose
// names the volume's own entries never take, and which cannot be
// replaced through it. Every other name is the volume's, as any name is a
// plain directory's.
type Layout interface {
	// Reserved reports whether name is a layout child's.
	Reserved(name string) bool
	// MakesChild reports whether a mkdir of name makes a layout child
	// (Mkdir) rather than a directory of the volume: in an allocation's
	// own directory a mkdir of a task name is Nomad's making a task.
	MakesChild(name string) bool
	// Names lists the layout children the directory has now.
	Names() ([]string, syscall.Errno)
	Lookup(ctx context.Context, dir *gofs.Inode, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno)
	// Mkdir makes the layout child name in root, the volume's root; it
	// fails with EEXIST where the volume holds an entry of that name.
	Mkdir(ctx context.Context, root *Node, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno)
	Rmdir(name string) syscall.Errno
	// Rename renames the layout child name of src, the volume's root,
	// into dst as newName.
	Rename(src *Node, name string, dst *Node, newName string, flags uint32) syscall.Errno
	// Chowned is told of a chown of the directory to uid, which may
	// start Nomad's chroot build in a task directory.
	Chowned(root *Node, uid uint32) syscall.Errno
}

// NewPlane returns the shared state of the volume nodes of one mount,
// whose logger they log with and whose directory cache they name entries
// through.
func NewPlane(logger hclog.Logger, host Host, dirs *layer.DirCache, dataDir string) *Plane {
	return &Plane{logger: logger, host: host, dirs: dirs, unlinked: restart.NewUnlinked(dataDir)}
}

// SetPassthrough says whether the kernel negotiated passthrough; files
// opened from then on are handed to it where they can be.
func (p *Plane) SetPassthrough(on bool) { p.passthrough.Store(on) }

// RecordUnlinked has files unlinked while open recorded for a daemon that
// takes the connection over.
func (p *Plane) RecordUnlinked() { p.recordUnlinked.Store(true) }

// Passthrough reports whether regular files are served from their
// backing fds by the kernel: it was negotiated at mount time, and no read
// or write has reached the daemon since.
func (p *Plane) Passthrough() bool { return p.passthrough.Load() && !p.passthroughLost.Load() }

// PassthroughNegotiated reports whether the kernel agreed to passthrough.
func (p *Plane) PassthroughNegotiated() bool { return p.passthrough.Load() }

// PassthroughLost reports whether passthrough was negotiated and file
// data went through the daemon all the same (Passthrough says neither).
func (p *Plane) PassthroughLost() bool { return p.passthrough.Load() && p.passthroughLost.Load() }

// FileOpens returns how many handles of volume files were given the kernel
// to serve by passthrough, and how many the daemon serves itself (a lower
// file of a writable volume, a file with set-id bits, every file when
// passthrough is off).
func (p *Plane) FileOpens() (passthrough, daemon uint64) {
	return p.passthroughOpens.Load(), p.daemonOpens.Load()
}

// dataThroughDaemon records that file data went through the daemon
// although passthrough was negotiated, and says so once.
func (p *Plane) dataThroughDaemon(op string) {
	if p.passthroughLost.CompareAndSwap(false, true) {
		p.logger.Error("passthrough is off: file data now goes through the daemon (go-fuse disables it for the whole mount after one failed registration)", "op", op, "passthrough", false)
	}
}
