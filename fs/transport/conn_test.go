package transport_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// memDir is a directory of an in-memory tree on go-fuse's node API, with
// the operations the tests need: files are go-fuse's MemRegularFile.
type memDir struct {
	gofs.Inode
}

var (
	_ = (gofs.NodeCreater)((*memDir)(nil))
	_ = (gofs.NodeMkdirer)((*memDir)(nil))
	_ = (gofs.NodeUnlinker)((*memDir)(nil))
	_ = (gofs.NodeRenamer)((*memDir)(nil))
)

func (d *memDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	// go-fuse's bridge adds the child, moves it on rename and drops it
	// on unlink: the node methods only say yes.
	f := &gofs.MemRegularFile{Attr: fuse.Attr{Mode: mode}}
	ch := d.NewPersistentInode(ctx, f, gofs.StableAttr{Mode: syscall.S_IFREG})
	out.Mode = syscall.S_IFREG | mode
	return ch, nil, 0, 0
}

func (d *memDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	ch := d.NewPersistentInode(ctx, &memDir{}, gofs.StableAttr{Mode: syscall.S_IFDIR})
	out.Mode = syscall.S_IFDIR | mode
	return ch, 0
}

func (d *memDir) Unlink(ctx context.Context, name string) syscall.Errno {
	if d.GetChild(name) == nil {
		return syscall.ENOENT
	}
	return 0
}

func (d *memDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if d.GetChild(name) == nil {
		return syscall.ENOENT
	}
	return 0
}

// serveOver mounts root with the loop, requests over io_uring or
// /dev/fuse, and returns the mount point and the connection; it checks
// that the rings were taken when asked for. The test's cleanup unmounts
// it and checks that every reader ended.
func serveOver(t *testing.T, root gofs.InodeEmbedder, ioUring bool) (string, *transport.Conn) {
	t.Helper()
	return serveObserved(t, root, ioUring, nil)
}

