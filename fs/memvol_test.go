package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// The memory volume tests compare allocfs's secrets/ with a real tmpfs
// mounted with the same size= and nr_inodes=: the kernel is the reference.

const (
	// memTestSize and memTestInodes are the caps of the volumes the
	// differential tests compare: tmpfs's size=1m,nr_inodes=100.
	memTestSize   = 1 << 20
	memTestInodes = 100
)

// requireRoot skips unless the test can mount tmpfs.
func requireRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s needs root (euid is %d)", why, os.Geteuid())
	}
}

// mountTmpfs mounts a tmpfs with the given caps in a temp dir; it is
// unmounted when the test ends.
func mountTmpfs(t *testing.T, size, inodes int64) string {
	t.Helper()
	requireRoot(t, "mounting the reference tmpfs")
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// nosuid and nodev, as the allocfs mount is.
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,nr_inodes=%d", size, inodes)); err != nil {
		t.Fatalf("mount reference tmpfs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount reference tmpfs: %v", err)
		}
	})
	return dir
}

// memBackend makes fresh, empty memory volumes of memTestSize bytes and
// memTestInodes entries.
type memBackend struct {
	name  string
	fresh func(t *testing.T) string
}

// memBackends returns the reference tmpfs and allocfs's secrets/, both
// with the differential tests' caps.
func memBackends(t *testing.T) []memBackend {
	t.Helper()
	requireRoot(t, "mounting the reference tmpfs")
	tm := newTestMountTuned(t, store.Options{}, func(o *MountOptions) {
		o.MemoryInodes = func(int64) int64 { return memTestInodes }
	})
	next := 0
	return []memBackend{
		{name: "tmpfs", fresh: func(t *testing.T) string { return mountTmpfs(t, memTestSize, memTestInodes) }},
		{name: "allocfs", fresh: func(t *testing.T) string {
			next++
			id := fmt.Sprintf("v%d", next)
			if _, err := tm.store.Create(id, []allocdir.Task{{Name: "web", SecretsMB: memTestSize >> 20}}, store.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(tm.dir, id, "web", allocdir.TaskSecrets)
		}},
	}
}

// transcript records what each step of a case returned, so that two
// backends can be compared line by line.
type transcript struct {
	lines []string
}

func (tr *transcript) add(op string, err error, result ...any) {
	line := op + " -> " + errName(err)
	for _, r := range result {
		line += fmt.Sprintf(" %v", r)
	}
	tr.lines = append(tr.lines, line)
}

func (tr *transcript) String() string { return strings.Join(tr.lines, "\n") }

func errName(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

// getx returns the value of an xattr, or the error.
func getx(path, name string, follow bool) (string, error) {
	get := unix.Getxattr
	if !follow {
		get = unix.Lgetxattr
	}
	buf := make([]byte, 1<<16)
	n, err := get(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// listx returns the list of xattr names, comma-separated in the order
// given, or the error.
func listx(path string, follow bool) (string, error) {
	list := unix.Listxattr
	if !follow {
		list = unix.Llistxattr
	}
	buf := make([]byte, 1<<16)
	n, err := list(path, buf)
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(strings.TrimSuffix(string(buf[:n]), "\x00"), "\x00", ","), nil
}

// statfsLine reports the statfs fields both backends compute the same way
// (free blocks differ by design: allocfs counts names).
func statfsLine(tr *transcript, dir string) {
	var st unix.Statfs_t
	err := unix.Statfs(dir, &st)
	tr.add("statfs", err, fmt.Sprintf("bsize=%d frsize=%d blocks=%d files=%d ffree=%d namelen=%d",
		st.Bsize, st.Frsize, st.Blocks, st.Files, st.Ffree, st.Namelen))
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// memCases are the differential cases: each runs against a fresh volume
// and returns what it saw.
var memCases = map[string]func(t *testing.T, dir string) *transcript{
	"XattrNamespaces": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		f := filepath.Join(dir, "f")
		touch(t, f)
		for _, name := range []string{"user.a", "trusted.a", "security.a", "system.a", "foo.a", "user", "os2.a", "user.", "trusted.", "security."} {
			tr.add("set "+name, unix.Setxattr(f, name, []byte("v-"+name), 0))
			v, err := getx(f, name, true)
			tr.add("get "+name, err, v)
		}
		l, err := listx(f, true)
		tr.add("list", err, l)
		for _, name := range []string{"user.a", "foo.a", "user.", "trusted.a"} {
			tr.add("remove "+name, unix.Removexattr(f, name))
		}
		l, err = listx(f, true)
		tr.add("list", err, l)
		return tr
	},
	"XattrListOrder": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		f := filepath.Join(dir, "f")
		touch(t, f)
		for _, name := range []string{"user.c", "user.a", "trusted.b", "user.b", "security.z", "security.a"} {
			tr.add("set "+name, unix.Setxattr(f, name, []byte("x"), 0))
		}
		l, err := listx(f, true)
		tr.add("list", err, l)
		sz, err := unix.Listxattr(f, nil)
		tr.add("list size", err, sz)
		_, err = unix.Listxattr(f, make([]byte, 5))
		tr.add("list small buffer", err)
		return tr
	},
	"XattrFlagsAndAbsence": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		f := filepath.Join(dir, "f")
		touch(t, f)
		tr.add("get absent", func() error { _, err := getx(f, "user.zz", true); return err }())
		tr.add("remove absent", unix.Removexattr(f, "user.zz"))
		tr.add("replace absent", unix.Setxattr(f, "user.a", []byte("1"), unix.XATTR_REPLACE))
		tr.add("create", unix.Setxattr(f, "user.a", []byte("1"), unix.XATTR_CREATE))
		tr.add("create existing", unix.Setxattr(f, "user.a", []byte("2"), unix.XATTR_CREATE))
		tr.add("replace existing", unix.Setxattr(f, "user.a", []byte("3"), unix.XATTR_REPLACE))
		v, err := getx(f, "user.a", true)
		tr.add("get", err, v)
		tr.add("set plain", unix.Setxattr(f, "user.a", []byte("four"), 0))
		v, err = getx(f, "user.a", true)
		tr.add("get", err, v)
		return tr
	},
	"XattrSizes": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		f := filepath.Join(dir, "f")
		touch(t, f)
		tr.add("empty value", unix.Setxattr(f, "user.empty", nil, 0))
		v, err := getx(f, "user.empty", true)
		tr.add("get empty", err, fmt.Sprintf("%q", v))
		tr.add("value 64 KiB", unix.Setxattr(f, "user.big", bytes.Repeat([]byte("x"), 65536), 0))
		tr.add("value 64 KiB + 1", unix.Setxattr(f, "user.big2", bytes.Repeat([]byte("x"), 65537), 0))
		tr.add("value over what is left", unix.Setxattr(f, "user.big3", bytes.Repeat([]byte("x"), 50000), 0))
		tr.add("name 255", unix.Setxattr(f, "user."+strings.Repeat("n", 250), []byte("v"), 0))
		tr.add("name 256", unix.Setxattr(f, "user."+strings.Repeat("n", 251), []byte("v"), 0))
		sz, err := unix.Getxattr(f, "user.big", nil)
		tr.add("size query", err, sz)
		_, err = unix.Getxattr(f, "user.big", make([]byte, 10))
		tr.add("small buffer", err)
		statfsLine(tr, dir)
		return tr
	},
	"XattrOnEveryKind": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		d := filepath.Join(dir, "d")
		l := filepath.Join(dir, "l")
		p := filepath.Join(dir, "p")
		tr.add("mkdir", os.Mkdir(d, 0o755))
		tr.add("symlink", os.Symlink("d", l))
		tr.add("mkfifo", unix.Mkfifo(p, 0o644))
		tr.add("dir user", unix.Setxattr(d, "user.a", []byte("1"), 0))
		tr.add("symlink user", unix.Lsetxattr(l, "user.a", []byte("1"), 0))
		_, err := getx(l, "user.a", false)
		tr.add("symlink get user", err)
		tr.add("symlink remove user", unix.Lremovexattr(l, "user.a"))
		tr.add("symlink trusted", unix.Lsetxattr(l, "trusted.a", []byte("1"), 0))
		tr.add("symlink security", unix.Lsetxattr(l, "security.a", []byte("1"), 0))
		ls, err := listx(l, false)
		tr.add("symlink list", err, ls)
		tr.add("fifo user", unix.Setxattr(p, "user.a", []byte("1"), 0))
		_, err = getx(p, "user.a", true)
		tr.add("fifo get user", err)
		tr.add("fifo trusted", unix.Setxattr(p, "trusted.a", []byte("1"), 0))
		ls, err = listx(p, true)
		tr.add("fifo list", err, ls)
		ls, err = listx(d, true)
		tr.add("dir list via link", err, ls)
		return tr
	},
	"XattrsShareTheEntryBudget": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		f := filepath.Join(dir, "f")
		touch(t, f)
		statfsLine(tr, dir)
		var i int
		var err error
		for i = 0; i < 1000; i++ {
			if err = unix.Setxattr(f, fmt.Sprintf("user.fill%d", i), bytes.Repeat([]byte("x"), 4000), 0); err != nil {
				break
			}
		}
		tr.add("fill xattrs", err, i)
		statfsLine(tr, dir)
		for i = 0; i < 1000; i++ {
			if err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("g%d", i)), nil, 0o644); err != nil {
				break
			}
		}
		tr.add("then files", err, i)
		tr.add("replace with smaller", unix.Setxattr(f, "user.fill0", []byte("x"), 0))
		statfsLine(tr, dir)
		tr.add("remove", unix.Removexattr(f, "user.fill1"))
		statfsLine(tr, dir)
		var held unix.Statfs_t
		must(t, unix.Statfs(dir, &held))
		tr.add("unlink the file", os.Remove(f))
		// The file and its xattrs are freed once the kernel forgets its
		// node (FORGET comes after the unlink, on the kernel's time): at
		// once on tmpfs, within moments through the mount.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var st unix.Statfs_t
			if unix.Statfs(dir, &st) != nil || st.Ffree != held.Ffree {
				break
			}
		}
		statfsLine(tr, dir)
		return tr
	},
	"EntryCap": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		statfsLine(tr, dir)
		var i int
		var err error
		for i = 0; i < 1000; i++ {
			if err = os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%d", i)), nil, 0o644); err != nil {
				break
			}
		}
		tr.add("create files", err, i)
		statfsLine(tr, dir)
		tr.add("mkdir", os.Mkdir(filepath.Join(dir, "d"), 0o755))
		tr.add("symlink", os.Symlink("f0", filepath.Join(dir, "l")))
		tr.add("mkfifo", unix.Mkfifo(filepath.Join(dir, "p"), 0o644))
		tr.add("rename over", os.Rename(filepath.Join(dir, "f1"), filepath.Join(dir, "f2")))
		statfsLine(tr, dir)
		tr.add("mkdir after rename", os.Mkdir(filepath.Join(dir, "d"), 0o755))
		tr.add("mkdir again", os.Mkdir(filepath.Join(dir, "d2"), 0o755))
		tr.add("rmdir", os.Remove(filepath.Join(dir, "d")))
		tr.add("symlink after rmdir", os.Symlink("f0", filepath.Join(dir, "l")))
		tr.add("unlink symlink", os.Remove(filepath.Join(dir, "l")))
		tr.add("mkfifo after unlink", unix.Mkfifo(filepath.Join(dir, "p"), 0o644))
		entries, err := os.ReadDir(dir)
		tr.add("readdir", err, len(entries))
		statfsLine(tr, dir)
		return tr
	},
	"SparseFiles": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		f := filepath.Join(dir, "f")
		touch(t, f)
		tr.add("truncate past the cap", os.Truncate(f, 10<<20))
		var st unix.Stat_t
		err := unix.Stat(f, &st)
		tr.add("stat", err, st.Size, st.Blocks)
		fd, err := os.OpenFile(f, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		buf := []byte("junk")
		_, err = fd.ReadAt(buf, 5<<20)
		tr.add("read a hole", err, fmt.Sprintf("%q", buf))
		_, err = fd.WriteAt([]byte("z"), 8<<20+100)
		tr.add("write far out", err)
		err = unix.Stat(f, &st)
		tr.add("stat", err, st.Size, st.Blocks)
		tr.add("truncate into the page", os.Truncate(f, 8<<20+50))
		tr.add("truncate back", os.Truncate(f, 9<<20))
		buf = make([]byte, 60)
		_, err = fd.ReadAt(buf, 8<<20+50)
		tr.add("read the cut tail", err, bytes.Count(buf, []byte{0}))
		err = unix.Stat(f, &st)
		tr.add("stat", err, st.Size, st.Blocks)
		return tr
	},
	"FreshStatfs": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		var st unix.Statfs_t
		err := unix.Statfs(dir, &st)
		tr.add("statfs", err, fmt.Sprintf("%+v", [...]int64{st.Bsize, st.Frsize, int64(st.Blocks), int64(st.Bfree), int64(st.Bavail), int64(st.Files), int64(st.Ffree), st.Namelen}))
		return tr
	},
}

