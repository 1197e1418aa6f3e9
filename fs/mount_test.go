package fs

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// testMount is a store in a temp dir mounted at a temp mount point; it is
// unmounted when the test ends.
type testMount struct {
	store *store.Store
	mount *Mount
	dir   string
}

// TestMain gives the test binary, which serves the mounts it makes, the
// umask a FUSE server needs (NewMount refuses any other). Run as a
// benchmark's client, it runs that client's workload instead
// (runBenchClient).
func TestMain(m *testing.M) {
	runBenchClient()
	syscall.Umask(0)
	code := m.Run()
	cleanupPeerTools()
	os.Exit(code)
}

func newTestMount(t *testing.T) *testMount {
	t.Helper()
	return newTestMountWith(t, store.Options{})
}

// newTestMountWith is newTestMount with the store opened with opts.
func newTestMountWith(t *testing.T, storeOpts store.Options) *testMount {
	t.Helper()
	return newTestMountTuned(t, storeOpts, nil)
}

// newTestMountTuned is newTestMountWith with the mount's options changed
// by tune, when it is not nil.
func newTestMountTuned(t *testing.T, storeOpts store.Options, tune func(*MountOptions)) *testMount {
	t.Helper()
	fstest.RequireFUSE(t)
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"), storeOpts)
	return mountTestStore(t, s, tune)
}

