package fs

// The peers of the mount-versus-native benchmarks: every
// benchmark of bench_test.go also runs its workload on go-fuse's own
// loopback ("loopback") and on kernel overlayfs ("overlay"), and the
// metadata benchmarks on a FUSE server whose handlers only answer
// ("floor"), all in the same run, so that each row of `make bench` shows
// the mount beside what a plain FUSE filesystem and an in-kernel layered
// one do on the same disk, and beside what the transport alone costs.

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Side names: the sub-benchmarks of every benchmark, in the order that
// ALLOCFS_BENCH_ORDER=rotate-0 runs them.
const (
	sideNative   = "native"
	sideMount    = "mount"
	sideLoopback = "loopback"
	sideOverlay  = "overlay"
	sideFloor    = "floor"
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
	// floor's setup goes through its mount, so its counts would mix
	// setup with the workload.
	counts func() map[string]uint64
	// served, where set, counts the requests the side's server answered
	// (the floor's), for quietSide; the mount's come from counts.
	served func() uint64
}

// benchConfig says what a benchmark needs beyond native and mount.
type benchConfig struct {
	// floor adds the no-op FUSE server as a side (metadata benchmarks).
	floor bool
	// overlayLower, if set, fills the overlay's lower directory at
	// benchVolPath before the overlay is mounted; a file overlayfs is to
	// show from its lower layer must be there before the mount, as
	// overlayfs does not allow changes to its layers while mounted.
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
	sides := []benchSideSpec{p.mountLoopback(b, base), p.mountOverlay(b, base, cfg.overlayLower)}
	if cfg.floor {
		sides = append(sides, p.mountFloor(b, base))
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

// mountFloor mounts the no-op server (floorNode) at <base>/floor. Setup
// goes through the mount, as there is nothing behind it.
func (p *benchPeers) mountFloor(b *testing.B, base string) benchSideSpec {
	b.Helper()
	mnt := filepath.Join(base, "floor")
	side := benchSideSpec{name: sideFloor, dir: filepath.Join(mnt, benchVolPath)}
	side.backing = side.dir
	benchMkdirs(b, mnt)
	var served requestTally
	side.served = served.n.Load
	server, err := mountFloorServer(p.log, mnt, newFloorRoot(), &served)
	if err != nil {
		side.skip = err.Error()
		return side
	}
	p.teardown = append(p.teardown, func() error { return unmountPeer(p.log, mnt, stopFloorServer(server)) })
	benchMkdirs(b, side.dir)
	return side
}

// mountFloorServer mounts a floorNode tree at mnt with the kernel-visible
// options of the allocfs mount (NewMount), so that the kernel sends the
// floor the requests it sends the mount: default_permissions (which makes
// every create ask for the parent's attributes), the same entry, attribute
// and negative timeouts, 1 MiB writes, READDIRPLUS_AUTO, and the same
// transport (allocfs's own loop, over io_uring where the mount would be).
// It differs where allocfs has work the floor does not: no passthrough (the
// floor has no backing files, so 4 KiB writes are WRITE requests) and no
// HANDLE_KILLPRIV_V2 (the floor has no privileges to drop).
func mountFloorServer(log hclog.Logger, mnt string, root *floorNode, obs transport.Observer) (*transport.Conn, error) {
	mo := DefaultMountOptions()
	conn, err := transport.Mount(mnt, transport.Options{
		FsName:             "floor",
		Subtype:            "allocfs-floor",
		AllowOther:         os.Geteuid() == 0,
		DefaultPermissions: true,
		MaxWrite:           1 << 20,
		Capabilities:       mountCapabilities &^ (fuse.CAP_PASSTHROUGH | capHandleKillprivV2),
		IOUring:            benchIOUring(),
		Logger:             log.Named("floor"),
		Observer:           obs,
	})
	if err != nil {
		return nil, fmt.Errorf("the no-op FUSE server cannot be mounted at %q: %w", mnt, err)
	}
	err = conn.Serve(gofs.NewNodeFS(root, &gofs.Options{
		EntryTimeout:    &mo.StableTimeout,
		AttrTimeout:     &mo.StableTimeout,
		NegativeTimeout: &mo.NegativeTimeout,
		NullPermissions: true,
		ServerCallbacks: conn,
		Logger:          log.Named("floor").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}))
	if err != nil {
		return nil, errors.Join(fmt.Errorf("the no-op FUSE server cannot serve %q: %w", mnt, err), unix.Unmount(mnt, unix.MNT_DETACH), conn.Wait())
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
// the sides (native, mount, loopback, overlay, floor) before running
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
	in := []string{sideNative, sideMount, sideLoopback, sideOverlay, sideFloor}
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

// TestFloorServer checks that the no-op server behaves like a filesystem
// as far as the benchmarks use it, in the kernel's view and in the
// daemon's tree: creates and mkdirs show up in lookups and listings, a
// write moves the size and nothing else, a refused create or rmdir
// changes nothing, and removals empty the tree. (That the tree outlives
// the kernel's caches is what StatCold on the floor exercises: its lstats
// fail otherwise. A test does not drop the machine's caches under others'
// measurements.)
func TestFloorServer(t *testing.T) {
	fstest.RequireFUSE(t)
	mnt := t.TempDir()
	log := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: os.Stderr})
	root := newFloorRoot()
	server, err := mountFloorServer(log, mnt, root, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmountPeer(log, mnt, stopFloorServer(server)); err != nil {
			t.Error(err)
		}
	})
	dir := filepath.Join(mnt, "d")
	must(t, os.Mkdir(dir, 0o750))
	must(t, os.WriteFile(filepath.Join(dir, "a"), make([]byte, 4096), 0o640))
	f, err := os.OpenFile(filepath.Join(dir, "b"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	must(t, err)
	if _, err := f.WriteAt([]byte("xyz"), 10); err != nil {
		t.Fatal(err)
	}
	must(t, f.Close())

	// Bad inputs: an exclusive create of an existing name and an rmdir of
	// a directory that is not empty.
	if _, err := os.OpenFile(filepath.Join(dir, "a"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("exclusive create of an existing file: %v, want EEXIST", err)
	}
	if err := unix.Rmdir(dir); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Errorf("rmdir of a directory with files: %v, want ENOTEMPTY", err)
	}

	want := map[string]struct {
		mode uint32
		size uint64
	}{"a": {syscall.S_IFREG | 0o640, 4096}, "b": {syscall.S_IFREG | 0o600, 13}}
	names, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != len(want) {
		t.Errorf("%d entries in %q, want %d", len(names), dir, len(want))
	}
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
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, name), &st); err != nil {
			t.Error(err)
		} else if st.Mode != w.mode || uint64(st.Size) != w.size {
			t.Errorf("%s: the kernel says mode %o and size %d, want %o and %d", name, st.Mode, st.Size, w.mode, w.size)
		}
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
}
