package fs

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fifoIO opens the FIFO at p for reading and writing, writes a pipe's
// worth into it (64 KiB, what a logger's pipe holds), reads it back, and
// closes it, as a task does with its own pipe.
func fifoIO(t *testing.T, p string) {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	must(t, err)
	defer unix.Close(fd)
	data := make([]byte, 64<<10)
	if n, err := unix.Write(fd, data); err != nil || n != len(data) {
		t.Fatalf("write into %s: %d, %v", p, n, err)
	}
	if n, err := unix.Read(fd, data); err != nil || n != len(data) {
		t.Fatalf("read from %s: %d, %v", p, n, err)
	}
}

// fifoTimesChange makes a FIFO in dir, waits for the clock to move on,
// runs fifoIO on it and reports whether its mtime and its ctime changed.
func fifoTimesChange(t *testing.T, dir string, io func(p string)) (mtime, ctime bool) {
	t.Helper()
	p := filepath.Join(dir, "pipe")
	must(t, unix.Mkfifo(p, 0o644))
	var before, after unix.Stat_t
	must(t, unix.Stat(p, &before))
	for {
		var now unix.Timespec
		must(t, unix.ClockGettime(unix.CLOCK_REALTIME_COARSE, &now))
		if now.Nano() > before.Mtim.Nano() && now.Nano() > before.Ctim.Nano() {
			break
		}
	}
	io(p)
	must(t, unix.Stat(p, &after))
	return after.Mtim != before.Mtim, after.Ctim != before.Ctim
}

// TestFIFOTimesAreTheKernels shows why a FIFO written through the mount
// keeps its mtime and ctime, where ext4 updates both: the kernel serves
// pipe I/O on a FUSE inode itself and marks every FUSE inode but a
// regular file S_NOCMTIME (fs/fuse/inode.c, fuse_iget), so pipe_write's
// file_update_time changes nothing and no request reaches the server:
// not the open (init_special_inode gives the inode the pipe's own file
// operations), not a write, a read or the close. No FUSE server can show
// the change, go-fuse's loopback and kernel overlayfs (whose inodes are
// S_NOCMTIME too) show none either, and the closest a server can come is
// what allocfs does: the times of every change it is told of (create,
// chmod, rename), and the pipe's I/O leaving them as they were. The
// differential test leaves a FIFO's times after pipe I/O uncompared, for
// this reason.
func TestFIFOTimesAreTheKernels(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vol := filepath.Join(tm.dir, "a", "alloc", "data")
	// The reference: the backing ext4.
	native := filepath.Join(filepath.Dir(tm.store.DataDir()), "native")
	must(t, os.Mkdir(native, 0o755))
	if m, c := fifoTimesChange(t, native, func(p string) { fifoIO(t, p) }); !m || !c {
		t.Fatalf("on ext4 pipe I/O changed mtime %v, ctime %v: the test's premise is wrong", m, c)
	}

	var during map[string]uint64
	m, c := fifoTimesChange(t, vol, func(p string) {
		before := tm.mount.RequestCounts()
		fifoIO(t, p)
		during = tm.mount.RequestCounts()
		for op, n := range before {
			during[op] -= n
		}
		maps.DeleteFunc(during, func(_ string, n uint64) bool { return n == 0 })
	})
	if len(during) != 0 {
		t.Errorf("the pipe's open, I/O and close reached the daemon: %v", during)
	}
	if m || c {
		t.Errorf("through allocfs pipe I/O changed mtime %v, ctime %v: then the server did see it", m, c)
	}

	// The peers: go-fuse's loopback of a directory of the backing ext4,
	// and kernel overlayfs over two of them.
	base := t.TempDir()
	backing, lmnt := filepath.Join(base, "backing"), filepath.Join(base, "loopback")
	must(t, os.Mkdir(backing, 0o755))
	must(t, os.Mkdir(lmnt, 0o755))
	root, err := gofs.NewLoopbackRoot(backing)
	must(t, err)
	// Mounted by the mount(2) call itself, as allocfs is: a machine
	// without fuse3 has no fusermount.
	server, err := gofs.Mount(lmnt, root, &gofs.Options{MountOptions: fuse.MountOptions{DirectMountStrict: true}})
	must(t, err)
	t.Cleanup(func() {
		if err := server.Unmount(); err != nil {
			unix.Unmount(lmnt, unix.MNT_DETACH)
		}
	})
	if m, c := fifoTimesChange(t, lmnt, func(p string) { fifoIO(t, p) }); m || c {
		t.Errorf("through go-fuse's loopback pipe I/O changed mtime %v, ctime %v", m, c)
	}
	var dirs [4]string
	for i, name := range []string{"lower", "upper", "work", "merged"} {
		dirs[i] = filepath.Join(base, name)
		must(t, os.Mkdir(dirs[i], 0o755))
	}
	if err := unix.Mount("overlay", dirs[3], "overlay", 0, "lowerdir="+dirs[0]+",upperdir="+dirs[1]+",workdir="+dirs[2]); err != nil {
		t.Fatalf("mount kernel overlayfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dirs[3], unix.MNT_DETACH) })
	if m, c := fifoTimesChange(t, dirs[3], func(p string) { fifoIO(t, p) }); m || c {
		t.Errorf("through kernel overlayfs pipe I/O changed mtime %v, ctime %v", m, c)
	}
}
