package fs

// The peers of the mount-versus-native benchmarks: every benchmark of
// bench_test.go also runs its workload on other filesystems on the same
// disk in the same run, so that each row of `make bench` shows the mount
// beside its closest peers and beside what the transport alone costs:
//
//   - "loopback": go-fuse's own loopback, in this process (a Go FUSE
//     filesystem on the same library as the mount);
//   - "overlay": kernel overlayfs, an empty lower directory (a layered
//     filesystem with no FUSE in the way);
//   - "fuse-overlayfs": Debian's fuse-overlayfs, the same layout as
//     "overlay" (the layered FUSE filesystem containers use), a process of
//     its own;
//   - "passthrough_ll": libfuse's low-level passthrough example, built
//     from libfuse3-dev's source at setup (a C FUSE server with no layers
//     and no bridge), a process of its own;
//   - "floor", metadata benchmarks only: a fuse.RawFileSystem on the
//     mount's transport answering from a map (benchfloor_test.go), what
//     the kernel and the transport cost with nothing of the daemon's;
//   - "floor-bridge", metadata benchmarks only: the same no-op answers
//     through go-fuse's node bridge, as the mount's go, so that it less
//     "floor" is what the bridge costs.
//
// A peer whose tool is missing, or that cannot be mounted here, skips its
// sub-benchmark with the reason; the rest of the benchmark still runs.

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/allocfs/allocfs/internal/mountinfo"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Side names: the sub-benchmarks of every benchmark, in the order that
// ALLOCFS_BENCH_ORDER=rotate-0 runs them.
const (
	sideNative        = "native"
	sideMount         = "mount"
	sideLoopback      = "loopback"
	sideOverlay       = "overlay"
	sideFuseOverlay   = "fuse-overlayfs"
	sidePassthroughLL = "passthrough_ll"
	sideFloor         = "floor"
	sideFloorBridge   = "floor-bridge"
)

// benchVolPath is where a workload runs below a side's root, as deep as
// <mnt>/<alloc>/alloc/data, so that path walks cost the same number of
// components on every side.
var benchVolPath = filepath.Join("bench", "alloc", "data")

// benchSideSpec is one side of a benchmark: where its workload runs, where
// untimed setup writes, and why it cannot run here, if it cannot.
type benchSideSpec struct {
	name    string
	dir     string // the directory the workload uses
	backing string // the same directory as untimed setup should reach it
	skip    string // non-empty: why this side is skipped
	// counts, where set, returns the FUSE requests served so far by
	// opcode, for the fuse-req/op metric. Only the mount has it: the
	// floors' setup goes through their mounts, so their counts would mix
	// setup with the workload.
	counts func() map[string]uint64
	// served, where set, counts the requests the side's server answered
	// (the floors'), for quietSide; the mount's come from counts. The
	// peers in processes of their own have none: quietSide waits its
	// fixed time for them.
	served func() uint64
}

// benchConfig says what a benchmark needs beyond native and mount.
type benchConfig struct {
	// floor adds the no-op FUSE servers as sides (metadata benchmarks).
	floor bool
	// overlayLower, if set, fills the lower directory of each overlay
	// (kernel overlayfs and fuse-overlayfs) at benchVolPath before it is
	// mounted; a file an overlay is to show from its lower layer must be
	// there before the mount, as neither allows changes to its layers
	// while mounted.
	overlayLower func(dir string) error
}

// benchPeers unmounts the peers of one benchmark.
type benchPeers struct {
	log      hclog.Logger
	teardown []func() error // in mount order
}

// mountPeers mounts the peers of cfg under base and registers their
// unmount with b. A peer that cannot be mounted here becomes a side with
// a skip reason; setup that fails for another reason fails b.
func mountPeers(b *testing.B, log hclog.Logger, base string, cfg benchConfig) []benchSideSpec {
	p := &benchPeers{log: log}
	b.Cleanup(func() {
		if err := p.unmount(); err != nil {
			b.Errorf("unmount the peers: %v", err)
		}
	})
	sides := []benchSideSpec{
		p.mountLoopback(b, base),
		p.mountOverlay(b, base, cfg.overlayLower),
		p.mountFuseOverlay(b, base, cfg.overlayLower),
		p.mountPassthroughLL(b, base),
	}
	if cfg.floor {
		sides = append(sides, p.mountFloor(b, base, sideFloor), p.mountFloor(b, base, sideFloorBridge))
	}
	for _, side := range sides {
		if side.skip != "" {
			// go test prints a benchmark's skip reason only under -v.
			log.Warn("a peer cannot run here; its sub-benchmark is skipped", "side", side.name, "reason", side.skip)
		}
	}
	return sides
}

// unmount tears the peers down in reverse mount order and returns every
// failure.
func (p *benchPeers) unmount() error {
	var errs []error
	for i := len(p.teardown) - 1; i >= 0; i-- {
		errs = append(errs, p.teardown[i]())
	}
	return errors.Join(errs...)
}