// serveObserved is serveOver with obs told of every request.
func serveObserved(t *testing.T, root gofs.InodeEmbedder, ioUring bool, obs transport.Observer) (string, *transport.Conn) {
	t.Helper()
	fstest.RequireFUSE(t)
	if ioUring {
		requireFUSEOverIOUring(t)
	}
	mnt := t.TempDir()
	conn, err := transport.Mount(mnt, transport.Options{
		FsName:             "transport-test",
		Subtype:            "transporttest",
		DefaultPermissions: true,
		MaxWrite:           1 << 20,
		Capabilities:       fuse.CAP_ASYNC_READ | fuse.CAP_BIG_WRITES | fuse.CAP_READDIRPLUS | fuse.CAP_PARALLEL_DIROPS | fuse.CAP_MAX_PAGES,
		IOUring:            ioUring,
		Observer:           obs,
	})
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	long := time.Hour
	if err := conn.Serve(gofs.NewNodeFS(root, &gofs.Options{EntryTimeout: &long, AttrTimeout: &long, ServerCallbacks: conn})); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if conn.IOUring() != ioUring {
		t.Errorf("requests over io_uring: %v, want %v", conn.IOUring(), ioUring)
	}
	t.Cleanup(func() {
		var err error
		for range 20 {
			if err = conn.Unmount(); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Errorf("Unmount: %v", err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		done := make(chan error, 1)
		go func() { done <- conn.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Wait: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("readers still running 10 s after the unmount")
		}
	})
	return mnt, conn
}

// TestConnServesAFilesystem runs the operations of a small tree through
// the loop: create, write, read back, list, rename, xattr errors, remove.
func TestConnServesAFilesystem(t *testing.T) {
	overBoth(t, func(t *testing.T, ring bool) {
		mnt, conn := serveOver(t, &memDir{}, ring)
		servesAFilesystem(t, mnt)
		if n := conn.RingRequests(); ring && n == 0 || !ring && n != 0 {
			t.Errorf("%d requests came over io_uring", n)
		}
	})
}

func servesAFilesystem(t *testing.T, mnt string) {
	p := filepath.Join(mnt, "f")
	big := make([]byte, 3<<20+17) // several WRITEs and READs of 1 MiB
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := os.WriteFile(p, big, 0o640); err != nil {
		t.Fatalf("write: %v", err)
	}
	got, err := os.ReadFile(p)
	if err != nil || len(got) != len(big) || string(got) != string(big) {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(big))
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Mode != unix.S_IFREG|0o640 || st.Size != int64(len(big)) {
		t.Errorf("lstat: mode %o size %d (%v)", st.Mode, st.Size, err)
	}
	// Asking for the birth time makes the kernel send STATX, whose
	// reply is the protocol's largest struct (a JVM asks so of its jar).
	var sx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &sx); err != nil || sx.Size != uint64(len(big)) {
		t.Errorf("statx with the birth time: size %d (%v)", sx.Size, err)
	}
	if err := os.Mkdir(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p, filepath.Join(mnt, "d", "g")); err != nil {
		t.Fatalf("rename: %v", err)
	}
	entries, err := os.ReadDir(filepath.Join(mnt, "d"))
	if err != nil || len(entries) != 1 || entries[0].Name() != "g" {
		t.Errorf("listing after the rename: %v (%v)", entries, err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old name after the rename: %v, want not-exist", err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(mnt, "d", "g"), "user.none", make([]byte, 16)); err == nil {
		t.Errorf("getxattr of a missing attribute succeeded")
	}
	if err := os.Remove(filepath.Join(mnt, "d", "g")); err != nil {
		t.Fatalf("unlink: %v", err)
	}
	if err := unix.Rename(filepath.Join(mnt, "missing"), filepath.Join(mnt, "x")); err != unix.ENOENT {
		t.Errorf("rename of a missing name: %v, want ENOENT", err)
	}
}

// TestConnNotifiesTheKernel changes the tree behind the kernel's cached
// entry, then drops the entry with EntryNotify: the name must go away at
// once, although its entry timeout is an hour.
func TestConnNotifiesTheKernel(t *testing.T) {
	overBoth(t, func(t *testing.T, ring bool) {
		root := &memDir{}
		mnt, conn := serveOver(t, root, ring)
		p := filepath.Join(mnt, "f")
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(p); err != nil {
			t.Fatal(err)
		}
		root.RmChild("f")
		if _, err := os.Lstat(p); err != nil {
			t.Fatalf("the kernel should still cache f: %v", err)
		}
		if st := root.NotifyEntry("f"); st != 0 {
			t.Fatalf("EntryNotify: %v", st)
		}
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after EntryNotify: %v, want not-exist", err)
		}
		if st := conn.InodeNotify(1, 0, 0); st != fuse.OK {
			t.Errorf("InodeNotify of the root: %v", st)
		}
		if st := conn.EntryNotify(1<<40, "nothing"); st == fuse.OK {
			t.Errorf("EntryNotify of an unknown parent succeeded")
		}
	})
}

// blockingFile's opens wait until release is closed.
type blockingFile struct {
	gofs.Inode
	release chan struct{}
	once    sync.Once
	entered chan struct{}
}

var _ = (gofs.NodeOpener)((*blockingFile)(nil))

func (f *blockingFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	f.once.Do(func() { close(f.entered) })
	<-f.release
	return nil, fuse.FOPEN_KEEP_CACHE, 0
}

// TestConnHandlerThatBlocksDoesNotStallTheMount: while requests'
// handlers wait, the mount keeps answering others, because a reader that
// takes a request makes sure another waits for the next, and a CPU's
// ring queue whose last free entry is taken gets another first. Every
// caller runs on CPU 0, so that over io_uring all the requests go to one
// queue, and more handlers block than a queue starts with.
func TestConnHandlerThatBlocksDoesNotStallTheMount(t *testing.T) {
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil || !cpus.IsSet(0) {
		t.Skipf("CPU 0 is not this process's to run on (%v)", err)
	}
	overBoth(t, func(t *testing.T, ring bool) {
		root := &memDir{}
		mnt, _ := serveOver(t, root, ring)
		ctx := context.Background()
		const blocked = 3
		release := make(chan struct{})
		opened := make(chan error, blocked)
		stalled := make(chan struct{})
		timer := time.AfterFunc(10*time.Second, func() { close(stalled) })
		defer timer.Stop()
		for i := range blocked {
			bf := &blockingFile{release: release, entered: make(chan struct{})}
			name := fmt.Sprintf("slow%d", i)
			root.AddChild(name, root.NewPersistentInode(ctx, bf, gofs.StableAttr{Mode: syscall.S_IFREG}), true)
			go onCPU0(t, func() {
				fd, err := unix.Open(filepath.Join(mnt, name), unix.O_RDONLY, 0)
				if err == nil {
					unix.Close(fd)
				}
				opened <- err
			})
			select {
			case <-bf.entered:
			case <-stalled:
				t.Errorf("open %d did not reach its handler while %d others block", i, i)
			}
		}
		done := make(chan struct{})
		go onCPU0(t, func() {
			defer close(done)
			for i := range 4 {
				// Each a new request while the OPENs hold theirs.
				if err := os.WriteFile(filepath.Join(mnt, fmt.Sprintf("f%d", i)), []byte("x"), 0o644); err != nil {
					t.Errorf("a write while other handlers block: %v", err)
				}
			}
		})
		select {
		case <-done:
		case <-stalled:
			t.Errorf("the writes still wait 10 s after the handlers blocked")
		}
		close(release)
		<-done
		for range blocked {
			if err := <-opened; err != nil {
				t.Errorf("a blocked open: %v", err)
			}
		}
	})
}

// onCPU0 runs fn on a thread of its own that runs on CPU 0 only; the
// thread ends with fn.
func onCPU0(t *testing.T, fn func()) {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(0)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		t.Errorf("pinning to CPU 0: %v", err)
	}
	fn()
}