// memKnownDiff is a line where a memory volume still differs from tmpfs.
type memKnownDiff struct {
	tmpfs, allocfs, why string
	// sometimes is set for a difference that depends on when the kernel
	// sends a request.
	sometimes bool
}

// memKnownDiffs are the known differences by case. Each is the FUSE
// layer's, which disk volumes share; none loses data. A case whose
// allocfs line stops showing fails (unless it shows only sometimes), so
// that the entry goes once fixed.
var memKnownDiffs = map[string][]memKnownDiff{
	"SizesPastTheCap": {{
		"truncate to the same size -> ok [f - nlink=1]",
		"truncate to the same size -> ok [f mc nlink=1]",
		"the kernel sends truncate(2) to a FUSE server with FATTR_MTIME_NOW (fuse_do_setattr), which the daemon applies; tmpfs alone leaves the times of a truncate that keeps the size",
		false,
	}},
	"HardLinks": {{
		"unlink p2 -> ok\nstatfs -> ok files=100 ffree=97",
		"unlink p2 -> ok\nstatfs -> ok files=100 ffree=96",
		"an unlinked FIFO, socket or device keeps its inode until the kernel forgets the node: the daemon holds it (holdSpecial) to answer fstat of an instance the kernel opened without telling it",
		true,
	}},
	"RenameTimesAndErrors": {{
		"[d/h c nlink=0]",
		"d/h:ENOENT",
		"fstat of an O_PATH descriptor of a file renamed over, when no handle of it is open: the daemon holds no descriptor of every node the kernel knows",
		false,
	}},
	"DirectoryLinksAndSize": {{
		"[a/c c nlink=0]",
		"a/c:ENOENT",
		"fstat of an O_PATH descriptor of a directory renamed over, when no handle of it is open: as above",
		false,
	}},
}