// mountLoopback mounts go-fuse's loopback of <base>/loopback-backing at
// <base>/loopback. Setup writes into the backing directory, as it does
// for the mount.
func (p *benchPeers) mountLoopback(b *testing.B, base string) benchSideSpec {
	b.Helper()
	backingRoot := filepath.Join(base, "loopback-backing")
	mnt := filepath.Join(base, "loopback")
	side := benchSideSpec{
		name:    sideLoopback,
		dir:     filepath.Join(mnt, benchVolPath),
		backing: filepath.Join(backingRoot, benchVolPath),
	}
	benchMkdirs(b, side.backing, mnt)
	root, err := gofs.NewLoopbackRoot(backingRoot)
	if err != nil {
		b.Fatal(fmt.Errorf("failed to make a loopback root of %q: %w", backingRoot, err))
	}
	// No options at all (nil): go-fuse's defaults, which are what a user
	// of fs.Mount gets: 1 s entry and attribute timeouts, no negative
	// entry cache, AllowOther off, READDIRPLUS, no passthrough, mounted
	// through fusermount. Nothing more is needed to mount as root (this
	// process is root and uses the mount itself).
	server, err := gofs.Mount(mnt, root, nil)
	if err != nil {
		side.skip = fmt.Sprintf("go-fuse's loopback cannot be mounted at %q: %v", mnt, err)
		return side
	}
	p.teardown = append(p.teardown, func() error { return unmountPeer(p.log, mnt, server.Unmount) })
	return side
}