// overBoth runs fn over /dev/fuse and over io_uring.
func overBoth(t *testing.T, fn func(t *testing.T, ring bool)) {
	for _, ring := range []bool{false, true} {
		name := "dev-fuse"
		if ring {
			name = "io-uring"
		}
		t.Run(name, func(t *testing.T) { fn(t, ring) })
	}
}

// panicky's lookups panic.
type panicky struct{ memDir }

var _ = (gofs.NodeLookuper)((*panicky)(nil))

func (p *panicky) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if name == "boom" {
		panic("a handler bug")
	}
	return nil, syscall.ENOENT
}

// TestConnAnswersAPanicWithEIO: a handler's panic is the one request's
// EIO; the mount keeps serving.
func TestConnAnswersAPanicWithEIO(t *testing.T) {
	overBoth(t, func(t *testing.T, ring bool) {
		mnt, _ := serveOver(t, &panicky{}, ring)
		if _, err := os.Lstat(filepath.Join(mnt, "boom")); !errors.Is(err, unix.EIO) {
			t.Errorf("lookup that panics: %v, want EIO", err)
		}
		if _, err := os.Lstat(filepath.Join(mnt, "other")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("lookup after the panic: %v, want not-exist", err)
		}
	})
}

// TestMountRefusesBadOptions: what the kernel cannot take is refused
// before anything is mounted.
func TestMountRefusesBadOptions(t *testing.T) {
	fstest.RequireFUSE(t)
	mnt := t.TempDir()
	if _, err := transport.Mount(mnt, transport.Options{MaxWrite: 2 << 20}); err == nil {
		t.Errorf("a 2 MiB max write was accepted")
	}
	if _, err := transport.Mount(filepath.Join(mnt, "missing"), transport.Options{}); err == nil {
		t.Errorf("a missing mount point was accepted")
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), mnt) {
		t.Errorf("a refused mount left %s mounted", mnt)
	}
}

// TestServeTellsTheKernelNotToPoll: by the time Serve returns, the kernel
// has had its one POLL answered ENOSYS, on the probe, so opening a file of
// the mount in this process (Go's runtime hands it to epoll) sends none:
// a POLL waiting for a reply while a garbage collection stops the world
// deadlocks a process that serves the mount it uses. The probe's name is
// gone afterwards.
func TestServeTellsTheKernelNotToPoll(t *testing.T) {
	overBoth(t, func(t *testing.T, ring bool) {
		root := &memDir{}
		mnt, conn := serveOver(t, root, ring)
		if n, node := transport.Polls(conn); n != 1 || node != transport.ProbeNode {
			t.Fatalf("after Serve: %d POLL requests, the first on node %d; want 1, on the probe (%d)", n, node, transport.ProbeNode)
		}
		if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			f, err := os.Open(filepath.Join(mnt, "f"))
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		if n, _ := transport.Polls(conn); n != 1 {
			t.Errorf("opening a file of the mount sent %d more POLL requests, want none", n-1)
		}
		if _, err := os.Lstat(filepath.Join(mnt, transport.ProbeName)); !errors.Is(err, unix.ENOENT) {
			t.Errorf("lstat of the probe after Serve: %v, want ENOENT", err)
		}
	})
}