// TestMemVolumeLikeTmpfs runs every case against a real tmpfs and against
// allocfs's secrets/ with the same caps, and wants the same results but
// for memKnownDiffs.
func TestMemVolumeLikeTmpfs(t *testing.T) {
	backends := memBackends(t)
	for name, run := range memCases {
		t.Run(name, func(t *testing.T) {
			want := run(t, backends[0].fresh(t)).String()
			got := run(t, backends[1].fresh(t)).String()
			for _, d := range memKnownDiffs[name] {
				switch {
				case strings.Contains(got, d.allocfs):
					want = strings.Replace(want, d.tmpfs, d.allocfs, 1)
				case !d.sometimes:
					t.Errorf("the known difference %q is gone: take it out of memKnownDiffs", d.why)
				}
			}
			if got != want {
				t.Errorf("allocfs differs from tmpfs:\n--- tmpfs\n%s\n--- allocfs\n%s", want, got)
			} else {
				t.Logf("both:\n%s", got)
			}
		})
	}
}

// TestMemVolumeXattrErrnos pins the errnos the issue asks for on
// allocfs's secrets/, whatever the kernel's tmpfs does later.
func TestMemVolumeXattrErrnos(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/secrets")
	f := filepath.Join(dir, "f")
	touch(t, f)
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		what string
		err  error
		want error
	}{
		{"set user.a", unix.Setxattr(f, "user.a", []byte("v"), 0), nil},
		{"set unknown namespace", unix.Setxattr(f, "nomad.a", []byte("v"), 0), unix.EOPNOTSUPP},
		{"set user.* on a symlink", unix.Lsetxattr(filepath.Join(dir, "l"), "user.a", []byte("v"), 0), unix.EPERM},
		{"set a value over 64 KiB", unix.Setxattr(f, "user.big", make([]byte, 65537), 0), unix.E2BIG},
		{"remove absent", unix.Removexattr(f, "user.none"), unix.ENODATA},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) && !(c.err == nil && c.want == nil) {
			t.Errorf("%s: got %v, want %v", c.what, c.err, c.want)
		}
	}
	if v, err := getx(f, "user.a", true); err != nil || v != "v" {
		t.Errorf("get user.a: got %q, %v; want \"v\"", v, err)
	}
	if l, err := listx(f, true); err != nil || l != "user.a" {
		t.Errorf("list after the refusals: got %q, %v; want only user.a", l, err)
	}
}

