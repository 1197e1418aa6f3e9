package fs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/volume"
	"golang.org/x/sys/unix"
)

const (
	// pathMax is the kernel's PATH_MAX: a path string and its NUL.
	pathMax = 4096
	// deepLevels directories of deepName make a path of about twice
	// PATH_MAX from the volume's directory.
	deepLevels = 40
	// seededLevels of them, about 6,000 bytes deep, are in the snapshot
	// volume's lower layer, with seededFile in the deepest.
	seededLevels  = 30
	seededFile    = "lower-file"
	seededContent = "from the lower layer\n"
	// longLevels directories of longName, and a last name that brings
	// the path to PATH_MAX-1 bytes.
	longLevels = 20
)

// deepName is the name of the directory at level i of the deep tree: 199
// bytes, 200 with its slash.
func deepName(i int) string {
	s := fmt.Sprintf("deep-%03d-", i)
	return s + strings.Repeat("d", 199-len(s))
}

// longName is the name of directory i on the long path: 200 bytes.
func longName(i int) string {
	s := fmt.Sprintf("long-%02d-", i)
	return s + strings.Repeat("l", 200-len(s))
}

// TestMountPathMax checks that a volume's depth is bounded by nothing but
// the kernel's own limits, whatever the length of the volume's path on the
// backing store: a tree about twice PATH_MAX deep, walked with *at() calls
// from directory fds, supports every operation at its bottom, and a single
// path of PATH_MAX-1 bytes from the volume's directory works while one of
// PATH_MAX gives ENAMETOOLONG and leaves nothing behind. On the snapshot
// volume most of the deep tree comes from the lower layer, so operations
// at depth copy up a deep chain of lower directories; the lower layer
// itself never changes.
func TestMountPathMax(t *testing.T) {
	tm := newTestMount(t)
	var lower string
	snapshot := snapshotVolume(t, tm, func(string) {
		// Seeded on the backing store: through the mount, the seeding
		// itself would need what this test checks.
		lower = tm.store.LayerPath(mustState(t, tm.store, "old").Volumes["alloc/data"].Upper)
		seedDeepTree(t, lower)
	})
	if got := tm.store.LayerPath(mustState(t, tm.store, "new").Volumes["alloc/data"].Lowers[0]); got != lower {
		t.Fatalf("snapshot volume's lower layer is %s, want the seeded %s", got, lower)
	}
	prev, next := migrationFixture(t, tm)
	if n, err := tm.store.Migrate(prev, next, migratedKeys, store.MigrationAdopt); err != nil || n != len(migratedKeys) {
		t.Fatalf("Remap: %d volumes, %v; want %d", n, err, len(migratedKeys))
	}
	lowerBefore := treeAt(t, lower)
	for _, k := range []struct {
		name, dir string
		seeded    int
	}{
		{"plain", filepath.Join(tm.dir, "new/alloc/logs"), 0},
		{"adopted", filepath.Join(tm.dir, next, "alloc/data"), 0},
		{"snapshot", snapshot, seededLevels},
		{"memory", filepath.Join(tm.dir, "new/web/secrets"), 0},
	} {
		t.Run(k.name, func(t *testing.T) {
			t.Run("deep", func(t *testing.T) { testDeepTree(t, k.dir, k.seeded) })
			t.Run("long-path", func(t *testing.T) { testLongPath(t, k.dir) })
			if k.seeded > 0 {
				if got := treeAt(t, lower); got != lowerBefore {
					t.Errorf("the lower layer changed:\n%s\nwas:\n%s", got, lowerBefore)
				}
			}
		})
	}
}

