package transport

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/allocfs/allocfs/internal/fusectl"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Protocol versions. The kernel offers its own minor version and the
// connection runs at the lower of the two. ourMinor is the version go-fuse's
// node bridge is written against (its replies have that version's sizes);
// minMinor is the oldest kernel the loop talks to (Linux 5.11: everything
// allocfs relies on is older, passthrough aside, which is negotiated).
const (
	kernelMajor = 7
	ourMinor    = 28
	minMinor    = 31
)

// Options shape a connection.
type Options struct {
	// FsName is the mount's source, as /proc/mounts shows it.
	FsName string
	// Subtype makes the filesystem type fuse.<Subtype>.
	Subtype string
	// AllowOther lets users other than the mounter in (root only).
	AllowOther bool
	// DefaultPermissions has the kernel check modes and owners itself.
	DefaultPermissions bool
	// AllowSuid mounts without MS_NOSUID: the set-id bits and file
	// capabilities of the mount's files take effect on exec. Devices
	// stay off (MS_NODEV) either way.
	AllowSuid bool
	// MaxWrite is the largest WRITE (and READ) the kernel sends, in
	// bytes; 0 means 128 KiB. At most 1 MiB.
	MaxWrite int
	// MaxBackground caps the kernel's background requests (readahead,
	// async releases); 0 means 12.
	MaxBackground int
	// Capabilities are the INIT flags (fuse.CAP_*) the filesystem wants;
	// the connection has those the kernel offers too.
	Capabilities uint64
	// MaxReaders caps the threads reading requests from /dev/fuse; 0
	// means 16. At least two stay blocked in read(2) while the mount is
	// idle. Over io_uring, each CPU's queue has up to 16 threads of its
	// own (fuseuring.go).
	MaxReaders int
	// IOUring serves requests over io_uring where the kernel offers it
	// (fuseuring.go), and over /dev/fuse otherwise.
	IOUring bool
	// Logger receives the connection's diagnostics.
	Logger hclog.Logger
	// Observer, when set, is told of every request handled (observe.go).
	Observer Observer
}

// Conn is one mounted FUSE connection.
type Conn struct {
	fd  int
	dir string
	fs  fuse.RawFileSystem
	log hclog.Logger
	obs Observer
	// arr is obs when it is an ArrivalObserver.
	arr    ArrivalObserver
	kernel fuse.InitIn
	flags  uint64 // negotiated
	// maxWrite bounds a request's size, so the read buffers' too.
	maxWrite   int
	maxPages   int // negotiated with MAX_PAGES
	maxReaders int32

	readers sync.WaitGroup
	// idle counts the readers blocked in read(2) or about to be;
	// running counts all the readers.
	idle, running atomic.Int32
	closed        atomic.Bool
	bufs          sync.Pool
	// probing is set while Serve runs the poll probe (pollprobe.go);
	// polls counts the POLL requests, firstPoll names the first one's node.
	probing   atomic.Bool
	polls     atomic.Int32
	firstPoll atomic.Uint64

	// adopted is set on a connection another daemon mounted (Adopt).
	adopted bool
	// ended is set once a read of the connection failed: it was
	// unmounted or aborted.
	ended atomic.Bool
	// active counts the handlers running on /dev/fuse readers; parked
	// is set by Park.
	active atomic.Int32
	parked atomic.Bool

	// rings is set while requests come over io_uring (fuseuring.go);
	// ringRequests counts those.
	rings        atomic.Bool
	ringRequests atomic.Int64

	unmountOnce sync.Once
	closeOnce   sync.Once
}