// mountOverlay mounts kernel overlayfs at <base>/overlay, with its lower,
// upper and work directories beside it on the same filesystem. The lower
// directory is empty unless fillLower puts files in it. Setup writes
// through the merged directory: overlayfs does not allow changes to its
// upper directory while mounted.
func (p *benchPeers) mountOverlay(b *testing.B, base string, fillLower func(dir string) error) benchSideSpec {
	b.Helper()
	lower := filepath.Join(base, "overlay-lower")
	upper := filepath.Join(base, "overlay-upper")
	work := filepath.Join(base, "overlay-work")
	merged := filepath.Join(base, "overlay")
	side := benchSideSpec{name: sideOverlay, dir: filepath.Join(merged, benchVolPath)}
	side.backing = side.dir
	benchMkdirs(b, lower, upper, work, merged)
	if fillLower != nil {
		dir := filepath.Join(lower, benchVolPath)
		benchMkdirs(b, dir)
		if err := fillLower(dir); err != nil {
			b.Fatal(fmt.Errorf("failed to fill the overlay's lower directory %q: %w", dir, err))
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		side.skip = fmt.Sprintf("kernel overlayfs cannot be mounted at %q (%s): %v", merged, opts, err)
		return side
	}
	p.teardown = append(p.teardown, func() error {
		return unmountPeer(p.log, merged, func() error { return unix.Unmount(merged, 0) })
	})
	benchMkdirs(b, side.dir)
	return side
}

// mountFuseOverlay mounts Debian's fuse-overlayfs at <base>/fuse-overlayfs
// with lower, upper and work directories beside it on the same
// filesystem, laid out as mountOverlay's, in a process of its own with
// its defaults. Setup writes through the merged directory: fuse-overlayfs
// keeps what it read of its layers in memory, and would not see a file
// put in its upper directory behind its back.
func (p *benchPeers) mountFuseOverlay(b *testing.B, base string, fillLower func(dir string) error) benchSideSpec {
	b.Helper()
	lower := filepath.Join(base, "fuse-overlayfs-lower")
	upper := filepath.Join(base, "fuse-overlayfs-upper")
	work := filepath.Join(base, "fuse-overlayfs-work")
	merged := filepath.Join(base, sideFuseOverlay)
	side := benchSideSpec{name: sideFuseOverlay, dir: filepath.Join(merged, benchVolPath)}
	side.backing = side.dir
	tool, err := exec.LookPath("fuse-overlayfs")
	if err != nil {
		side.skip = fmt.Sprintf("fuse-overlayfs is missing (Debian's fuse-overlayfs package): %v", err)
		return side
	}
	benchMkdirs(b, lower, upper, work, merged)
	if fillLower != nil {
		dir := filepath.Join(lower, benchVolPath)
		benchMkdirs(b, dir)
		if err := fillLower(dir); err != nil {
			b.Fatal(fmt.Errorf("failed to fill fuse-overlayfs's lower directory %q: %w", dir, err))
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := p.startPeer(sideFuseOverlay, merged, exec.Command(tool, "-f", "-o", opts, merged)); err != nil {
		side.skip = err.Error()
		return side
	}
	benchMkdirs(b, side.dir)
	return side
}

// passthroughLLSource is where Debian's libfuse3-dev ships the example
// (gzipped in some releases: passthroughLLBinary takes either).
const passthroughLLSource = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c"

// mountPassthroughLL mounts libfuse's passthrough_ll example of
// <base>/passthrough_ll-backing at <base>/passthrough_ll, in a process of
// its own with the example's defaults (multi-threaded, 1 s entry and
// attribute timeouts, no writeback cache, no xattrs). Setup writes into
// the backing directory, as it does for the loopback: passthrough_ll
// looks every name up in it.
func (p *benchPeers) mountPassthroughLL(b *testing.B, base string) benchSideSpec {
	b.Helper()
	backingRoot := filepath.Join(base, "passthrough_ll-backing")
	mnt := filepath.Join(base, sidePassthroughLL)
	side := benchSideSpec{
		name:    sidePassthroughLL,
		dir:     filepath.Join(mnt, benchVolPath),
		backing: filepath.Join(backingRoot, benchVolPath),
	}
	tool, skip := passthroughLLBinary()
	if skip != "" {
		side.skip = skip
		return side
	}
	benchMkdirs(b, side.backing, mnt)
	if err := p.startPeer(sidePassthroughLL, mnt, exec.Command(tool, "-f", "-o", "source="+backingRoot, mnt)); err != nil {
		side.skip = err.Error()
	}
	return side
}

// peerTools holds what the peers built for this process
// (passthrough_ll), removed by cleanupPeerTools.
var peerTools struct {
	once sync.Once
	dir  string
	// passthroughLL is the built binary; skip, if set, says why there
	// is none.
	passthroughLL, skip string
}

// passthroughLLBinary builds libfuse3-dev's passthrough_ll.c once per
// process into a temporary directory, with the C compiler and
// pkg-config's flags for fuse3, and returns the binary's path, or why it
// cannot be had here.
func passthroughLLBinary() (path, skip string) {
	peerTools.once.Do(func() {
		peerTools.passthroughLL, peerTools.skip = buildPassthroughLL()
	})
	return peerTools.passthroughLL, peerTools.skip
}

func buildPassthroughLL() (path, skip string) {
	for _, tool := range []string{"cc", "pkg-config"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", fmt.Sprintf("passthrough_ll cannot be built: %s is missing: %v", tool, err)
		}
	}
	flags, err := exec.Command("pkg-config", "--cflags", "--libs", "fuse3").Output()
	if err != nil {
		return "", fmt.Sprintf("passthrough_ll cannot be built: pkg-config knows no fuse3 (Debian's libfuse3-dev package): %v", err)
	}
	dir, err := os.MkdirTemp("", "allocfs-peers-")
	if err != nil {
		return "", fmt.Sprintf("passthrough_ll cannot be built: %v", err)
	}
	peerTools.dir = dir
	examples := filepath.Dir(passthroughLLSource)
	// The example includes passthrough_helpers.h from beside it.
	for _, name := range []string{filepath.Base(passthroughLLSource), "passthrough_helpers.h"} {
		if err := copyMaybeGzipped(filepath.Join(examples, name), filepath.Join(dir, name)); err != nil {
			return "", fmt.Sprintf("passthrough_ll cannot be built: libfuse3-dev's example source is missing: %v", err)
		}
	}
	path = filepath.Join(dir, "passthrough_ll")
	args := append([]string{"-Wall", "-O2", "-o", path, filepath.Join(dir, filepath.Base(passthroughLLSource))}, strings.Fields(string(flags))...)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		return "", fmt.Sprintf("passthrough_ll cannot be built: cc %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return path, ""
}

// copyMaybeGzipped copies src, or src.gz uncompressed where only that is
// there, to dst.
func copyMaybeGzipped(src, dst string) error {
	var r io.Reader
	f, err := os.Open(src)
	if errors.Is(err, os.ErrNotExist) {
		if f, err = os.Open(src + ".gz"); err != nil {
			return err
		}
		defer f.Close()
		if r, err = gzip.NewReader(f); err != nil {
			return fmt.Errorf("%s.gz: %w", src, err)
		}
	} else if err != nil {
		return err
	} else {
		defer f.Close()
		r = f
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// cleanupPeerTools removes what passthroughLLBinary built; TestMain
// calls it once every benchmark has ended.
func cleanupPeerTools() {
	if peerTools.dir != "" {
		os.RemoveAll(peerTools.dir)
	}
}

// peerMountWait bounds how long a peer's process takes to mount.
const peerMountWait = 10 * time.Second

// peerExitWait bounds how long a peer's process takes to exit once its
// mount is gone, before it is killed.
const peerExitWait = 5 * time.Second

// startPeer starts cmd, a FUSE server that mounts at mnt and serves in
// the foreground, waits until its mount shows in /proc/self/mountinfo,
// and registers its teardown: unmount, then wait for the process to end,
// killing it by its PID if it does not. It returns why the peer cannot
// run here, with the server's output, if it never mounted.
func (p *benchPeers) startPeer(name, mnt string, cmd *exec.Cmd) error {
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s cannot start: %w", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() error {
		select {
		case err := <-exited:
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		case <-time.After(peerExitWait):
		}
		p.log.Warn("a peer's server did not exit after its unmount; killing it", "side", name, "pid", cmd.Process.Pid)
		if err := cmd.Process.Kill(); err != nil {
			return fmt.Errorf("%s (pid %d) did not exit, and could not be killed: %w", name, cmd.Process.Pid, err)
		}
		<-exited
		return nil
	}
	deadline := time.Now().Add(peerMountWait)
	for {
		if mounted, err := fuseMountedAt(mnt); err != nil || mounted {
			if err != nil {
				return errors.Join(err, cmd.Process.Kill(), stop())
			}
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("%s exited without mounting %q: %v\n%s", name, mnt, err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			err := fmt.Errorf("%s did not mount %q within %v:\n%s", name, mnt, peerMountWait, out.String())
			return errors.Join(err, cmd.Process.Kill(), stop())
		}
	}
	p.teardown = append(p.teardown, func() error {
		err := unmountPeer(p.log, mnt, func() error { return unix.Unmount(mnt, 0) })
		if serr := stop(); serr != nil {
			p.log.Warn("a peer's server ended badly", "side", name, "error", serr, "output", out.String())
		}
		return err
	})
	return nil
}

// fuseMountedAt reports whether a FUSE filesystem is mounted at dir.
func fuseMountedAt(dir string) (bool, error) {
	mounts, err := mountinfo.Read("")
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.MountPoint == dir && strings.HasPrefix(m.FSType, "fuse") {
			return true, nil
		}
	}
	return false, nil
}

// lockedBuffer collects a peer's output, which its reader goroutine
// writes while a failure message may read it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A peer that logs without end must not fill the memory of a long run.
	if l.buf.Len() > 64<<10 {
		return len(p), nil
	}
	return l.buf.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// mountFloor mounts a no-op server at <base>/<name>: the raw one
// (rawFloor) for sideFloor, the bridge-based one (floorNode) for
// sideFloorBridge. Setup goes through the mount, as there is nothing
// behind it.
func (p *benchPeers) mountFloor(b *testing.B, base, name string) benchSideSpec {
	b.Helper()
	mnt := filepath.Join(base, name)
	side := benchSideSpec{name: name, dir: filepath.Join(mnt, benchVolPath)}
	side.backing = side.dir
	benchMkdirs(b, mnt)
	var served requestTally
	side.served = served.n.Load
	serve := func(*transport.Conn) fuse.RawFileSystem { return newFloorRaw() }
	if name == sideFloorBridge {
		serve = func(conn *transport.Conn) fuse.RawFileSystem { return newFloorBridge(p.log, conn, newFloorRoot()) }
	}
	server, err := mountFloorServer(p.log, mnt, name, serve, &served)
	if err != nil {
		side.skip = err.Error()
		return side
	}
	p.teardown = append(p.teardown, func() error { return unmountPeer(p.log, mnt, stopFloorServer(server)) })
	benchMkdirs(b, side.dir)
	return side
}

// newFloorRaw is the true floor with the timeouts of the allocfs mount.
func newFloorRaw() *rawFloor {
	mo := DefaultMountOptions()
	return newRawFloor(mo.StableTimeout, mo.StableTimeout, mo.NegativeTimeout)
}

// newFloorBridge serves the floorNode tree root on conn through go-fuse's
// node bridge with the timeouts of the allocfs mount, and the opendir
// flags the raw floor and the mount answer (floorListings).
func newFloorBridge(log hclog.Logger, conn *transport.Conn, root *floorNode) fuse.RawFileSystem {
	mo := DefaultMountOptions()
	return floorListings{gofs.NewNodeFS(root, &gofs.Options{
		EntryTimeout:    &mo.StableTimeout,
		AttrTimeout:     &mo.StableTimeout,
		NegativeTimeout: &mo.NegativeTimeout,
		NullPermissions: true,
		ServerCallbacks: conn,
		Logger:          log.Named(sideFloorBridge).StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	})}
}

// floorListings has the kernel keep the bridge floor's listings, as it
// keeps the mount's and the raw floor's, so that the two floors differ by
// the bridge alone.
type floorListings struct{ fuse.RawFileSystem }

func (f floorListings) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := f.RawFileSystem.OpenDir(cancel, in, out)
	if st.Ok() {
		out.OpenFlags |= rawFloorOpendirFlags
	}
	return st
}

// mountFloorServer mounts what serve makes at mnt with the kernel-visible
// options of the allocfs mount (NewMount), so that the kernel sends a
// floor the requests it sends the mount: default_permissions (which makes every
// create ask for the parent's attributes), 1 MiB writes,
// READDIRPLUS_AUTO, and the same transport (allocfs's own loop, over
// io_uring where the mount would be). It differs where allocfs has work
// the floor does not: no passthrough (the floor has no backing files, so
// 4 KiB writes are WRITE requests) and no HANDLE_KILLPRIV_V2 (the floor
// has no privileges to drop).
func mountFloorServer(log hclog.Logger, mnt, name string, serve func(*transport.Conn) fuse.RawFileSystem, obs transport.Observer) (*transport.Conn, error) {
	conn, err := transport.Mount(mnt, transport.Options{
		FsName:             name,
		Subtype:            "allocfs-" + name,
		AllowOther:         os.Geteuid() == 0,
		DefaultPermissions: true,
		MaxWrite:           1 << 20,
		Capabilities:       mountCapabilities &^ (fuse.CAP_PASSTHROUGH | capHandleKillprivV2),
		IOUring:            benchIOUring(),
		Logger:             log.Named(name),
		Observer:           obs,
	})
	if err != nil {
		return nil, fmt.Errorf("the no-op FUSE server %s cannot be mounted at %q: %w", name, mnt, err)
	}
	if err := conn.Serve(serve(conn)); err != nil {
		return nil, errors.Join(fmt.Errorf("the no-op FUSE server %s cannot serve %q: %w", name, mnt, err), unix.Unmount(mnt, unix.MNT_DETACH), conn.Wait())
	}
	return conn, nil
}

// requestTally counts the requests a server answered.
type requestTally struct{ n atomic.Uint64 }

func (t *requestTally) Request(uint32, time.Duration, syscall.Errno) { t.n.Add(1) }

// stopFloorServer unmounts the no-op server and waits for its loop.
func stopFloorServer(conn *transport.Conn) func() error {
	return func() error {
		if err := conn.Unmount(); err != nil {
			return err
		}
		return conn.Wait()
	}
}

// peerUnmountTries is how often a peer's unmount is tried before it is
// detached lazily: a file the kernel has not released yet (RELEASE is
// asynchronous) keeps a mount busy for a moment.
const peerUnmountTries = 5

// unmountPeer unmounts the peer at dir with unmount, retrying while it is
// busy, and detaches it lazily only when every try failed. It returns an
// error only when the mount could not be removed at all.
func unmountPeer(log hclog.Logger, dir string, unmount func() error) error {
	var err error
	for try := 0; try < peerUnmountTries; try++ {
		if err = unmount(); err == nil {
			return nil
		}
		time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
	}
	if lerr := unix.Unmount(dir, unix.MNT_DETACH); lerr != nil {
		return errors.Join(fmt.Errorf("failed to unmount %q: %w", dir, err), fmt.Errorf("lazy unmount of %q: %w", dir, lerr))
	}
	log.Warn("a peer could not be unmounted; detached it lazily", "dir", dir, "error", err)
	return nil
}

func benchMkdirs(b *testing.B, dirs ...string) {
	b.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
}

// floorNode is a file or directory of the no-op server: its handlers do
// nothing but answer, so what a workload costs on it is what the kernel
// and /dev/fuse cost. Nodes live in go-fuse's tree as persistent inodes:
// a LOOKUP is answered from the parent's children (go-fuse does that for
// a node without a Lookup method), and when the kernel forgets a node the
// daemon keeps it, so "cold" means the kernel's caches only. A write
// stores nothing and only moves the size.
type floorNode struct {
	gofs.Inode
	mu   sync.Mutex
	mode uint32
	size uint64
}

func newFloorRoot() *floorNode { return &floorNode{mode: syscall.S_IFDIR | 0o755} }

// floorOpenFlags spare the kernel a FLUSH on every close (there is
// nothing to flush), as the mount's passthrough handles do.
const floorOpenFlags = fuse.FOPEN_NOFLUSH

func (n *floorNode) fill(out *fuse.Attr) {
	n.mu.Lock()
	defer n.mu.Unlock()
	out.Mode = n.mode
	out.Size = n.size
	out.Nlink = 1
	if n.mode&syscall.S_IFMT == syscall.S_IFDIR {
		out.Nlink = 2
	}
}

func (n *floorNode) newChild(ctx context.Context, mode uint32, out *fuse.EntryOut) *gofs.Inode {
	child := &floorNode{mode: mode}
	child.fill(&out.Attr)
	return n.NewPersistentInode(ctx, child, gofs.StableAttr{Mode: mode & syscall.S_IFMT})
}

var _ = (gofs.NodeGetattrer)((*floorNode)(nil))

func (n *floorNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.fill(&out.Attr)
	return gofs.OK
}

var _ = (gofs.NodeSetattrer)((*floorNode)(nil))

func (n *floorNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	n.mu.Lock()
	if size, ok := in.GetSize(); ok {
		n.size = size
	}
	if mode, ok := in.GetMode(); ok {
		n.mode = n.mode&syscall.S_IFMT | mode&0o7777
	}
	n.mu.Unlock()
	n.fill(&out.Attr)
	return gofs.OK
}

var _ = (gofs.NodeCreater)((*floorNode)(nil))

func (n *floorNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if n.GetChild(name) != nil {
		return nil, nil, 0, syscall.EEXIST
	}
	return n.newChild(ctx, syscall.S_IFREG|mode&0o7777, out), nil, floorOpenFlags, gofs.OK
}

var _ = (gofs.NodeMkdirer)((*floorNode)(nil))

func (n *floorNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if n.GetChild(name) != nil {
		return nil, syscall.EEXIST
	}
	return n.newChild(ctx, syscall.S_IFDIR|mode&0o7777, out), gofs.OK
}

var _ = (gofs.NodeOpener)((*floorNode)(nil))

func (n *floorNode) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	return nil, floorOpenFlags, gofs.OK
}

var _ = (gofs.NodeWriter)((*floorNode)(nil))

func (n *floorNode) Write(ctx context.Context, f gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if end := uint64(off) + uint64(len(data)); end > n.size {
		n.size = end
	}
	return uint32(len(data)), gofs.OK
}

// Unlink and Rmdir only answer: go-fuse drops the child from the tree
// when they succeed.
var _ = (gofs.NodeUnlinker)((*floorNode)(nil))

func (n *floorNode) Unlink(ctx context.Context, name string) syscall.Errno { return gofs.OK }

var _ = (gofs.NodeRmdirer)((*floorNode)(nil))

func (n *floorNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if c := n.GetChild(name); c != nil && len(c.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	return gofs.OK
}

// parseBenchOrder reads ALLOCFS_BENCH_ORDER: how many places to rotate
// the sides (native, mount, loopback, overlay, fuse-overlayfs,
// passthrough_ll, floor, floor-bridge) before running
// them, so that rounds can take turns at which side goes first.
// "native-first" (or unset) is rotate-0, "mount-first" rotate-1.
func parseBenchOrder(s string) (int, error) {
	switch s {
	case "", "native-first":
		return 0, nil
	case "mount-first":
		return 1, nil
	}
	v, ok := strings.CutPrefix(s, "rotate-")
	if !ok {
		return 0, fmt.Errorf("ALLOCFS_BENCH_ORDER=%q: want native-first, mount-first or rotate-N", s)
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("ALLOCFS_BENCH_ORDER=%q: N of rotate-N must be a number 0 or more", s)
	}
	return n, nil
}

// rotated returns a copy of sides rotated left by n places.
func rotated[T any](sides []T, n int) []T {
	out := make([]T, 0, len(sides))
	if len(sides) == 0 {
		return out
	}
	n %= len(sides)
	return append(append(out, sides[n:]...), sides[:n]...)
}

// TestParseBenchOrder checks the orders ALLOCFS_BENCH_ORDER takes and
// that a bad one is refused with no rotation.
func TestParseBenchOrder(t *testing.T) {
	for in, want := range map[string]int{"": 0, "native-first": 0, "mount-first": 1, "rotate-0": 0, "rotate-3": 3, "rotate-12": 12} {
		if got, err := parseBenchOrder(in); err != nil || got != want {
			t.Errorf("parseBenchOrder(%q) = %d, %v; want %d, nil", in, got, err, want)
		}
	}
	for _, in := range []string{"mount", "rotate-", "rotate--1", "rotate-x", "rotate-1.5", " rotate-1", "Mount-First"} {
		got, err := parseBenchOrder(in)
		if err == nil || got != 0 {
			t.Errorf("parseBenchOrder(%q) = %d, %v; want 0 and an error", in, got, err)
		}
	}
}

// TestRotated checks that every rotation keeps every side once, puts
// side n first, and leaves its input alone.
func TestRotated(t *testing.T) {
	in := []string{sideNative, sideMount, sideLoopback, sideOverlay, sideFuseOverlay, sidePassthroughLL, sideFloor, sideFloorBridge}
	orig := append([]string(nil), in...)
	for n := 0; n < 2*len(in); n++ {
		got := rotated(in, n)
		if len(got) != len(in) {
			t.Fatalf("rotated(%d) = %v: %d sides, want %d", n, got, len(got), len(in))
		}
		for i := range got {
			if want := in[(n+i)%len(in)]; got[i] != want {
				t.Errorf("rotated(%d)[%d] = %q, want %q", n, i, got[i], want)
			}
		}
	}
	if strings.Join(in, ",") != strings.Join(orig, ",") {
		t.Errorf("rotated changed its input: %v, was %v", in, orig)
	}
	if got := rotated([]string(nil), 3); len(got) != 0 {
		t.Errorf("rotated(nil, 3) = %v, want empty", got)
	}
}

// TestFloorServers checks that both no-op servers behave like a
// filesystem as far as the benchmarks use them, in the kernel's view and
// in the daemon's: creates and mkdirs show up in lookups and listings
// (those with attributes too, which the floors answer to READDIRPLUS), a
// write moves the size and nothing else, a refused create, unlink or
// rmdir changes nothing, and removals empty the tree. (That the nodes
// outlive the kernel's caches is what StatCold on the floors exercises:
// its lstats fail otherwise. A test does not drop the machine's caches
// under others' measurements.)
func TestFloorServers(t *testing.T) {
	fstest.RequireFUSE(t)
	log := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: os.Stderr})
	want := map[string]floorWant{"a": {syscall.S_IFREG | 0o640, 4096}, "b": {syscall.S_IFREG | 0o600, 13}}

	t.Run(sideFloor, func(t *testing.T) {
		raw := newFloorRaw()
		mnt := mountTestFloor(t, log, func(*transport.Conn) fuse.RawFileSystem { return raw })
		dir := exerciseFloor(t, mnt, want)
		raw.mu.Lock()
		root := raw.nodes[fuse.FUSE_ROOT_ID]
		id := root.slots[root.index["d"]].id
		d := raw.nodes[id]
		if len(root.index) != 1 || d == nil {
			t.Fatalf("the daemon's root has %v, want only d", root.index)
		}
		if d.mode != syscall.S_IFDIR|0o750 {
			t.Errorf("the daemon has d at mode %o, want %o", d.mode, syscall.S_IFDIR|0o750)
		}
		if len(d.index) != len(want) {
			t.Errorf("the daemon's d has %d entries, want %d", len(d.index), len(want))
		}
		for name, w := range want {
			slot, ok := d.index[name]
			if !ok {
				t.Errorf("%s: not in the daemon's d", name)
				continue
			}
			if n := raw.nodes[d.slots[slot].id]; n.mode != w.mode || n.size != w.size {
				t.Errorf("%s: the daemon has mode %o and size %d, want %o and %d", name, n.mode, n.size, w.mode, w.size)
			}
		}
		raw.mu.Unlock()

		must(t, os.RemoveAll(dir))
		if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after RemoveAll: %v, want not exist", err)
		}
		raw.mu.Lock()
		defer raw.mu.Unlock()
		if len(root.index) != 0 {
			t.Errorf("after RemoveAll the daemon's root has %v, want nothing", root.index)
		}
		// What is left besides the root are removed nodes the kernel has
		// not forgotten yet.
		for id, n := range raw.nodes {
			if id != fuse.FUSE_ROOT_ID && (n.linked || n.nlookup == 0) {
				t.Errorf("after RemoveAll the daemon keeps node %d (linked %v, %d lookups)", id, n.linked, n.nlookup)
			}
		}
	})

	t.Run(sideFloorBridge, func(t *testing.T) {
		root := newFloorRoot()
		mnt := mountTestFloor(t, log, func(conn *transport.Conn) fuse.RawFileSystem { return newFloorBridge(log, conn, root) })
		dir := exerciseFloor(t, mnt, want)
		d := root.GetChild("d")
		if d == nil || len(root.Children()) != 1 {
			t.Fatalf("the daemon's root has %v, want only d", root.Children())
		}
		if n := d.Operations().(*floorNode); n.mode != syscall.S_IFDIR|0o750 {
			t.Errorf("the daemon has d at mode %o, want %o", n.mode, syscall.S_IFDIR|0o750)
		}
		if len(d.Children()) != len(want) {
			t.Errorf("the daemon's d has %d children, want %d", len(d.Children()), len(want))
		}
		for name, w := range want {
			c := d.GetChild(name)
			if c == nil {
				t.Errorf("%s: not in the daemon's tree", name)
				continue
			}
			n := c.Operations().(*floorNode)
			if n.mode != w.mode || n.size != w.size {
				t.Errorf("%s: the daemon has mode %o and size %d, want %o and %d", name, n.mode, n.size, w.mode, w.size)
			}
		}
		must(t, os.RemoveAll(dir))
		if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after RemoveAll: %v, want not exist", err)
		}
		if len(root.Children()) != 0 {
			t.Errorf("after RemoveAll the daemon's root has %v, want nothing", root.Children())
		}
	})
}