// testDeepTree builds deepLevels directories below dir one at a time, each
// made and opened relative to its parent's fd (the first seeded levels
// exist already), works at the bottom, and removes it all bottom-up.
func testDeepTree(t *testing.T, dir string, seeded int) {
	volfd := openDirFd(t, dir)
	// The deep tree's top is all it adds to the volume, or all of the
	// lower layer's it removes.
	var want []string
	for _, name := range namesAt(t, volfd) {
		if name != deepName(0) {
			want = append(want, name)
		}
	}
	// fds[i] is the directory at level i-1; fds[0] the volume's.
	fds := []int{volfd}
	// closers[i] closes fds[i+1], at once or when the test ends.
	var closers []func()
	for i := 0; i < deepLevels; i++ {
		name, parent := deepName(i), fds[len(fds)-1]
		// The path from the volume's directory to this level.
		depth := (i+1)*200 - 1
		err := unix.Mkdirat(parent, name, 0o755)
		if i < seeded {
			if !errors.Is(err, unix.EEXIST) {
				t.Fatalf("mkdirat of lower level %d (a %d-byte path): %v, want EEXIST", i, depth, err)
			}
		} else if err != nil {
			t.Fatalf("mkdirat at level %d (a %d-byte path): %v", i, depth, err)
		}
		fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("openat O_DIRECTORY at level %d (a %d-byte path): %v", i, depth, err)
		}
		fds = append(fds, fd)
		closers = append(closers, fdCloser(t, fd))
	}
	bottom := fds[len(fds)-1]
	workAtBottom(t, bottom)
	if seeded > 0 {
		// Making level seeded below the lower chain copied it up; now
		// the lower file at the chain's end is copied up too.
		lowest := fds[seeded]
		if got := namesAt(t, lowest); strings.Join(got, ",") != deepName(seeded)+","+seededFile {
			t.Errorf("deepest lower directory lists %v, want %s and %s", got, deepName(seeded)[:9]+"...", seededFile)
		}
		if got := readAt(t, lowest, seededFile); got != seededContent {
			t.Errorf("lower file read at depth: %q, want %q", got, seededContent)
		}
		fd, err := unix.Openat(lowest, seededFile, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatalf("open the lower file for append at depth: %v", err)
		}
		_, err = unix.Write(fd, []byte("appended\n"))
		unix.Close(fd)
		if err != nil {
			t.Fatalf("append to the lower file at depth: %v", err)
		}
		if got := readAt(t, lowest, seededFile); got != seededContent+"appended\n" {
			t.Errorf("lower file after an append at depth: %q", got)
		}
		if err := unix.Unlinkat(lowest, seededFile, 0); err != nil {
			t.Fatalf("unlinkat of the copied-up lower file: %v", err)
		}
		expectGone(t, lowest, seededFile)
	}
	for i := deepLevels - 1; i >= 0; i-- {
		closers[i]()
		if err := unix.Unlinkat(fds[i], deepName(i), unix.AT_REMOVEDIR); err != nil {
			t.Fatalf("unlinkat AT_REMOVEDIR at level %d: %v", i, err)
		}
		expectGone(t, fds[i], deepName(i))
	}
	if after := namesAt(t, volfd); strings.Join(after, ",") != strings.Join(want, ",") {
		t.Errorf("volume lists %v after the deep tree was removed, want %v", after, want)
	}
}