// mountTestStore mounts s at a temp mount point, with the mount's options
// changed by tune when it is not nil; it is unmounted when the test ends.
func mountTestStore(t *testing.T, s *store.Store, tune func(*MountOptions)) *testMount {
	t.Helper()
	logger := testLogger(t)
	logger.SetLevel(hclog.Warn)
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	opts := DefaultMountOptions()
	opts.Debug = testing.Verbose() && os.Getenv("ALLOCFS_FUSE_DEBUG") == "1"
	if tune != nil {
		tune(&opts)
	}
	m, err := NewMount(logger, s, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return &testMount{store: s, mount: m, dir: dir}
}

// TestMountLayout checks that a created allocation shows Nomad's layout
// with its modes, and that data written through the mount lands in the
// volume's layer on the backing store.
func TestMountLayout(t *testing.T) {
	tm := newTestMount(t)
	st, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := filepath.Join(tm.dir, "a1")
	want := map[string]os.FileMode{
		"":            os.ModeDir | 0o755,
		"alloc":       os.ModeDir | 0o777,
		"alloc/data":  os.ModeDir | 0o777,
		"alloc/logs":  os.ModeDir | 0o777,
		"alloc/tmp":   os.ModeDir | 0o777,
		"web":         os.ModeDir | 0o777,
		"web/local":   os.ModeDir | 0o777,
		"web/tmp":     os.ModeDir | os.ModeSticky | 0o777,
		"web/secrets": os.ModeDir | 0o777,
		"web/private": os.ModeDir | 0o777,
		"web/alloc":   os.ModeDir | 0o777,
	}
	for rel, mode := range want {
		fi, err := os.Stat(filepath.Join(alloc, rel))
		if err != nil {
			t.Errorf("stat %q: %v", rel, err)
			continue
		}
		if fi.Mode() != mode {
			t.Errorf("mode of %q: got %v, want %v", rel, fi.Mode(), mode)
		}
	}
	if err := os.WriteFile(filepath.Join(alloc, "alloc/data/test.txt"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	backing := filepath.Join(tm.store.LayerPath(st.Volumes["alloc/data"].Upper), "test.txt")
	got, err := os.ReadFile(backing)
	if err != nil || string(got) != "hello\n" {
		t.Errorf("backing file: got %q, %v; want %q", got, err, "hello\n")
	}
	viaView, err := os.ReadFile(filepath.Join(alloc, "web/alloc/data/test.txt"))
	if err != nil || string(viaView) != "hello\n" {
		t.Errorf("web/alloc view: got %q, %v", viaView, err)
	}
	entries, err := os.ReadDir(alloc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, ",") != "alloc,web" {
		t.Errorf("alloc dir entries: got %v, want [alloc web]", names)
	}
}

// TestMountSecretsStayInMemory checks that a secret written through the
// mount is readable there, is never written to the backing directory, and
// that the size cap is enforced with ENOSPC.
func TestMountSecretsStayInMemory(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(tm.dir, "a1/web/secrets/token")
	marker := "s3cr3t-marker-4a1b"
	if err := os.WriteFile(secret, []byte(marker), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(secret)
	if err != nil || string(got) != marker {
		t.Fatalf("read back: got %q, %v", got, err)
	}
	err = filepath.WalkDir(tm.store.DataDir(), func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		data, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(data), marker) {
			t.Errorf("secret found on the backing store in %q", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 2<<20)
	err = os.WriteFile(filepath.Join(tm.dir, "a1/web/secrets/big"), big, 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("2 MiB into a 1 MiB secrets dir: got %v, want ENOSPC", err)
	}
}

// TestMountStatfs checks that df on the mount reports the backing store's
// numbers, at the root and inside a volume.
func TestMountStatfs(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want, err := tm.store.Statfs()
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"", "a1", "a1/alloc", "a1/alloc/data"} {
		var got syscall.Statfs_t
		if err := syscall.Statfs(filepath.Join(tm.dir, rel), &got); err != nil {
			t.Fatalf("statfs %q: %v", rel, err)
		}
		if got.Blocks != want.Blocks || got.Bsize != want.Bsize || got.Files != want.Files {
			t.Errorf("statfs %q: got blocks=%d bsize=%d files=%d, want %d %d %d", rel, got.Blocks, got.Bsize, got.Files, want.Blocks, want.Bsize, want.Files)
		}
	}
}

// TestMountSeesStoreChangesAtOnce checks that the kernel forgets what it
// cached about an allocation before Create and Destroy return: a lookup
// that failed just before Create, or succeeded just before Destroy, is not
// answered from the cache afterwards.
func TestMountSeesStoreChangesAtOnce(t *testing.T) {
	tm := newTestMount(t)
	p := filepath.Join(tm.dir, "a1")
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Fatalf("stat before create: got %v, want not-exist", err)
	}
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p, "web/local")); err != nil {
		t.Errorf("stat right after create: got %v, want it there", err)
	}
	if err := tm.store.Destroy("a1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("stat right after destroy: got %v, want not-exist", err)
	}
}

// TestMountPassthroughServesData checks that, when the kernel negotiated
// passthrough, reads and writes through the mount never reach the
// daemon: the mount still reports passthrough after a round trip of data.
func TestMountPassthroughServesData(t *testing.T) {
	tm := newTestMount(t)
	if !tm.mount.vol.PassthroughNegotiated() {
		fstest.Lacks(t, "the kernel did not offer passthrough (needs Linux 6.9+ and root)")
	}
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(tm.dir, "a1/alloc/data/f")
	data := make([]byte, 3<<20)
	for i := range data {
		data[i] = byte(i)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(p)
	if err != nil || len(got) != len(data) {
		t.Fatalf("read back: %d bytes, %v", len(got), err)
	}
	if !tm.mount.Passthrough() {
		t.Errorf("Passthrough after a data round trip: got false, want true (data reached the daemon)")
	}
}

// TestMountSetgidDirectory checks that entries created in a setgid
// directory get the directory's group, and new subdirectories stay setgid,
// as on a local filesystem, whoever creates them.
func TestMountSetgidDirectory(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/alloc/data/shared")
	if err := os.Mkdir(dir, 0o775); err != nil {
		t.Fatal(err)
	}
	const group = 4242
	if err := os.Chown(dir, 0, group); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o775|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f", "sub", "fifo", "link"} {
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if gid := fi.Sys().(*syscall.Stat_t).Gid; gid != group {
			t.Errorf("group of %s: got %d, want %d (the setgid parent's)", name, gid, group)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "sub")); err != nil || fi.Mode()&os.ModeSetgid == 0 {
		t.Errorf("new subdirectory of a setgid dir: got mode %v (%v), want setgid", fi.Mode(), err)
	}
}

// TestMountCachedListingsStayCurrent checks that the listings the kernel
// caches for volume directories follow every change made through the
// mount: create, rename, unlink, mkdir and rmdir.
func TestMountCachedListingsStayCurrent(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/local")
	list := func() string {
		t.Helper()
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return strings.Join(names, ",")
	}
	steps := []struct {
		do   func() error
		want string
	}{
		{func() error { return nil }, ""},
		{func() error { return os.WriteFile(filepath.Join(dir, "a"), nil, 0o644) }, "a"},
		{func() error { return os.Rename(filepath.Join(dir, "a"), filepath.Join(dir, "b")) }, "b"},
		{func() error { return os.Mkdir(filepath.Join(dir, "c"), 0o755) }, "b,c"},
		{func() error { return os.Remove(filepath.Join(dir, "b")) }, "c"},
		{func() error { return os.Remove(filepath.Join(dir, "c")) }, ""},
	}
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		list() // a second listing would come from the cache
		if got := list(); got != s.want {
			t.Errorf("step %d: listing got %q, want %q", i, got, s.want)
		}
	}
}