// Mount mounts a FUSE filesystem at dir and answers the kernel's INIT.
// Requests wait until Serve. Mounting needs CAP_SYS_ADMIN: allocfs runs
// as root.
func Mount(dir string, opts Options) (*Conn, error) {
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.MaxWrite <= 0 {
		opts.MaxWrite = 128 << 10
	}
	if opts.MaxWrite > 1<<20 {
		return nil, fmt.Errorf("max write %d is above the kernel's 1 MiB", opts.MaxWrite)
	}
	if opts.MaxBackground <= 0 {
		opts.MaxBackground = 12
	}
	if opts.MaxReaders <= 0 {
		opts.MaxReaders = 16
	}
	if opts.MaxReaders < 2 {
		opts.MaxReaders = 2
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("failed to mount at %q: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(abs, &st); err != nil {
		return nil, fmt.Errorf("failed to mount at %q: %w", abs, err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("failed to open /dev/fuse: %w", err)
	}
	c := &Conn{fd: fd, dir: abs, log: opts.Logger, maxWrite: opts.MaxWrite, maxReaders: int32(opts.MaxReaders)}
	c.observe(opts.Observer)
	c.bufs.New = func() any { return newBuffers(c.maxWrite) }

	data := fmt.Sprintf("fd=%d,rootmode=%o,user_id=%d,group_id=%d", fd, st.Mode&unix.S_IFMT, os.Geteuid(), os.Getegid())
	if opts.AllowOther {
		data += ",allow_other"
	}
	if opts.DefaultPermissions {
		data += ",default_permissions"
	}
	fstype := "fuse"
	if opts.Subtype != "" {
		fstype += "." + opts.Subtype
	}
	source := opts.FsName
	if source == "" {
		source = fstype
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if opts.AllowSuid {
		flags &^= unix.MS_NOSUID
	}
	if err := unix.Mount(source, abs, fstype, flags, data); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("failed to mount %s at %q: %w", fstype, abs, err)
	}
	if err := c.init(opts); err != nil {
		return nil, errors.Join(err, c.Unmount(), c.close())
	}
	return c, nil
}

// init reads the kernel's INIT and answers it. Until it has, every access
// to the mount waits.
func (c *Conn) init(opts Options) error {
	b := c.bufs.Get().(*buffers)
	defer c.bufs.Put(b)
	n, err := c.read(b.in)
	if err != nil {
		return fmt.Errorf("failed to read INIT: %w", err)
	}
	in := b.in[:n]
	if n < int(unsafe.Sizeof(fuse.InHeader{})) {
		return fmt.Errorf("INIT: short request of %d bytes", n)
	}
	h := (*fuse.InHeader)(unsafe.Pointer(&in[0]))
	if h.Opcode != opInit {
		return fmt.Errorf("the kernel's first request is opcode %d, not INIT", h.Opcode)
	}
	// The INIT input grew with 7.36; an older kernel sends less.
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&c.kernel)), unsafe.Sizeof(c.kernel)), in)
	if c.kernel.Major != kernelMajor || c.kernel.Minor < minMinor {
		c.reply(b, h.Unique, syscall.EPROTO, 0)
		return fmt.Errorf("the kernel speaks FUSE %d.%d; allocfs needs %d.%d or later", c.kernel.Major, c.kernel.Minor, kernelMajor, minMinor)
	}
	want := opts.Capabilities
	if opts.IOUring {
		// Offered only when a ring can be set up: once the kernel has
		// taken the flag, it holds every request until the rings are
		// registered, or one registration fails.
		if err := IOUringUsable(); err != nil {
			c.log.Info("serving over /dev/fuse", "reason", err)
		} else {
			want |= fuse.CAP_OVER_IO_URING
		}
	}
	c.flags = c.kernel.Flags64() & want
	if c.flags>>32 != 0 {
		c.flags |= fuse.CAP_INIT_EXT
	}
	c.maxPages = (c.maxWrite-1)/os.Getpagesize() + 1
	out := (*fuse.InitOut)(unsafe.Pointer(&b.out[outHeaderSize]))
	*out = fuse.InitOut{
		Major:               kernelMajor,
		Minor:               min(ourMinor, c.kernel.Minor),
		MaxReadAhead:        c.kernel.MaxReadAhead,
		Flags:               uint32(c.flags),
		Flags2:              uint32(c.flags >> 32),
		MaxBackground:       uint16(opts.MaxBackground),
		CongestionThreshold: uint16(opts.MaxBackground * 3 / 4),
		MaxWrite:            uint32(c.maxWrite),
		MaxPages:            uint16(c.maxPages),
	}
	if c.flags&fuse.CAP_PASSTHROUGH != 0 {
		// Files of the backing filesystem sit one level below.
		out.MaxStackDepth = 1
	}
	if errno := c.reply(b, h.Unique, 0, int(unsafe.Sizeof(fuse.InitOut{}))); errno != 0 {
		return fmt.Errorf("failed to answer INIT: %w", errno)
	}
	return nil
}

// Flags returns the capabilities the connection negotiated (fuse.CAP_*).
func (c *Conn) Flags() uint64 { return c.flags }

// IOUring reports whether requests come over io_uring.
func (c *Conn) IOUring() bool { return c.rings.Load() }

// RingRequests counts the requests served over io_uring.
func (c *Conn) RingRequests() int64 { return c.ringRequests.Load() }

// KernelMinor returns the kernel's protocol minor version.
func (c *Conn) KernelMinor() uint32 { return c.kernel.Minor }

// Serve starts serving requests with fs, and returns once the kernel has
// been told that this connection does not poll (pollprobe.go). The
// filesystem's notifications and backing files go through c (it
// implements go-fuse's fs.ServerCallbacks). It fails only when the kernel
// waits for FUSE rings that could not be set up and would not give up on
// them: then the connection is aborted, and the caller unmounts.
func (c *Conn) Serve(fs fuse.RawFileSystem) error {
	c.fs = fs
	if c.adopted {
		// Before any reader runs: the resend gives out again whatever
		// the connection's file is processing, and only the old
		// daemon's requests are there yet.
		if err := c.Resend(); err != nil {
			c.log.Warn("the kernel did not resend what the previous daemon had not answered: those requests wait until the mount ends (FUSE_NOTIFY_RESEND needs Linux 6.9)", "error", err)
		}
	}
	c.spawn()
	c.spawn()
	if c.flags&fuse.CAP_OVER_IO_URING != 0 {
		if err := c.startRings(); err != nil {
			c.log.Warn("serving over /dev/fuse: the FUSE rings could not be set up", "error", err)
			if rerr := c.refuseRings(); rerr != nil {
				return errors.Join(fmt.Errorf("the kernel waits for FUSE rings that could not be set up (%w), and could not be made to give up on them: %w", err, rerr), c.abort())
			}
		} else {
			c.rings.Store(true)
		}
	}
	if c.adopted {
		// The daemon that mounted answered the probe's POLL: the kernel
		// asks no more on this connection. And this daemon must not
		// touch its own mount before it has asked for the resend.
		return nil
	}
	c.probing.Store(true)
	err := probePoll(c.dir)
	c.probing.Store(false)
	if err != nil {
		c.log.Error(errProbe.Error(), "error", err)
	}
	return nil
}