// workAtBottom makes, reads, renames, links, symlinks, tags and removes
// entries in the directory open as dirfd.
func workAtBottom(t *testing.T, dirfd int) {
	const payload = "written at the bottom\n"
	fd, err := unix.Openat(dirfd, "file", unix.O_CREAT|unix.O_EXCL|unix.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("openat O_CREAT at the bottom: %v", err)
	}
	closeFile := fdCloser(t, fd)
	if n, err := unix.Write(fd, []byte(payload)); err != nil || n != len(payload) {
		t.Fatalf("write at the bottom: %d, %v", n, err)
	}
	buf := make([]byte, 64)
	if n, err := unix.Pread(fd, buf, 0); err != nil || string(buf[:n]) != payload {
		t.Errorf("pread at the bottom: %q, %v; want %q", buf[:max(n, 0)], err, payload)
	}
	if err := unix.Fsetxattr(fd, "user.pathmax", []byte("file-tag"), 0); err != nil {
		t.Errorf("fsetxattr of the file at the bottom: %v", err)
	}
	if err := unix.Fsetxattr(dirfd, "user.pathmax", []byte("dir-tag"), 0); err != nil {
		t.Errorf("fsetxattr of the bottom directory: %v", err)
	}
	if got := fgetxattr(dirfd, "user.pathmax"); got != "dir-tag" {
		t.Errorf("fgetxattr of the bottom directory: %q, want dir-tag", got)
	}
	var fst unix.Stat_t
	must(t, unix.Fstat(fd, &fst))
	closeFile()

	st, err := fstatat(dirfd, "file")
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(payload)) || st.Ino != fst.Ino {
		t.Errorf("fstatat at the bottom: mode %o size %d ino %d, %v; want a file of %d bytes, ino %d", st.Mode, st.Size, st.Ino, err, len(payload), fst.Ino)
	}
	if err := unix.Renameat(dirfd, "file", dirfd, "renamed"); err != nil {
		t.Fatalf("renameat at the bottom: %v", err)
	}
	expectGone(t, dirfd, "file")
	if st, err := fstatat(dirfd, "renamed"); err != nil || st.Ino != fst.Ino {
		t.Errorf("renamed file: ino %d, %v; want ino %d", st.Ino, err, fst.Ino)
	}
	if err := unix.Linkat(dirfd, "renamed", dirfd, "link", 0); err != nil {
		t.Fatalf("linkat at the bottom: %v", err)
	}
	if st, err := fstatat(dirfd, "link"); err != nil || st.Ino != fst.Ino || st.Nlink != 2 {
		t.Errorf("hard link: ino %d nlink %d, %v; want ino %d, 2 links", st.Ino, st.Nlink, err, fst.Ino)
	}
	if err := unix.Symlinkat("renamed", dirfd, "sym"); err != nil {
		t.Fatalf("symlinkat at the bottom: %v", err)
	}
	if n, err := unix.Readlinkat(dirfd, "sym", buf); err != nil || string(buf[:n]) != "renamed" {
		t.Errorf("readlinkat at the bottom: %q, %v; want %q", buf[:max(n, 0)], err, "renamed")
	}
	if got := readAt(t, dirfd, "sym"); got != payload {
		t.Errorf("read through the symbolic link: %q, want %q", got, payload)
	}
	fd, err = unix.Openat(dirfd, "link", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("openat of the link: %v", err)
	}
	got := fgetxattr(fd, "user.pathmax")
	unix.Close(fd)
	if got != "file-tag" {
		t.Errorf("fgetxattr through the link: %q, want file-tag", got)
	}
	if got := namesAt(t, dirfd); strings.Join(got, ",") != "link,renamed,sym" {
		t.Errorf("bottom directory lists %v, want link, renamed, sym", got)
	}
	for _, name := range []string{"sym", "link", "renamed"} {
		if err := unix.Unlinkat(dirfd, name, 0); err != nil {
			t.Fatalf("unlinkat %s at the bottom: %v", name, err)
		}
		expectGone(t, dirfd, name)
	}
	if got := namesAt(t, dirfd); len(got) != 0 {
		t.Errorf("bottom directory lists %v after the unlinks, want nothing", got)
	}
}