type floorWant struct {
	mode uint32
	size uint64
}

// mountTestFloor mounts what serve makes in a temporary directory for t,
// unmounted when t ends.
func mountTestFloor(t *testing.T, log hclog.Logger, serve func(*transport.Conn) fuse.RawFileSystem) string {
	t.Helper()
	mnt := t.TempDir()
	server, err := mountFloorServer(log, mnt, "floor-test", serve, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmountPeer(log, mnt, stopFloorServer(server)); err != nil {
			t.Error(err)
		}
	})
	return mnt
}

// exerciseFloor makes <mnt>/d with the files of want, tries the changes a
// floor must refuse, checks the kernel's view of d by path and by
// listing, and returns d.
func exerciseFloor(t *testing.T, mnt string, want map[string]floorWant) string {
	t.Helper()
	dir := filepath.Join(mnt, "d")
	must(t, os.Mkdir(dir, 0o750))
	must(t, os.WriteFile(filepath.Join(dir, "a"), make([]byte, 4096), 0o640))
	f, err := os.OpenFile(filepath.Join(dir, "b"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	must(t, err)
	if _, err := f.WriteAt([]byte("xyz"), 10); err != nil {
		t.Fatal(err)
	}
	must(t, f.Close())

	// Bad inputs: an exclusive create of an existing name, an rmdir of a
	// directory that is not empty and of a file, an unlink of a
	// directory and of a name that is not there.
	if _, err := os.OpenFile(filepath.Join(dir, "a"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("exclusive create of an existing file: %v, want EEXIST", err)
	}
	if err := unix.Rmdir(dir); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("rmdir of a directory with files: %v, want ENOTEMPTY", err)
	}
	if err := unix.Rmdir(filepath.Join(dir, "a")); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("rmdir of a file: %v, want ENOTDIR", err)
	}
	if err := unix.Unlink(dir); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("unlink of a directory: %v, want EISDIR", err)
	}
	if err := unix.Unlink(filepath.Join(dir, "c")); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("unlink of a missing name: %v, want ENOENT", err)
	}

	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		t.Errorf("%d entries in %q, want %d", len(entries), dir, len(want))
	}
	for _, e := range entries {
		if _, ok := want[e.Name()]; !ok {
			t.Errorf("%q lists %q", dir, e.Name())
		} else if !e.Type().IsRegular() {
			t.Errorf("%s: listed as type %v, want a regular file", e.Name(), e.Type())
		}
	}
	// Listed and stat'ed as ls -l does, so that the kernel asks for the
	// next batches with attributes.
	if err := listEntries(dir, true, len(want)); err != nil {
		t.Error(err)
	}
	for name, w := range want {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Error(err)
		} else if st.Mode != w.mode || uint64(st.Size) != w.size {
			t.Errorf("%s: the kernel says mode %o and size %d, want %o and %d", name, st.Mode, st.Size, w.mode, w.size)
		}
	}

	// A listing of many READDIR batches, before and after every other
	// entry is removed, both as names alone and as ls -l would: each
	// batch must go on where the last one ended.
	many := filepath.Join(mnt, "many")
	must(t, os.Mkdir(many, 0o755))
	const n = 1000
	must(t, makeFiles(many, n, 1))
	for _, lstat := range []bool{false, true} {
		if err := listEntries(many, lstat, n); err != nil {
			t.Error(err)
		}
	}
	for i := 0; i < n; i += 2 {
		must(t, os.Remove(filepath.Join(many, benchName(i))))
	}
	for _, lstat := range []bool{false, true} {
		if err := listEntries(many, lstat, n/2); err != nil {
			t.Error(err)
		}
	}
	must(t, os.RemoveAll(many))
	return dir
}