// abort ends the connection through the kernel's fusectl (what `echo 1 >
// /sys/fs/fuse/connections/N/abort` does, on a private instance where
// the host has none mounted: internal/fusectl), for a mount nothing can
// serve: every request waiting on it fails. The mount is found in
// /proc/self/mountinfo, never by touching it.
func (c *Conn) abort() error {
	mounts, err := mountinfo.Read("")
	if err != nil {
		return fmt.Errorf("aborting the FUSE connection at %q: %w", c.dir, err)
	}
	device := ""
	for _, m := range mounts {
		if m.MountPoint == c.dir {
			device = m.Device // the last one is on top
		}
	}
	if device == "" {
		return fmt.Errorf("aborting the FUSE connection at %q: not in /proc/self/mountinfo", c.dir)
	}
	conn, err := fusectl.Conn(device)
	if err == nil {
		var d *fusectl.Dir
		if d, err = fusectl.Shared(); err == nil {
			err = d.Abort(conn)
		}
	}
	if err != nil {
		return fmt.Errorf("aborting the FUSE connection at %q: %w", c.dir, err)
	}
	return nil
}

func (c *Conn) spawn() {
	c.running.Add(1)
	c.idle.Add(1)
	c.readers.Add(1)
	go c.reader()
}

// reader serves requests until the connection ends, each on the
// goroutine that read it. It is not locked to its thread: a locked
// goroutine waiting to run again after its read cannot be run by another
// thread, and a stop-the-world that waits on a thread blocked in this
// mount then never ends (the test suite's heap measurements hung so).
func (c *Conn) reader() {
	defer c.readers.Done()
	defer c.running.Add(-1)
	b := c.bufs.Get().(*buffers)
	defer c.bufs.Put(b)
	for {
		n, err := c.read(b.in)
		idle := c.idle.Add(-1)
		if err != nil {
			c.ended.Store(true)
			if !errors.Is(err, unix.ENODEV) && !c.closed.Load() {
				c.log.Error("reading a FUSE request failed; this reader stops", "error", err)
			}
			return
		}
		if idle == 0 && c.running.Load() < c.maxReaders {
			// Keep one reader waiting while this one works, so that a
			// handler that blocks does not stall the mount.
			c.spawn()
		}
		// Counted before the check, so that Park, which sets parked
		// and then waits for active to drain, never misses a handler.
		c.active.Add(1)
		if c.parked.Load() {
			c.active.Add(-1)
			// Unanswered on purpose: the daemon that takes over has
			// the kernel send it again (Resend).
			select {}
		}
		c.handle(b, b.in[:n])
		c.active.Add(-1)
		if c.idle.Load() >= 2 && c.running.Load() > 2 {
			// Enough readers wait already.
			return
		}
		c.idle.Add(1)
	}
}

// read reads one request, retrying on EINTR (a signal to the thread) and
// on ENOENT (the kernel dropped an interrupted request before it was
// read).
func (c *Conn) read(buf []byte) (int, error) {
	for {
		n, err := unix.Read(c.fd, buf)
		if err == unix.EINTR || err == unix.ENOENT {
			continue
		}
		return n, err
	}
}

// Unmount unmounts the filesystem; the readers end once the kernel has
// let go of the connection. EBUSY means files are still open in it.
func (c *Conn) Unmount() error {
	if err := unix.Unmount(c.dir, 0); err != nil {
		return fmt.Errorf("failed to unmount %q: %w", c.dir, err)
	}
	c.unmountOnce.Do(func() { c.closed.Store(true) })
	return nil
}

// Wait returns when every reader has ended, and closes the connection.
func (c *Conn) Wait() error {
	c.readers.Wait()
	return c.close()
}

func (c *Conn) close() error {
	var err error
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		if cerr := unix.Close(c.fd); cerr != nil {
			err = fmt.Errorf("failed to close the FUSE connection: %w", cerr)
		}
	})
	return err
}

// Dir returns the mount point.
func (c *Conn) Dir() string { return c.dir }

// Ended reports whether the kernel has ended the connection (an unmount,
// an abort): a reader found it gone.
func (c *Conn) Ended() bool { return c.ended.Load() }