// testLongPath works with a single path of PATH_MAX-1 bytes relative to
// the volume's directory, and refuses one of PATH_MAX.
func testLongPath(t *testing.T, dir string) {
	volfd := openDirFd(t, dir)
	before := namesAt(t, volfd)
	var dirs []string
	prefix := ""
	for i := 0; i < longLevels; i++ {
		if prefix != "" {
			prefix += "/"
		}
		prefix += longName(i)
		if err := unix.Mkdirat(volfd, prefix, 0o755); err != nil {
			t.Fatalf("mkdirat of a %d-byte path: %v", len(prefix), err)
		}
		dirs = append(dirs, prefix)
	}
	last := pathMax - 1 - len(prefix) - 1
	longRel := prefix + "/" + strings.Repeat("a", last)
	longRel2 := prefix + "/" + strings.Repeat("b", last)
	tooLong := prefix + "/" + strings.Repeat("c", last+1)
	if len(longRel) != pathMax-1 || len(tooLong) != pathMax || last+1 > volume.MaxNameLen {
		t.Fatalf("paths of %d and %d bytes, last name %d: the test is wrong", len(longRel), len(tooLong), last+1)
	}

	const payload = "at PATH_MAX-1\n"
	fd, err := unix.Openat(volfd, longRel, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	if err != nil {
		t.Fatalf("openat O_CREAT of a %d-byte path: %v", len(longRel), err)
	}
	_, err = unix.Write(fd, []byte(payload))
	unix.Close(fd)
	if err != nil {
		t.Fatalf("write through a %d-byte path: %v", len(longRel), err)
	}
	st, err := fstatat(volfd, longRel)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(len(payload)) {
		t.Fatalf("fstatat of a %d-byte path: mode %o size %d, %v; want a file of %d bytes", len(longRel), st.Mode, st.Size, err, len(payload))
	}
	if got := readAt(t, volfd, longRel); got != payload {
		t.Errorf("read through a %d-byte path: %q, want %q", len(longRel), got, payload)
	}
	if err := unix.Renameat(volfd, longRel, volfd, longRel2); err != nil {
		t.Fatalf("renameat between %d-byte paths: %v", len(longRel), err)
	}
	expectGone(t, volfd, longRel)
	if st2, err := fstatat(volfd, longRel2); err != nil || st2.Ino != st.Ino {
		t.Errorf("renamed file: ino %d, %v; want ino %d", st2.Ino, err, st.Ino)
	}

	for _, c := range []struct {
		how string
		do  func() error
	}{
		{"openat O_CREAT", func() error {
			fd, err := unix.Openat(volfd, tooLong, unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"mkdirat", func() error { return unix.Mkdirat(volfd, tooLong, 0o755) }},
		{"symlinkat", func() error { return unix.Symlinkat("target", volfd, tooLong) }},
		{"renameat", func() error { return unix.Renameat(volfd, longRel2, volfd, tooLong) }},
		{"linkat", func() error { return unix.Linkat(volfd, longRel2, volfd, tooLong, 0) }},
		{"fstatat", func() error { _, err := fstatat(volfd, tooLong); return err }},
	} {
		if err := c.do(); !errors.Is(err, unix.ENAMETOOLONG) {
			t.Errorf("%s of a %d-byte path: %v, want ENAMETOOLONG", c.how, len(tooLong), err)
		}
	}
	if st2, err := fstatat(volfd, longRel2); err != nil || st2.Ino != st.Ino || st2.Nlink != 1 {
		t.Errorf("file after the refused operations: ino %d nlink %d, %v; want ino %d, 1 link", st2.Ino, st2.Nlink, err, st.Ino)
	}
	bottom, err := unix.Openat(volfd, prefix, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("openat of the %d-byte directory: %v", len(prefix), err)
	}
	closeBottom := fdCloser(t, bottom)
	if got := namesAt(t, bottom); len(got) != 1 || got[0] != strings.Repeat("b", last) {
		t.Errorf("directory lists %d entries after the refused operations, want only the renamed file", len(got))
	}
	if err := unix.Unlinkat(volfd, longRel2, 0); err != nil {
		t.Fatalf("unlinkat of a %d-byte path: %v", len(longRel2), err)
	}
	expectGone(t, volfd, longRel2)
	if got := namesAt(t, bottom); len(got) != 0 {
		t.Errorf("directory lists %d entries after the unlink, want none", len(got))
	}
	closeBottom()
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := unix.Unlinkat(volfd, dirs[i], unix.AT_REMOVEDIR); err != nil {
			t.Fatalf("unlinkat AT_REMOVEDIR of a %d-byte path: %v", len(dirs[i]), err)
		}
	}
	if after := namesAt(t, volfd); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Errorf("volume lists %v after the long path was removed, want %v", after, before)
	}
}

// seedDeepTree makes the first seededLevels directories of the deep tree
// in root, on the backing store, and seededFile in the deepest.
func seedDeepTree(t *testing.T, root string) {
	t.Helper()
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	must(t, err)
	closeFd := fdCloser(t, fd)
	for i := 0; i < seededLevels; i++ {
		must(t, unix.Mkdirat(fd, deepName(i), 0o755))
		child, err := unix.Openat(fd, deepName(i), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		must(t, err)
		closeFd()
		fd, closeFd = child, fdCloser(t, child)
	}
	defer closeFd()
	f, err := unix.Openat(fd, seededFile, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	must(t, err)
	_, err = unix.Write(f, []byte(seededContent))
	unix.Close(f)
	must(t, err)
}

// treeAt describes the tree at root, however deep, for a before-and-after
// comparison: names, modes, sizes, link counts, change and modification
// times, contents, link targets and xattrs. It walks with fds, as
// filepath.Walk would fail past PATH_MAX.
func treeAt(t *testing.T, root string) string {
	t.Helper()
	fd := openDirFd(t, root)
	lines := []string{". " + xattrsOf(t, fd)}
	var walk func(dirfd int, rel string)
	walk = func(dirfd int, rel string) {
		for _, name := range namesAt(t, dirfd) {
			p := rel + "/" + name
			st, err := fstatat(dirfd, name)
			must(t, err)
			line := fmt.Sprintf("%s mode=%o nlink=%d size=%d mtime=%d ctime=%d", p, st.Mode, st.Nlink, st.Size, st.Mtim.Nano(), st.Ctim.Nano())
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				cfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				must(t, err)
				lines = append(lines, line+" "+xattrsOf(t, cfd))
				walk(cfd, p)
				unix.Close(cfd)
				continue
			case unix.S_IFREG:
				cfd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				must(t, err)
				f := os.NewFile(uintptr(cfd), name)
				var b bytes.Buffer
				_, err = b.ReadFrom(f)
				line += fmt.Sprintf(" %s %q", xattrsOf(t, cfd), b.String())
				f.Close()
				must(t, err)
			case unix.S_IFLNK:
				buf := make([]byte, pathMax)
				n, err := unix.Readlinkat(dirfd, name, buf)
				must(t, err)
				line += " -> " + string(buf[:n])
			}
			lines = append(lines, line)
		}
	}
	walk(fd, ".")
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// xattrsOf lists the xattrs of the file open as fd with their values.
func xattrsOf(t *testing.T, fd int) string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Flistxattr(fd, buf)
	must(t, err)
	var out []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name != "" {
			out = append(out, fmt.Sprintf("%s=%q", name, fgetxattr(fd, name)))
		}
	}
	sort.Strings(out)
	return "xattrs[" + strings.Join(out, " ") + "]"
}

// fgetxattr returns the value of xattr name of fd, or the error's text.
func fgetxattr(fd int, name string) string {
	buf := make([]byte, 64<<10)
	n, err := unix.Fgetxattr(fd, name, buf)
	if err != nil {
		return "error: " + err.Error()
	}
	return string(buf[:n])
}

// openDirFd opens dir, a short path, as a directory fd closed when the
// test ends.
func openDirFd(t *testing.T, dir string) int {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", dir, err)
	}
	fdCloser(t, fd)
	return fd
}

