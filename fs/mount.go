package fs

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/allocfs/allocfs/fs/volume"
	"github.com/allocfs/allocfs/restart"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// detachWait bounds how long Unmount waits for a lazily detached mount's
// last open files to be closed.
const detachWait = 5 * time.Second

// rootCacheSize bounds the layer roots a mount keeps open: two or three
// per live volume (its upper layer and lowers), for a few dozen busy
// allocations, well inside the descriptors the mount keeps in reserve
// (netlimit.Budget: 256 at least).
const rootCacheSize = 64

// dirCacheSize bounds the directories inside layers a mount keeps open
// (layer.DirCache): the directories tasks are working in, as many again
// as rootCacheSize, inside the same reserve.
const dirCacheSize = 64

// NewMount mounts store at dir and starts serving. The caller must call
// Unmount. The daemon must never access dir itself: a FUSE server that
// reads its own mount from a request handler deadlocks.
func NewMount(logger hclog.Logger, store *store.Store, dir string, opts MountOptions) (*Mount, error) {
	m := &Mount{
		logger:   logger.Named("mount").With("mountpoint", dir),
		store:    store,
		dir:      dir,
		opts:     opts,
		started:  time.Now(),
		roots:    layer.NewRootCache(rootCacheSize),
		dirs:     layer.NewDirCache(dirCacheSize),
		requests: &requestCounter{next: opts.Requests},
	}
	m.vol = volume.NewPlane(m.logger, volumeHost{m}, m.dirs, store.DataDir())
	m.deferred.ids = make(map[string]int)
	m.agent = fuseOwner{uint32(os.Geteuid()), uint32(os.Getegid())}
	// The kernel has applied the caller's umask already; applying ours
	// again would turn a requested 0620 into 0600. Setting it is the
	// program's business (before any goroutine), not a constructor's.
	if u, err := processUmask(); err != nil {
		return nil, fmt.Errorf("failed to read the process umask: %w", err)
	} else if u != 0 {
		return nil, fmt.Errorf("the process umask is %04o: a FUSE server must run with umask 0, or new files get the umask twice (the kernel applied the caller's); call syscall.Umask(0) first", u)
	}

	m.startMemory(opts.HeldMemory)
	if err := m.setupChroot(opts.ChrootEnv); err != nil {
		return nil, fmt.Errorf("failed to set up the chroot environment: %w", err)
	}
	m.root = &rootNode{m: m}
	var generation uint32
	if opts.adopt != nil {
		generation = opts.adopt.session.Generation
	}
	stable := opts.StableTimeout
	negative := opts.NegativeTimeout
	fopts := &gofs.Options{
		// Mode 0000 is a real mode (chmod 000 is how tasks lock a file
		// away); without this go-fuse reports it as 0644 or 0755.
		NullPermissions: true,
		// The root's inode number is FUSE's root node ID, as "." and
		// ".." of its listing say (tree.go).
		RootStableAttr: &gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: volume.RootIno},
		// A node's ID is its inode number, which says where its file
		// is (tree.go, identity.go): a daemon that takes the connection
		// over from another finds every node the kernel names
		// (takeover.go).
		ExternalNodeID: true,
		// Nodes go-fuse numbers itself (none of allocfs's own) start here:
		// each daemon of a connection in a range of its own, so that no
		// number an earlier one handed out names another node now.
		FirstAutomaticIno: syntheticBit | uint64(generation)<<40,
		EntryTimeout:      &stable,
		AttrTimeout:       &stable,
		NegativeTimeout:   &negative,
		MountOptions: fuse.MountOptions{
			AllowOther:        os.Geteuid() == 0,
			FsName:            "allocfs:" + store.DataDir(),
			Name:              "allocfs",
			Options:           []string{"default_permissions"},
			DirectMountStrict: os.Geteuid() == 0,
			MaxWrite:          1 << 20,
			// No EnableLocks: the kernel then keeps fcntl and flock
			// locks itself, with exact POSIX semantics (per process,
			// released on any close). Every user of an allocation's
			// files is on this node and goes through this mount, so
			// local locks are all the locking there is to do; go-fuse's
			// loopback would map them onto open-file locks instead.
			// READDIRPLUS_AUTO lets the kernel ask for attributes only
			// when the lister uses them: the first batch of a listing
			// may come with attributes (volume/plusbatch.go), later ones only
			// after the lister looked an entry up. A names-only listing
			// (ls, a shell glob, find -name) then costs a plain READDIR
			// per batch (the size of the lister's getdents buffer on
			// this kernel) and no node per entry; ls -l, which stats as
			// it reads, still gets READDIRPLUS.
			ExtraCapabilities: capHandleKillprivV2 | fuse.CAP_READDIRPLUS_AUTO,
			Debug:             opts.Debug,
		},
	}
	// go-fuse's own diagnostics, and a panic in a handler, go to the
	// mount's log instead of the standard logger.
	fuseLog := m.logger.Named("fuse").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	fopts.Logger = fuseLog
	fopts.MountOptions.Logger = fuseLog
	fopts.MountOptions.PanicHandler = func(p any) fuse.Status {
		m.logger.Error("panic in a FUSE handler; answered EIO", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return fuse.EIO
	}
	if opts.AllowSuid {
		// go-fuse's mount starts from nosuid,nodev and takes "suid" off
		// its options as the flag that drops nosuid.
		fopts.MountOptions.Options = append(fopts.MountOptions.Options, "suid")
	}
	if opts.adopt != nil && (opts.GoFuseServer || opts.Debug) {
		return nil, errors.New("go-fuse's server cannot serve a connection another daemon mounted")
	}
	if opts.GoFuseServer || opts.Debug {
		if err := m.serveGoFuse(dir, fopts); err != nil {
			if m.server != nil {
				// Mounted, and did not come up.
				m.Unmount()
			}
			return nil, err
		}
	} else {
		topts := transport.Options{
			FsName:             fopts.MountOptions.FsName,
			Subtype:            fopts.MountOptions.Name,
			AllowOther:         fopts.MountOptions.AllowOther,
			DefaultPermissions: true,
			AllowSuid:          opts.AllowSuid,
			MaxWrite:           fopts.MountOptions.MaxWrite,
			Capabilities:       mountCapabilities,
			IOUring:            opts.IOUring,
			Logger:             m.logger.Named("fuse"),
			Observer:           m.requests,
		}
		var conn *transport.Conn
		var err error
		if a := opts.adopt; a != nil {
			if err := m.slots.load(slotsPath(store.DataDir())); err != nil {
				return nil, err
			}
			if conn, err = transport.Adopt(a.fd, a.session.Session, topts); err != nil {
				return nil, fmt.Errorf("failed to take over the allocfs mount at %q: %w", dir, err)
			}
		} else if conn, err = transport.Mount(dir, topts); err != nil {
			return nil, fmt.Errorf("failed to mount allocfs at %q: %w", dir, err)
		}
		// What a daemon taking the connection over needs is on disk
		// before any node ID reaches the kernel.
		m.slots.file = slotsPath(store.DataDir())
		m.slots.saveFailed = func(err error) {
			m.logger.Error("failed to record a slot: a daemon taking this mount over will not find that allocation's nodes", "error", err)
		}
		serr := restart.SaveSession(store.DataDir(), restart.SessionFile{Session: conn.Session(), Generation: generation})
		if serr == nil {
			m.slots.mu.Lock()
			serr = m.slots.saveLocked()
			m.slots.mu.Unlock()
		}
		switch {
		case serr != nil && opts.adopt != nil:
			// The next daemon would count from the same generation,
			// and take this one's handles for its own.
			return nil, errors.Join(fmt.Errorf("failed to take over the allocfs mount at %q: %w", dir, serr), conn.Wait())
		case serr != nil:
			m.logger.Error("the mount cannot be taken over by another daemon", "error", serr)
		}
		fopts.ServerCallbacks = conn
		if cb, err := restart.OpenBackingIDs(conn, store.DataDir(), opts.adopt != nil); err != nil {
			m.logger.Error("a daemon taking this mount over will not open files the kernel passes through while they are open", "error", err)
		} else {
			fopts.ServerCallbacks = cb
			m.backingIDs = cb
		}
		h := m.newHandler(fopts, generation, serr == nil)
		m.server = ownServer{conn}
		m.vol.RecordUnlinked()
		m.vol.SetPassthrough(os.Geteuid() == 0 && conn.Flags()&fuse.CAP_PASSTHROUGH != 0)
		if err := conn.Serve(h); err != nil {
			return nil, errors.Join(fmt.Errorf("failed to serve allocfs at %q: %w", dir, err), unix.Unmount(dir, unix.MNT_DETACH), conn.Wait())
		}
		m.ioUring = conn.IOUring()
		if opts.adopt != nil {
			m.logger.Info("took the mount over", "generation", generation)
		}
	}
	if m.vol.PassthroughNegotiated() {
		m.logger.Info("mounted", "passthrough", true, "io_uring", m.ioUring)
	} else {
		m.logger.Warn("mounted without passthrough: file data goes through the daemon", "passthrough", false, "root", os.Geteuid() == 0)
	}
	m.stopHook = store.OnChange(m.invalidate)
	return m, nil
}