// TestMountFileKinds checks what the POSIX table does not: mmap writes
// reach the file, unix sockets can be bound and connected in a volume,
// renameat2's NOREPLACE and EXCHANGE work inside a volume, and a rename
// between two volumes is EXDEV (mv then copies).
func TestMountFileKinds(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(tm.dir, "a1/alloc/data")

	t.Run("mmap", func(t *testing.T) {
		p := filepath.Join(data, "mapped")
		if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		mem, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			t.Fatalf("mmap: %v", err)
		}
		copy(mem, "through a mapping")
		if err := unix.Msync(mem, unix.MS_SYNC); err != nil {
			t.Fatalf("msync: %v", err)
		}
		syscall.Munmap(mem)
		got, err := os.ReadFile(filepath.Join(tm.store.LayerPath(mustState(t, tm.store, "a1").Volumes["alloc/data"].Upper), "mapped"))
		if err != nil || !strings.HasPrefix(string(got), "through a mapping") {
			t.Errorf("backing file after msync: got %.20q, %v", got, err)
		}
	})

	t.Run("unix socket", func(t *testing.T) {
		p := filepath.Join(tm.dir, "a1/alloc/tmp/api.sock")
		ln, err := net.Listen("unix", p)
		if err != nil {
			t.Fatalf("listen on a socket in the mount: %v", err)
		}
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				c.Write([]byte("hello"))
				c.Close()
			}
		}()
		c, err := net.Dial("unix", p)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer c.Close()
		buf := make([]byte, 5)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hello" {
			t.Errorf("read from the socket: got %q, %v", buf, err)
		}
		if fi, err := os.Lstat(p); err != nil || fi.Mode()&os.ModeSocket == 0 {
			t.Errorf("lstat of the socket: got %v, %v", fi, err)
		}
	})

	t.Run("renameat2", func(t *testing.T) {
		a, b := filepath.Join(data, "ra"), filepath.Join(data, "rb")
		os.WriteFile(a, []byte("a"), 0o644)
		os.WriteFile(b, []byte("b"), 0o644)
		if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_NOREPLACE); !errors.Is(err, unix.EEXIST) {
			t.Errorf("RENAME_NOREPLACE onto an existing name: got %v, want EEXIST", err)
		}
		if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
			t.Fatalf("RENAME_EXCHANGE: %v", err)
		}
		ga, _ := os.ReadFile(a)
		gb, _ := os.ReadFile(b)
		if string(ga) != "b" || string(gb) != "a" {
			t.Errorf("after RENAME_EXCHANGE: ra=%q rb=%q, want b and a", ga, gb)
		}
	})

	t.Run("EXDEV between volumes", func(t *testing.T) {
		src := filepath.Join(data, "moving")
		os.WriteFile(src, []byte("x"), 0o644)
		err := os.Rename(src, filepath.Join(tm.dir, "a1/web/local/moving"))
		if !errors.Is(err, unix.EXDEV) {
			t.Errorf("rename from alloc/data to web/local: got %v, want EXDEV", err)
		}
		if _, err := os.Stat(src); err != nil {
			t.Errorf("the source after a refused rename: %v", err)
		}
	})
}

// TestNewMountRefusesUmask checks that NewMount refuses to serve with a
// umask, which would be applied a second time to every new file, rather
// than setting the process's umask itself.
func TestNewMountRefusesUmask(t *testing.T) {
	fstest.RequireFUSE(t)
	store := openTestStore(t, filepath.Join(t.TempDir(), "data"), store.Options{})
	dir := t.TempDir()
	old := syscall.Umask(0o022)
	_, err := NewMount(testLogger(t), store, dir, DefaultMountOptions())
	after := syscall.Umask(old)
	if err == nil || !strings.Contains(err.Error(), "umask") {
		t.Fatalf("NewMount with umask 022: %v, want a refusal that names the umask", err)
	}
	if after != 0o022 {
		t.Errorf("NewMount changed the umask to %04o", after)
	}
}

// TestMountServers checks that each way of serving the mount serves it:
// allocfs's own loop by default, go-fuse's server when asked, and when
// the request trace (which only go-fuse's server has) is asked for.
func TestMountServers(t *testing.T) {
	fstest.RequireFUSE(t)
	for _, c := range []struct {
		name   string
		opts   func(*MountOptions)
		goFuse bool
	}{
		{"own loop", func(*MountOptions) {}, false},
		{"own loop over /dev/fuse", func(o *MountOptions) { o.IOUring = false }, false},
		{"go-fuse", func(o *MountOptions) { o.GoFuseServer = true }, true},
		{"debug", func(o *MountOptions) { o.Debug = true }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			logger := testLogger(t)
			logger.SetLevel(hclog.Warn)
			s := openTestStore(t, filepath.Join(t.TempDir(), "data"), store.Options{})
			dir := filepath.Join(t.TempDir(), "mnt")
			must(t, os.Mkdir(dir, 0o755))
			opts := DefaultMountOptions()
			c.opts(&opts)
			m, err := NewMount(logger, s, dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := m.Unmount(); err != nil {
					t.Errorf("unmount: %v", err)
				}
			})
			if _, ok := m.server.(goFuseServer); ok != c.goFuse {
				t.Errorf("served by %T, want go-fuse's server: %v", m.server, c.goFuse)
			}
			if want := opts.IOUring && !c.goFuse && fuseOverIOUringOn(); m.ioUring != want {
				t.Errorf("requests over io_uring: %v, want %v", m.ioUring, want)
			}
			if _, err := s.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "a", "alloc", "data", "f")
			must(t, os.WriteFile(p, []byte("served"), 0o644))
			if b, err := os.ReadFile(p); err != nil || string(b) != "served" {
				t.Errorf("read back %q, %v; want %q", b, err, "served")
			}
			if m.Passthrough() != (os.Geteuid() == 0) {
				t.Errorf("passthrough %v as uid %d", m.Passthrough(), os.Geteuid())
			}
		})
	}
}

// fuseOverIOUringOn reports whether this kernel and process can take
// FUSE requests over io_uring.
func fuseOverIOUringOn() bool { return transport.IOUringUsable() == nil }