// TestMemVolumeDataCap writes past the byte cap on both backends: each
// accepts a short write and then refuses with ENOSPC, at the same byte;
// freeing the data gives the room back.
func TestMemVolumeDataCap(t *testing.T) {
	written := map[string]int{}
	for _, b := range memBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			dir := b.fresh(t)
			fd, err := os.Create(filepath.Join(dir, "big"))
			if err != nil {
				t.Fatal(err)
			}
			defer fd.Close()
			chunk := bytes.Repeat([]byte("d"), memTestSize/2+1000)
			total := 0
			for i := 0; i < 4; i++ {
				n, err := fd.Write(chunk)
				total += n
				if err != nil {
					if !errors.Is(err, unix.ENOSPC) {
						t.Fatalf("write past the cap: got %v, want ENOSPC", err)
					}
					break
				}
			}
			if n, err := fd.Write([]byte("x")); !errors.Is(err, unix.ENOSPC) || n != 0 {
				t.Errorf("write on a full volume: got %d, %v; want 0, ENOSPC", n, err)
			}
			var st unix.Stat_t
			if err := unix.Fstat(int(fd.Fd()), &st); err != nil || st.Size != int64(total) {
				t.Errorf("size after the refusal: got %d (%v), want %d", st.Size, err, total)
			}
			written[b.name] = total
			if err := fd.Truncate(0); err != nil {
				t.Fatal(err)
			}
			if _, err := fd.WriteAt(chunk, 0); err != nil {
				t.Errorf("write after freeing the data: %v", err)
			}
		})
	}
	ref, got := written["tmpfs"], written["allocfs"]
	if ref != memTestSize || got != ref {
		t.Errorf("bytes written before ENOSPC: tmpfs %d, allocfs %d; want %d on both", ref, got, memTestSize)
	}
}