// TestRawFloorForget checks that the raw floor keeps a node while it has
// a name or the kernel holds a lookup of it, and only then.
func TestRawFloorForget(t *testing.T) {
	f := newFloorRaw()
	var out fuse.CreateOut
	in := &fuse.CreateIn{InHeader: fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, Mode: 0o644}
	if st := f.Create(nil, in, "a", &out); !st.Ok() {
		t.Fatalf("create: %v", st)
	}
	id := out.NodeId
	var e fuse.EntryOut
	if st := f.Lookup(nil, &fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, "a", &e); !st.Ok() || e.NodeId != id {
		t.Fatalf("lookup: %v, node %d; want OK, node %d", st, e.NodeId, id)
	}
	f.Forget(id, 2) // what the kernel got from CREATE and LOOKUP
	if f.nodes[id] == nil {
		t.Fatal("a forgotten node that still has a name was dropped")
	}
	if st := f.Lookup(nil, &fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, "a", &e); !st.Ok() || e.NodeId != id {
		t.Fatalf("lookup after forget: %v, node %d; want OK, node %d", st, e.NodeId, id)
	}
	if st := f.Unlink(nil, &fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, "a"); !st.Ok() {
		t.Fatalf("unlink: %v", st)
	}
	if f.nodes[id] == nil {
		t.Fatal("an unlinked node the kernel still holds was dropped")
	}
	if st := f.Lookup(nil, &fuse.InHeader{NodeId: fuse.FUSE_ROOT_ID}, "a", &e); !st.Ok() || e.NodeId != 0 {
		t.Fatalf("lookup after unlink: %v, node %d; want a negative entry", st, e.NodeId)
	}
	f.Forget(id, 1)
	if f.nodes[id] != nil {
		t.Fatal("an unlinked, forgotten node was kept")
	}
	f.Forget(fuse.FUSE_ROOT_ID, 1)
	if f.nodes[fuse.FUSE_ROOT_ID] == nil {
		t.Fatal("the root was dropped")
	}
}