// Dir is the mount point.
func (m *Mount) Dir() string { return m.dir }

// Passthrough reports whether regular files are served from their
// backing fds by the kernel: it was negotiated at mount time, and no read
// or write has reached the daemon since.
func (m *Mount) Passthrough() bool { return m.vol.Passthrough() }

// FileOpens returns how many handles of volume files the mount has given
// the kernel to serve by passthrough, and how many it serves itself (a
// lower file of a writable volume, a file with set-id bits, every file
// when passthrough is off), since it was made.
func (m *Mount) FileOpens() (passthrough, daemon uint64) { return m.vol.FileOpens() }

// invalidate makes the kernel forget what it cached about allocation
// id, so that the next lookup sees the store's current record. It is the
// store's OnChange hook and runs on the goroutine that changed the store:
// at once for an API request or an AllocDir call, after the handler
// returns for a change a FUSE request made (handlerChange), since a
// notification sent inside a handler can deadlock.
func (m *Mount) invalidate(id string) {
	// A change may have moved or removed layers, and directories in them.
	m.dirs.Forget()
	m.forgetRemovals()
	if m.fromHandler(id) {
		m.later(func() { m.invalidateNow(id) })
		return
	}
	m.invalidateNow(id)
}

func (m *Mount) invalidateNow(id string) {
	st, err := m.store.View(id)
	if err != nil {
		m.dropMem(id)
		m.slots.release(id)
		if ch := m.root.GetChild(id); ch != nil {
			m.root.NotifyDelete(id, ch)
		}
	}
	// Also flushes a negative entry cached before the allocation existed.
	m.root.NotifyEntry(id)
	if st != nil {
		m.invalidateVolumes(id, st)
	}
}