// fdCloser returns a function that closes fd once, however often it is
// called; it is also called when the test ends, so that a failing test
// leaves nothing open on the mount it unmounts.
func fdCloser(t *testing.T, fd int) func() {
	var once sync.Once
	c := func() { once.Do(func() { unix.Close(fd) }) }
	t.Cleanup(c)
	return c
}

// namesAt lists the directory open as dirfd, sorted, through a fresh
// descriptor so that dirfd's own offset is untouched.
func namesAt(t *testing.T, dirfd int) []string {
	t.Helper()
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open a directory to list it: %v", err)
	}
	f := os.NewFile(uintptr(fd), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		t.Fatalf("list a directory: %v", err)
	}
	sort.Strings(names)
	return names
}

// readAt reads the file at rel from dirfd.
func readAt(t *testing.T, dirfd int, rel string) string {
	t.Helper()
	fd, err := unix.Openat(dirfd, rel, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("openat for reading (%d-byte path): %v", len(rel), err)
	}
	f := os.NewFile(uintptr(fd), "file")
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(f); err != nil {
		t.Fatalf("read (%d-byte path): %v", len(rel), err)
	}
	return b.String()
}

func fstatat(dirfd int, rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, rel, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// expectGone checks that rel no longer exists below dirfd.
func expectGone(t *testing.T, dirfd int, rel string) {
	t.Helper()
	if _, err := fstatat(dirfd, rel); !errors.Is(err, unix.ENOENT) {
		t.Errorf("fstatat of a removed %d-byte path: %v, want ENOENT", len(rel), err)
	}
}