// TestMemVolumeReturnsWhatItCharged does a bit of everything in a volume
// and removes it all again: the volume must be back to empty in both
// caps, so that no operation leaks budget (or hands out more than it took).
func TestMemVolumeReturnsWhatItCharged(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/secrets")
	p := func(name string) string { return filepath.Join(dir, name) }
	var empty unix.Statfs_t
	if err := unix.Statfs(dir, &empty); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"mkdir", func() error { return os.Mkdir(p("d"), 0o700) }},
		{"write", func() error { return os.WriteFile(p("d/f"), make([]byte, 10000), 0o600) }},
		{"xattr", func() error { return unix.Setxattr(p("d/f"), "user.x", make([]byte, 500), 0) }},
		{"xattr replaced", func() error { return unix.Setxattr(p("d/f"), "user.x", make([]byte, 50), 0) }},
		{"dir xattr", func() error { return unix.Setxattr(p("d"), "trusted.y", []byte("1"), 0) }},
		{"symlink", func() error { return os.Symlink(strings.Repeat("t", 300), p("l")) }},
		{"fifo", func() error { return unix.Mkfifo(p("fifo"), 0o600) }},
		{"second file", func() error { return os.WriteFile(p("g"), make([]byte, 5000), 0o600) }},
		{"rename longer", func() error { return os.Rename(p("g"), p("a-much-longer-name")) }},
		{"exchange", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("a-much-longer-name"), unix.AT_FDCWD, p("d/f"), unix.RENAME_EXCHANGE)
		}},
		{"rename over", func() error { return os.Rename(p("d/f"), p("fifo")) }},
		{"truncate up", func() error { return os.Truncate(p("fifo"), 1<<30) }},
		{"write far out", func() error {
			f, err := os.OpenFile(p("fifo"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("z"), 1<<29)
			return err
		}},
		{"truncate down", func() error { return os.Truncate(p("fifo"), 7000) }},
		{"remove all", func() error { return os.RemoveAll(p("d")) }},
		{"unlink link", func() error { return os.Remove(p("l")) }},
		{"unlink file", func() error { return os.Remove(p("fifo")) }},
		{"unlink exchanged", func() error { return os.Remove(p("a-much-longer-name")) }},
		{"root xattr", func() error { return unix.Setxattr(dir, "user.r", []byte("v"), 0) }},
		{"root xattr removed", func() error { return unix.Removexattr(dir, "user.r") }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("volume after removing everything: %d entries (%v)", len(entries), err)
	}
	// A removed file's inode is the daemon's until the kernel forgets
	// its node (FORGET comes after the unlink, on the kernel's time).
	var st unix.Statfs_t
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := unix.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		if st.Ffree == empty.Ffree || time.Now().After(deadline) {
			break
		}
	}
	if st.Bfree != empty.Bfree || st.Ffree != empty.Ffree || st.Bfree != st.Blocks || st.Ffree != st.Files-1 {
		t.Errorf("statfs after removing everything: got bfree=%d ffree=%d, want %d and %d as when empty (blocks=%d files=%d)", st.Bfree, st.Ffree, empty.Bfree, empty.Ffree, st.Blocks, st.Files)
	}
}