// invalidateVolumes drops the kernel's entries of the volume roots of an
// allocation that show what its record st no longer says (other layers
// after a remap, a volume removed, another allocation's view of a volume
// renamed here), so that the next lookup sees the layers the record names
// now. Dropped, not expired: only the node's FORGET, once the entry is
// gone, retires the old node. A volume frozen by a seal keeps its layers,
// and with them its inode number and node: the kernel may look it up again
// before it forgets the node (a FORGET and a LOOKUP are served by
// different readers), or a process may hold it open, so the node itself
// is frozen (followRecord). Entries that still show what the record says
// are left alone: the kernel detaches the mounts below a dropped entry,
// and Nomad mounts on the task directories and the <task>/alloc views
// (nothing of Nomad's lies below a volume that migrates).
func (m *Mount) invalidateVolumes(id string, st *record.State) {
	a := m.root.GetChild(id)
	if a == nil {
		return
	}
	var walk func(dir *gofs.Inode)
	walk = func(dir *gofs.Inode) {
		for name, ch := range dir.Children() {
			switch n := ch.Operations().(type) {
			case *volume.Node:
				if n.IsMemory() || n.Key() == "" {
					// A memory volume is no record's: it goes with
					// the allocation or task (dropMemory). An entry
					// of a layout directory's own volume (a chroot's
					// usr/, the dev/ and proc/ its executor mounts
					// on, alloc/container) is no volume root: the
					// record says nothing of it, and dropping it
					// would detach what is mounted there.
					continue
				}
				if n.Layout() != nil {
					walk(ch)
				}
				if !m.followRecord(n, st) {
					m.dropEntry(dir, name)
				}
			}
		}
	}
	walk(a)
}

// dropEntry drops the kernel's entry name of dir at once (DropEntry);
// go-fuse's server has only the notification its Inode sends.
func (m *Mount) dropEntry(dir *gofs.Inode, name string) {
	if s, ok := m.server.(ownServer); ok {
		s.conn.DropEntry(volume.InoOf(dir), name)
		return
	}
	dir.NotifyEntry(name)
}