// requireFUSEOverIOUring skips the test where this kernel and process
// cannot take FUSE requests over io_uring: the fuse module's enable_uring
// is off (.ci/run turns it on; a test does not change a machine-wide
// setting under other packages' tests), or io_uring is not allowed.
func requireFUSEOverIOUring(t testing.TB) {
	t.Helper()
	if err := transport.IOUringUsable(); err != nil {
		fstest.Lacks(t, "no FUSE over io_uring here: %v", err)
	}
}

// TestConnFallsBackWhenRingsFail: once the kernel has accepted
// FUSE_OVER_IO_URING, it holds every request until each CPU's queue has a
// ring entry. When a queue's ring cannot be set up, the loop must make the
// kernel give up on the rings, and serve over /dev/fuse.
func TestConnFallsBackWhenRingsFail(t *testing.T) {
	fstest.RequireFUSE(t)
	requireFUSEOverIOUring(t)
	transport.FailRingSetup(true)
	defer transport.FailRingSetup(false)
	mnt := t.TempDir()
	conn, err := transport.Mount(mnt, transport.Options{FsName: "transport-test", IOUring: true})
	if err != nil {
		t.Fatalf("Mount: %v", err)
	}
	served := make(chan struct{})
	go func() {
		// Serve's poll probe is the mount's first request.
		if err := conn.Serve(gofs.NewNodeFS(&memDir{}, &gofs.Options{ServerCallbacks: conn})); err != nil {
			t.Errorf("Serve: %v", err)
		}
		close(served)
	}()
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		abortConnection(t, conn, mnt)
		t.Fatalf("Serve still waits 10 s after the rings failed: the kernel still waits for them")
	}
	t.Cleanup(func() {
		if err := conn.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
		if err := conn.Wait(); err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
	if conn.Flags()&fuse.CAP_OVER_IO_URING == 0 {
		t.Fatalf("INIT did not take FUSE_OVER_IO_URING: nothing to fall back from")
	}
	if conn.IOUring() {
		t.Fatalf("requests over io_uring although queue 0 has no ring")
	}
	done := make(chan error, 1)
	go func() { done <- os.WriteFile(filepath.Join(mnt, "f"), []byte("x"), 0o644) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("a write after the fall-back: %v", err)
		}
	case <-time.After(10 * time.Second):
		abortConnection(t, conn, mnt)
		t.Fatalf("a write waits 10 s after the fall-back: the kernel still waits for rings")
	}
	if n := conn.RingRequests(); n != 0 {
		t.Errorf("%d requests over io_uring after the fall-back", n)
	}
}

// abortConnection ends conn's FUSE connection through the kernel's
// fusectl and detaches its mount at mnt, so that a test that found the
// mount hung fails instead of hanging with it.
func abortConnection(t *testing.T, conn *transport.Conn, mnt string) {
	t.Helper()
	if err := transport.Abort(conn); err != nil {
		t.Errorf("aborting the connection: %v", err)
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Errorf("detaching %s: %v", mnt, err)
	}
}

// TestAbortWithoutHostFusectl: the abort a mount nothing can serve gets
// works on a host that never mounted fusectl: the connection ends, its
// requests fail, and its readers stop.
func TestAbortWithoutHostFusectl(t *testing.T) {
	if fstest.WithFusectl(t, false) {
		return
	}
	overBoth(t, func(t *testing.T, ring bool) {
		mnt, conn := serveOver(t, &memDir{}, ring)
		servesAFilesystem(t, mnt)
		if err := transport.Abort(conn); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		done := make(chan error, 1)
		go func() {
			var sfs unix.Statfs_t
			done <- unix.Statfs(mnt, &sfs)
		}()
		select {
		case err := <-done:
			if !errors.Is(err, unix.ENOTCONN) && !errors.Is(err, unix.ECONNABORTED) {
				t.Errorf("statfs after the abort: %v, want ENOTCONN or ECONNABORTED", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("statfs still waits 10 s after the abort")
		}
		for deadline := time.Now().Add(10 * time.Second); !conn.Ended(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the connection's readers still run 10 s after the abort")
			}
		}
	})
}