// heapBytes is the live heap after a full collection.
func heapBytes() int64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// heapNoise is how much the live heap moves without allocfs holding
// anything more: go-fuse keeps a request buffer of MaxWrite (1 MiB) per
// reader goroutine, and starts more readers when requests pile up.
const heapNoise = 4 << 20

// TestMemVolumeManyEntries is the bad input of a task that fills its
// secrets/: 48 MiB of data, then a million directories with long names.
// The data cap and the default entry cap stop it with ENOSPC, nothing
// else changes (its private/ has its own caps, alloc/data takes files),
// and the daemon's heap holds none of the data: the kernel's tmpfs does.
func TestMemVolumeManyEntries(t *testing.T) {
	tm := newTestMount(t)
	task := allocdir.Task{Name: "web", SecretsMB: 64}
	if _, err := tm.store.Create("a1", []allocdir.Task{task}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/secrets")
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
	base := heapBytes()
	const data = 48 << 20
	if err := os.WriteFile(filepath.Join(dir, "data"), bytes.Repeat([]byte("d"), data), 0o600); err != nil {
		t.Fatal(err)
	}
	grown := heapBytes() - base
	t.Logf("heap grew by %d bytes for %d MiB of data", grown, data>>20)
	if grown > heapNoise {
		t.Errorf("heap grew by %d bytes for a memory volume holding %d bytes; want at most the noise, %d", grown, data, heapNoise)
	}
	inodes := defaultMemInodes(task.SecretsBytes())
	name := func(i int) string { return fmt.Sprintf("%07d%s", i, strings.Repeat("x", 233)) }
	var made int
	var err error
	for made = 0; made < 1_000_000; made++ {
		if err = unix.Mkdir(filepath.Join(dir, name(made)), 0o700); err != nil {
			break
		}
	}
	// The root and the data file take one entry each.
	if !errors.Is(err, unix.ENOSPC) || int64(made) != inodes-2 {
		t.Fatalf("mkdir until refused: got %d made, then %v; want %d (the entry cap %d less the root and a file), then ENOSPC", made, err, inodes-2, inodes)
	}
	if _, err := os.Lstat(filepath.Join(dir, name(made))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused directory: got %v, want not-exist", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Files != uint64(inodes) || st.Ffree != 0 {
		t.Errorf("statfs at the cap: got files=%d ffree=%d (%v), want %d and 0", st.Files, st.Ffree, err, inodes)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "data")); err != nil || len(data) != 48<<20 {
		t.Errorf("data file after the refusal: got %d bytes (%v), want %d", len(data), err, 48<<20)
	}
	if err := os.WriteFile(filepath.Join(dir, "more"), nil, 0o600); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("a file in a volume at its entry cap: got %v, want ENOSPC", err)
	}
	// The task's other memory volume, and its disk, have their own caps.
	if err := os.WriteFile(filepath.Join(tm.dir, "a1/web/private/p"), []byte("x"), 0o600); err != nil {
		t.Errorf("private/ next to a full secrets/: %v", err)
	}
	if err := os.WriteFile(filepath.Join(tm.dir, "a1/alloc/data/d"), []byte("x"), 0o600); err != nil {
		t.Errorf("alloc/data next to a full secrets/: %v", err)
	}
	// What stays is go-fuse's node of each entry the kernel holds, as
	// for any volume: a KiB at most each.
	grown = heapBytes() - base
	t.Logf("heap grew by %d bytes with %d entries, %d per entry", grown, made, grown/int64(made))
	if limit := inodes<<10 + heapNoise; grown > limit {
		t.Errorf("heap grew by %d bytes for %d entries; want at most %d", grown, made, limit)
	}
}