// followRecord reports whether the volume root n can go on showing the
// volume st names at its key: the same layers, in st's own slot for its
// view. A record that freezes the volume freezes n, and every node below
// it, in place. A freeze is never undone here: the store never thaws a
// volume, and two invalidations of one allocation can run at once, the
// older with a record from before the seal; a writable record over a
// frozen node (which no store change makes) drops the node instead.
func (m *Mount) followRecord(n *volume.Node, st *record.State) bool {
	v := st.Volumes[n.Key()]
	if v == nil || n.Slot() != m.slots.peek(st.ID, n.View()) {
		return false
	}
	if !slices.Equal(n.Stack().Roots, m.volumeStack(st, n.Key()).Roots) {
		return false
	}
	if v.ReadOnly {
		n.Freeze()
	}
	return v.ReadOnly == n.ReadOnly()
}

// Unmount detaches the mount: a normal unmount with a few retries while
// it is busy, then a lazy detach, so that shutdown always leaves the mount
// point usable. It waits for the server loop to end.
func (m *Mount) Unmount() error {
	m.unmountOnce.Do(func() {
		if m.stopHook != nil {
			m.stopHook()
		}
		var err error
		for attempt := 0; attempt < 5; attempt++ {
			if err = m.server.Unmount(); err == nil {
				break
			}
			time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
		}
		if err != nil {
			m.logger.Warn("unmount failed, detaching lazily", "error", err)
			if lerr := unix.Unmount(m.dir, unix.MNT_DETACH); lerr != nil {
				m.unmountErr = errors.Join(fmt.Errorf("failed to unmount %q: %w", m.dir, err), fmt.Errorf("lazy unmount: %w", lerr))
				return
			}
			// A detached mount lives on while processes hold files in
			// it, and the server with it: do not wait for them forever.
			done := make(chan struct{})
			go func() {
				m.server.Wait()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(detachWait):
				m.logger.Warn("detached mount still has open files; leaving its server to them", "waited", detachWait)
			}
			return
		}
		werr := m.server.Wait()
		// Notifications still being sent fail now that the connection
		// is gone.
		m.deferred.wg.Wait()
		m.unmountErr = errors.Join(werr, m.roots.Close(), m.dirs.Close(), m.closeMemory(), m.dropTakeoverState())
	})
	return m.unmountErr
}

// processUmask reads the process's umask without changing it, from
// /proc/self/status (Linux 4.7 and later).
func processUmask() (uint32, error) {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Umask:"); ok {
			u, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
			return uint32(u), err
		}
	}
	return 0, errors.New("no Umask line in /proc/self/status")
}

// RequestCounts returns how many requests of each kind the mount has
// served since it was made (a FORGET or a BATCH_FORGET counted once per
// message), by the protocol's name of the opcode ("UNKNOWN" for one the
// transport does not know); kinds never seen are left out.
func (m *Mount) RequestCounts() map[string]uint64 {
	out := make(map[string]uint64)
	for op := range m.requests.counts {
		n := m.requests.counts[op].Load()
		if n == 0 {
			continue
		}
		name := transport.OpName(uint32(op))
		if name == "" {
			name = "UNKNOWN"
		}
		out[name] += n
	}
	return out
}

// volumeHost answers the volume nodes' questions of the mount
// (volume.Host).
type volumeHost struct{ m *Mount }

func (h volumeHost) Identity(stack *layer.Stack, i int, rel string, st *syscall.Stat_t) uint64 {
	return h.m.identity(stack, i, rel, st)
}

func (h volumeHost) LimitStatfs(id string, out *fuse.StatfsOut) { h.m.limitStatfs(id, out) }

// AdoptMount serves the connection of /dev/fuse descriptor fd, which an
// earlier daemon mounted on store's data dir and recorded there, and
// asks the kernel to send again what that daemon had not answered. It
// takes fd. The mount point is the recorded one.
func AdoptMount(logger hclog.Logger, st *store.Store, fd int, opts MountOptions) (*Mount, error) {
	f, err := restart.LoadSession(st.DataDir())
	if err != nil {
		return nil, err
	}
	f.Generation++
	if f.Generation == 0 {
		return nil, errors.New("the FUSE session has been taken over 2^32 times")
	}
	opts.adopt = &adoption{fd: fd, session: f}
	return NewMount(logger, st, f.Session.Dir, opts)
}
