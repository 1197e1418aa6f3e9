package fs

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/allocfs/allocfs/fs/volume"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
)

// What a mount is: the Mount, its options and the node type of its root,
// which point at each other. Every file above this one in doc.go's list
// builds on it; it uses only the types the mount holds (identity.go,
// chrootenv.go, memvolume.go, opcount.go).

// capHandleKillprivV2 is FUSE_HANDLE_KILLPRIV_V2 (bit 28 on Linux), which
// go-fuse does not name. With it the kernel stops asking the daemon for
// security.capability before every write(2).
const capHandleKillprivV2 = 1 << 28

// MountOptions tune a mount.
type MountOptions struct {
	// GoFuseServer serves requests with go-fuse's fuse.Server instead of
	// allocfs's own loop (fs/transport), to compare the two.
	GoFuseServer bool
	// Debug turns on go-fuse's request trace, which only go-fuse's server
	// has: it implies GoFuseServer.
	Debug bool
	// IOUring has the kernel send requests over io_uring where it can
	// (FUSE_OVER_IO_URING, Linux 6.14+ with the fuse module's
	// enable_uring on); /dev/fuse otherwise. Only the own loop has it.
	IOUring bool
	// AllowSuid mounts without nosuid, so that a set-id or
	// file-capability binary in an allocation (a chroot's ping) runs
	// with the privileges its bits grant, as on a local disk. Off, a
	// task cannot gain privileges from a file it can write, nor from
	// one that migration or a snapshot brought in. It applies when the
	// mount is made: a daemon that takes a mount over keeps it as it is.
	// nodev holds either way.
	AllowSuid bool
	// StableTimeout is how long the kernel may cache entries and
	// attributes; allocfs invalidates what it changes itself.
	StableTimeout time.Duration
	// Requests, when set, is told of every request allocfs's own loop
	// handles (fs/transport); go-fuse's server (GoFuseServer, Debug)
	// tells it nothing.
	Requests transport.Observer
	// CopyUps, when set, is told of every entry a volume copies up.
	CopyUps layer.CopyUpObserver
	// NegativeTimeout is how long a failed lookup is cached.
	NegativeTimeout time.Duration
	// ChrootEnv is Nomad's chroot_env: host paths by their place in a
	// chroot (DefaultChrootEnv). A task directory Nomad builds a chroot
	// in shows them, read-only, below its own layer (chroot.go); nil or
	// empty shows none.
	ChrootEnv map[string]string
	// Memory, when set, keeps the memory volumes' descriptors while no
	// daemon runs (memvol.go); without one they end with this process.
	Memory MemoryKeeper
	// HeldMemory are the descriptors of memory volumes that Memory kept
	// for the previous daemon, by key; the mount takes them.
	HeldMemory map[string]int
	// MemoryInodes, when set, gives the entry cap of a memory volume of
	// a byte cap instead of defaultMemInodes.
	MemoryInodes func(size int64) int64
	// Created, when set, is told of each allocation a mkdir at the mount
	// root made (Nomad's client), once it is recorded: the daemon asks
	// Nomad its size. It runs in the mkdir's request, so it must not
	// block.
	Created func(id string)
	// interpose, when set, wraps the request handler: tests use it to
	// hold or delay a request as a busy or starved daemon thread would.
	interpose func(fuse.RawFileSystem) fuse.RawFileSystem
	// adopt, when set, serves a connection an earlier daemon mounted
	// (AdoptMount).
	adopt *adoption
}

// DefaultMountOptions are the mount's defaults. `allocfs serve` takes
// them but for IOUring, which it leaves off unless asked: a connection
// that outlives its daemon must not hold requests in rings
// (docs/design/live-restart.md).
func DefaultMountOptions() MountOptions {
	return MountOptions{IOUring: true, StableTimeout: 60 * time.Second, NegativeTimeout: time.Second}
}

// Mount is a live FUSE mount of a store.
type Mount struct {
	// ioUring is set when the kernel sends requests over io_uring.
	ioUring bool
	// takeover resolves what the kernel got from earlier daemons, in a
	// daemon that took the connection over; nil otherwise.
	takeover *restart.TakeoverFS
	// backingIDs records passthrough registrations for a daemon that
	// takes the connection over (backingids.go); nil without one.
	backingIDs *restart.BackingIDs
	// outcomes records the outcome of namespace requests for a daemon
	// that takes the connection over (outcomes.go); nil without one.
	outcomes *restart.Outcomes
	logger   hclog.Logger
	store    *store.Store
	dir      string
	opts     MountOptions
	server   fuseServer
	root     *rootNode
	started  time.Time
	// agent owns the memory volumes' roots: the daemon's own uid.
	agent      fuseOwner
	mem        memVolumes
	noSwapOnce sync.Once
	slots      slots
	// links finds the names of hard-linked lower files for copy-up;
	// ctimes hides copy-ups from change times.
	links  layer.Links
	ctimes layer.Ctimes
	// roots keeps the layer roots every fd-relative call starts from;
	// dirs the directories below them that entries are named in.
	roots *layer.RootCache
	dirs  *layer.DirCache
	// requests counts what the kernel asks, by opcode.
	requests *requestCounter

	// vol is what the volume nodes share: the passthrough state and its
	// counters among it.
	vol *volume.Plane

	// deferred holds the allocations a request handler is changing
	// (handlerChange), whose notifications wait until it returns, and
	// the goroutines sending those.
	deferred struct {
		mu  sync.Mutex
		ids map[string]int
		wg  sync.WaitGroup
	}
	// rootTime is when an allocation last came or went through the
	// mount, in Unix nanoseconds (0: never): the mount root's times.
	rootTime atomic.Int64
	// chroot is the chroot environment task directories can show
	// (chroot.go); nil for none.
	chroot *chrootEnv

	stopHook    func()
	unmountOnce sync.Once
	unmountErr  error
}

// stableTimeouts sets the kernel cache lifetime of a skeleton entry.
func (m *Mount) stableTimeouts(out *fuse.EntryOut) {
	out.SetEntryTimeout(m.opts.StableTimeout)
	out.SetAttrTimeout(m.opts.StableTimeout)
}

// fuseOwner is a uid/gid pair as FUSE attributes carry it.
type fuseOwner struct{ uid, gid uint32 }

// fuseServer is the end of the FUSE connection serving a mount: allocfs's
// own loop, or go-fuse's server.
type fuseServer interface {
	// Unmount unmounts; EBUSY while files are open in the mount.
	Unmount() error
	// Wait returns once the connection has ended.
	Wait() error
}

type ownServer struct{ conn *transport.Conn }

func (s ownServer) Unmount() error { return s.conn.Unmount() }

func (s ownServer) Wait() error { return s.conn.Wait() }

type goFuseServer struct{ server *fuse.Server }

func (s goFuseServer) Unmount() error { return s.server.Unmount() }

func (s goFuseServer) Wait() error {
	s.server.Wait()
	return nil
}

// adoption is what NewMount needs to serve a connection it did not mount.
type adoption struct {
	fd      int
	session restart.SessionFile
}

// rootNode is the mount root: one directory per allocation.
type rootNode struct {
	gofs.Inode
	m *Mount
}