// TestMemVolumeAfterDestroy checks what the nodes the kernel still holds
// after a destroy do: the mount lets go of the instance at once, a held
// directory gains no entries, the volume is gone from the read side, and
// a file the task still holds open is the task's until it closes it, as
// on a tmpfs detached while in use.
func TestMemVolumeAfterDestroy(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/secrets")
	if err := os.Mkdir(filepath.Join(dir, "d"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "d/token"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write([]byte("s3cr3t")); err != nil {
		t.Fatal(err)
	}
	d, err := os.Open(filepath.Join(dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	v := tm.mount.existingMemVolume("a1", "web", allocdir.TaskSecrets)
	if err := tm.store.Destroy("a1"); err != nil {
		t.Fatal(err)
	}
	if tm.mount.existingMemVolume("a1", "web", allocdir.TaskSecrets) != nil {
		t.Error("the destroyed volume is still known to the mount")
	}
	v.mu.Lock()
	closed := v.dropped && v.fs.Fd() < 0
	v.mu.Unlock()
	if !closed {
		t.Error("the mount still holds the destroyed volume's descriptor")
	}
	if err := unix.Mkdirat(int(d.Fd()), "new", 0o700); !errors.Is(err, unix.ENOENT) {
		t.Errorf("mkdir in a directory held across the destroy: got %v, want ENOENT", err)
	}
	buf := make([]byte, 16)
	if n, _ := f.ReadAt(buf, 0); string(buf[:n]) != "s3cr3t" {
		t.Errorf("read through a file held across the destroy: got %q", buf[:n])
	}
}

// TestMemVolumeHidesTrustedFromUsers lists xattrs as an unprivileged user
// on both backends: trusted.* is left out on both.
func TestMemVolumeHidesTrustedFromUsers(t *testing.T) {
	if path := os.Getenv("ALLOCFS_LISTXATTR_HELPER"); path != "" {
		// The helper process: become nobody (Go applies it to every
		// thread, and leaving uid 0 drops every capability), then list.
		var uid, gid int
		fmt.Sscanf(os.Getenv("ALLOCFS_LISTXATTR_AS"), "%d:%d", &uid, &gid)
		if err := syscall.Setgroups(nil); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Setgid(gid); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Setuid(uid); err != nil {
			t.Fatal(err)
		}
		l, err := listx(path, true)
		fmt.Printf("%s|%s\n", errName(err), l)
		return
	}
	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no nobody user to list as")
	}
	for _, b := range memBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			dir := b.fresh(t)
			// Let nobody reach the volume.
			for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
				if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o005 != 0o005 {
					if err := os.Chmod(p, fi.Mode().Perm()|0o005); err != nil {
						t.Fatal(err)
					}
				}
			}
			f := filepath.Join(dir, "f")
			touch(t, f)
			for _, name := range []string{"user.u", "trusted.t", "security.s"} {
				if err := unix.Setxattr(f, name, []byte("v"), 0); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestMemVolumeHidesTrustedFromUsers$")
			cmd.Env = append(os.Environ(), "ALLOCFS_LISTXATTR_HELPER="+f, fmt.Sprintf("ALLOCFS_LISTXATTR_AS=%d:%d", nobody.UID, nobody.GID))
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("helper: %v (output %q)", err, out)
			}
			line, _, _ := strings.Cut(string(out), "\n")
			if want := "ok|user.u,security.s"; line != want {
				t.Errorf("list as nobody: got %q, want %q", line, want)
			}
			if l, err := listx(f, true); err != nil || l != "user.u,trusted.t,security.s" {
				t.Errorf("list as root: got %q, %v; want all three", l, err)
			}
		})
	}
}
