package fs

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// The cases below extend memCases with the POSIX behaviour of tmpfs that
// a memory volume has to match: device nodes, hard links, files unlinked
// while open, directory link counts and sizes, and the times each
// operation changes.

func init() {
	for name, c := range memPosixCases {
		memCases[name] = c
	}
}

// statOf describes what stat shows of a node, apart from its times and
// inode number: type and mode, links, size, blocks, owner and device.
func statOf(st *unix.Stat_t) string {
	return fmt.Sprintf("mode=%o nlink=%d size=%d blocks=%d uid=%d gid=%d rdev=%d:%d",
		st.Mode, st.Nlink, st.Size, st.Blocks, st.Uid, st.Gid, unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// lstatLine records the lstat of path.
func lstatLine(tr *transcript, dir, name string) {
	var st unix.Stat_t
	err := unix.Lstat(filepath.Join(dir, name), &st)
	tr.add("lstat "+name, err, statOf(&st))
}

// timeChange says which of mtime and ctime changed between two stats.
func timeChange(a, b *unix.Stat_t) string {
	out := ""
	if a.Mtim != b.Mtim {
		out += "m"
	}
	if a.Ctim != b.Ctim {
		out += "c"
	}
	if out == "" {
		return "-"
	}
	return out
}

// timed runs op and records its error and, for each of names (relative to
// dir), whether it changed the node's mtime and ctime and what stat shows
// of it after. Nodes are held by O_PATH fds across op, so that a node
// renamed or unlinked by op is still the one looked at. It waits a little
// before op so that a changed time cannot equal the old one.
func timed(t *testing.T, tr *transcript, dir, what string, op func() error, names ...string) {
	t.Helper()
	fds := make([]int, len(names))
	before := make([]unix.Stat_t, len(names))
	for i, name := range names {
		fd, err := unix.Open(filepath.Join(dir, name), unix.O_PATH|unix.O_NOFOLLOW, 0)
		if err != nil {
			t.Fatalf("%s: hold %s: %v", what, name, err)
		}
		defer unix.Close(fd)
		fds[i] = fd
		if err := unix.Fstat(fd, &before[i]); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(15 * time.Millisecond)
	err := op()
	var res []any
	for i, name := range names {
		var st unix.Stat_t
		if err := unix.Fstat(fds[i], &st); err != nil {
			res = append(res, name+":"+errName(err))
			continue
		}
		res = append(res, fmt.Sprintf("[%s %s nlink=%d]", name, timeChange(&before[i], &st), st.Nlink))
	}
	tr.add(what, err, res...)
}

// ffreeLine records the free entries of the volume.
func ffreeLine(tr *transcript, dir string) {
	var st unix.Statfs_t
	err := unix.Statfs(dir, &st)
	tr.add("statfs", err, fmt.Sprintf("files=%d ffree=%d", st.Files, st.Ffree))
}

func mkdirs(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

var memPosixCases = map[string]func(t *testing.T, dir string) *transcript{
	"DeviceNodes": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		tr.add("mknod char", unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		tr.add("mknod block", unix.Mknod(p("loop"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
		tr.add("mknod whiteout", unix.Mknod(p("wh"), unix.S_IFCHR, 0))
		tr.add("mknod fifo", unix.Mknod(p("fifo"), unix.S_IFIFO|0o640, 0))
		tr.add("mknod socket", unix.Mknod(p("sock"), unix.S_IFSOCK|0o755, 0))
		tr.add("mknod regular", unix.Mknod(p("reg"), unix.S_IFREG|0o600, 0))
		tr.add("mknod regular, type 0", unix.Mknod(p("reg0"), 0o600, 0))
		tr.add("mknod dir", unix.Mknod(p("dir"), unix.S_IFDIR|0o755, 0))
		tr.add("mknod existing", unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
		for _, n := range []string{"null", "loop", "wh", "fifo", "sock", "reg", "reg0"} {
			lstatLine(tr, dir, n)
		}
		for _, n := range []string{"null", "loop", "wh"} {
			for _, flags := range []int{unix.O_RDONLY, unix.O_WRONLY, unix.O_PATH} {
				fd, err := unix.Open(p(n), flags|unix.O_NONBLOCK, 0)
				if err == nil {
					unix.Close(fd)
				}
				tr.add(fmt.Sprintf("open %s %#o", n, flags), err)
			}
		}
		fd, err := unix.Open(p("fifo"), unix.O_RDWR, 0)
		if err == nil {
			_, err = unix.Write(fd, []byte("through the fifo"))
			buf := make([]byte, 64)
			n, rerr := unix.Read(fd, buf)
			tr.add("fifo read", rerr, string(buf[:max(n, 0)]))
			unix.Close(fd)
		}
		tr.add("fifo write", err)
		fd, err = unix.Open(p("reg"), unix.O_RDWR, 0)
		if err == nil {
			_, err = unix.Write(fd, []byte("data"))
			unix.Close(fd)
		}
		tr.add("write a mknod'd file", err)
		lstatLine(tr, dir, "reg")
		ffreeLine(tr, dir)
		return tr
	},
	"HardLinks": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		mkdirs(t, dir, "d")
		writeFile(t, p("f"), "shared data")
		ffreeLine(tr, dir)
		timed(t, tr, dir, "link f g", func() error { return os.Link(p("f"), p("g")) }, "f", ".")
		timed(t, tr, dir, "link f d/h", func() error { return os.Link(p("f"), p("d/h")) }, "f", ".", "d")
		ffreeLine(tr, dir)
		lstatLine(tr, dir, "g")
		var a, b unix.Stat_t
		unix.Stat(p("f"), &a)
		unix.Stat(p("d/h"), &b)
		tr.add("same inode", nil, a.Ino == b.Ino)
		writeFile(t, p("g"), "new data via g")
		got, err := os.ReadFile(p("d/h"))
		tr.add("read via d/h", err, string(got))
		tr.add("link to an existing name", os.Link(p("f"), p("g")))
		tr.add("link a directory", os.Link(p("d"), p("d2")))
		tr.add("link a missing file", os.Link(p("none"), p("n2")))
		tr.add("link a 256-byte name", os.Link(p("f"), p(strings.Repeat("n", 256))))
		tr.add("symlink", os.Symlink("f", p("s")))
		tr.add("link the symlink", unix.Linkat(unix.AT_FDCWD, p("s"), unix.AT_FDCWD, p("s2"), 0))
		tr.add("link through the symlink", unix.Linkat(unix.AT_FDCWD, p("s"), unix.AT_FDCWD, p("s3"), unix.AT_SYMLINK_FOLLOW))
		tr.add("mkfifo", unix.Mkfifo(p("p"), 0o600))
		tr.add("link the fifo", os.Link(p("p"), p("p2")))
		for _, n := range []string{"f", "s", "s2", "s3", "p", "p2"} {
			lstatLine(tr, dir, n)
		}
		ffreeLine(tr, dir)
		timed(t, tr, dir, "unlink f", func() error { return os.Remove(p("f")) }, "g", ".")
		got, err = os.ReadFile(p("g"))
		tr.add("read via g", err, string(got))
		timed(t, tr, dir, "rename g over d/h", func() error { return unix.Rename(p("g"), p("d/h")) }, "s3", ".", "d")
		lstatLine(tr, dir, "d/h")
		lstatLine(tr, dir, "g")
		for _, n := range []string{"d/h", "s3", "s", "s2", "p", "p2"} {
			tr.add("unlink "+n, os.Remove(p(n)))
			ffreeLine(tr, dir)
		}
		return tr
	},
	"LinksAtTheEntryCap": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		writeFile(t, p("f"), "x")
		var i int
		var err error
		for i = 0; i < 1000; i++ {
			if err = os.Link(p("f"), p(fmt.Sprintf("l%d", i))); err != nil {
				break
			}
		}
		tr.add("link until refused", err, i)
		ffreeLine(tr, dir)
		lstatLine(tr, dir, "f")
		entries, err := os.ReadDir(dir)
		tr.add("readdir", err, len(entries))
		timed(t, tr, dir, "link at the cap", func() error { return os.Link(p("f"), p("one-more")) }, "f", ".")
		tr.add("create at the cap", os.WriteFile(p("new"), nil, 0o644))
		tr.add("unlink f", os.Remove(p("f")))
		ffreeLine(tr, dir)
		tr.add("link after unlink", os.Link(p("l0"), p("one-more")))
		lstatLine(tr, dir, "one-more")
		ffreeLine(tr, dir)
		return tr
	},
	"UnlinkedWhileOpen": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		data := bytes.Repeat([]byte("0123456789"), 1000)
		writeFile(t, p("f"), string(data))
		fd, err := os.OpenFile(p("f"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		ffreeLine(tr, dir)
		tr.add("unlink", os.Remove(p("f")))
		var st unix.Stat_t
		err = unix.Fstat(int(fd.Fd()), &st)
		tr.add("fstat", err, statOf(&st))
		ffreeLine(tr, dir)
		buf := make([]byte, len(data)+10)
		n, err := fd.ReadAt(buf, 0)
		tr.add("read", nil, errName(err), n, bytes.Equal(buf[:n], data))
		_, err = fd.WriteAt([]byte("more"), 20000)
		tr.add("write", err)
		err = unix.Fstat(int(fd.Fd()), &st)
		tr.add("fstat", err, statOf(&st))
		n, err = fd.ReadAt(buf[:4], 20000)
		tr.add("read back", err, string(buf[:n]))
		tr.add("ftruncate", fd.Truncate(5))
		err = unix.Fstat(int(fd.Fd()), &st)
		tr.add("fstat", err, statOf(&st))
		tr.add("reopen through /proc", func() error {
			f2, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd.Fd()), os.O_RDONLY, 0)
			if err != nil {
				return err
			}
			got := make([]byte, 10)
			n, _ := f2.Read(got)
			tr.add("read the reopened file", nil, string(got[:n]))
			return f2.Close()
		}())
		tr.add("link it back", unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd.Fd()), unix.AT_FDCWD, p("back"), unix.AT_SYMLINK_FOLLOW))
		var sf unix.Statfs_t
		unix.Statfs(dir, &sf)
		tr.add("close", fd.Close())
		// A FUSE release reaches the daemon after close returns: wait
		// (a while, then report what is there) for the entry to return.
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var now unix.Statfs_t
			if unix.Statfs(dir, &now) != nil || now.Ffree > sf.Ffree {
				break
			}
		}
		ffreeLine(tr, dir)
		return tr
	},
	"DirectoryLinksAndSize": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		var st unix.Stat_t
		root := func() {
			err := unix.Lstat(dir, &st)
			tr.add("root", err, fmt.Sprintf("nlink=%d size=%d blocks=%d", st.Nlink, st.Size, st.Blocks))
		}
		root()
		mkdirs(t, dir, "a", "a/b", "a/c", "e")
		writeFile(t, p("a/f"), "")
		root()
		lstatLine(tr, dir, "a")
		lstatLine(tr, dir, "a/b")
		timed(t, tr, dir, "rename a/b to e/b", func() error { return unix.Rename(p("a/b"), p("e/b")) }, "a", "e", "a/b")
		lstatLine(tr, dir, "a")
		lstatLine(tr, dir, "e")
		timed(t, tr, dir, "rename e/b over empty a/c", func() error { return unix.Rename(p("e/b"), p("a/c")) }, "a", "e", "e/b", "a/c")
		lstatLine(tr, dir, "a")
		lstatLine(tr, dir, "e")
		timed(t, tr, dir, "exchange a/c and f", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("a/c"), unix.AT_FDCWD, p("a/f"), unix.RENAME_EXCHANGE)
		}, "a", "a/c", "a/f")
		timed(t, tr, dir, "exchange a/c (file) and e (dir)", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("a/c"), unix.AT_FDCWD, p("e"), unix.RENAME_EXCHANGE)
		}, "a", ".", "a/c", "e")
		root()
		lstatLine(tr, dir, "a")
		d, err := os.Open(p("a/c"))
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		tr.add("rmdir a non-empty directory", os.Remove(p("a")))
		timed(t, tr, dir, "rmdir the open a/c", func() error { return os.Remove(p("a/c")) }, "a", "a/c")
		err = unix.Fstat(int(d.Fd()), &st)
		tr.add("fstat the removed directory", err, fmt.Sprintf("nlink=%d size=%d", st.Nlink, st.Size))
		tr.add("create in it", unix.Mkdirat(int(d.Fd()), "x", 0o755))
		lstatLine(tr, dir, "a")
		root()
		return tr
	},
	"RenameTimesAndErrors": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		mkdirs(t, dir, "d", "e", "full", "full/x")
		for _, n := range []string{"f", "g", "d/h"} {
			writeFile(t, p(n), n)
		}
		tr.add("symlink", os.Symlink("f", p("s")))
		timed(t, tr, dir, "rename f to f2", func() error { return unix.Rename(p("f"), p("f2")) }, "f", ".")
		timed(t, tr, dir, "rename f2 to d/f", func() error { return unix.Rename(p("f2"), p("d/f")) }, "f2", ".", "d")
		timed(t, tr, dir, "rename g over d/h", func() error { return unix.Rename(p("g"), p("d/h")) }, "g", "d/h", ".", "d")
		timed(t, tr, dir, "rename the symlink", func() error { return unix.Rename(p("s"), p("e/s")) }, "s", ".", "e")
		timed(t, tr, dir, "noreplace over d/f", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("d/h"), unix.AT_FDCWD, p("d/f"), unix.RENAME_NOREPLACE)
		}, "d/h", "d/f", "d")
		timed(t, tr, dir, "noreplace to a new name", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("d/h"), unix.AT_FDCWD, p("d/h2"), unix.RENAME_NOREPLACE)
		}, "d/h", "d")
		timed(t, tr, dir, "exchange across directories", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("d/h2"), unix.AT_FDCWD, p("e/s"), unix.RENAME_EXCHANGE)
		}, "d/h2", "e/s", "d", "e")
		timed(t, tr, dir, "exchange with a missing name", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("d/f"), unix.AT_FDCWD, p("e/none"), unix.RENAME_EXCHANGE)
		}, "d/f", "d", "e")
		timed(t, tr, dir, "exchange and noreplace", func() error {
			return unix.Renameat2(unix.AT_FDCWD, p("d/f"), unix.AT_FDCWD, p("e/s"), unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE)
		}, "d/f", "d")
		timed(t, tr, dir, "dir over non-empty dir", func() error { return unix.Rename(p("e"), p("full")) }, "e", "full", ".")
		timed(t, tr, dir, "file over dir", func() error { return unix.Rename(p("d/f"), p("e")) }, "d/f", "e", ".")
		timed(t, tr, dir, "dir over file", func() error { return unix.Rename(p("e"), p("d/f")) }, "e", "d/f", ".")
		timed(t, tr, dir, "dir into itself", func() error { return unix.Rename(p("full"), p("full/x/y")) }, "full", ".")
		timed(t, tr, dir, "missing source", func() error { return unix.Rename(p("none"), p("other")) }, ".")
		timed(t, tr, dir, "to a 256-byte name", func() error { return unix.Rename(p("d/f"), p(strings.Repeat("n", 256))) }, "d/f", ".", "d")
		timed(t, tr, dir, "to a 255-byte name", func() error { return unix.Rename(p("d/f"), p(strings.Repeat("n", 255))) }, "d/f", ".", "d")
		timed(t, tr, dir, "rmdir non-empty", func() error { return os.Remove(p("full")) }, "full", ".")
		return tr
	},
	"SizesPastTheCap": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		writeFile(t, p("f"), "")
		timed(t, tr, dir, "truncate to 1.2 MB", func() error { return os.Truncate(p("f"), 1_200_000) }, "f")
		lstatLine(tr, dir, "f")
		timed(t, tr, dir, "truncate to the same size", func() error { return os.Truncate(p("f"), 1_200_000) }, "f")
		tr.add("truncate to -1", unix.Truncate(p("f"), -1))
		tr.add("truncate to the largest size", unix.Truncate(p("f"), math.MaxInt64))
		lstatLine(tr, dir, "f")
		fd, err := os.OpenFile(p("f"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		n, err := unix.Pwrite(int(fd.Fd()), []byte("abcdef"), math.MaxInt64-3)
		tr.add("write across the largest size", err, n)
		n, err = unix.Pwrite(int(fd.Fd()), []byte("abc"), math.MaxInt64)
		tr.add("write at the largest size", err, n)
		n, err = unix.Pwrite(int(fd.Fd()), []byte("abc"), 1<<62)
		tr.add("write at 4 EiB", err, n)
		lstatLine(tr, dir, "f")
		// Not an empty file: without FUSE_ATOMIC_O_TRUNC the kernel
		// sends the daemon the same SETATTR for open(O_TRUNC) as for
		// truncate(2), and tmpfs changes no time when truncate(2)
		// keeps the size, so an empty file's times stay.
		tr.add("truncate", fd.Truncate(10))
		timed(t, tr, dir, "open O_TRUNC", func() error {
			f, err := os.OpenFile(p("f"), os.O_RDWR|os.O_TRUNC, 0)
			if err == nil {
				f.Close()
			}
			return err
		}, "f")
		tr.add("fallocate 64 KiB", unix.Fallocate(int(fd.Fd()), 0, 0, 64<<10))
		lstatLine(tr, dir, "f")
		tr.add("fallocate past the cap", unix.Fallocate(int(fd.Fd()), 0, 0, 2<<20))
		lstatLine(tr, dir, "f")
		tr.add("fallocate keep size", unix.Fallocate(int(fd.Fd()), unix.FALLOC_FL_KEEP_SIZE, 64<<10, 64<<10))
		lstatLine(tr, dir, "f")
		tr.add("punch a hole", unix.Fallocate(int(fd.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 10000))
		lstatLine(tr, dir, "f")
		tr.add("punch without keep size", unix.Fallocate(int(fd.Fd()), unix.FALLOC_FL_PUNCH_HOLE, 0, 4096))
		tr.add("zero range", unix.Fallocate(int(fd.Fd()), unix.FALLOC_FL_ZERO_RANGE, 0, 4096))
		lstatLine(tr, dir, "f")
		return tr
	},
	"TimesAndModes": func(t *testing.T, dir string) *transcript {
		tr := &transcript{}
		p := func(n string) string { return filepath.Join(dir, n) }
		writeFile(t, p("f"), "x")
		tr.add("symlink", os.Symlink("f", p("s")))
		when := []unix.Timespec{{Sec: 1000, Nsec: 5}, {Sec: 2000, Nsec: 7}}
		timed(t, tr, dir, "utimensat", func() error { return unix.UtimesNanoAt(unix.AT_FDCWD, p("f"), when, 0) }, "f")
		var st unix.Stat_t
		unix.Lstat(p("f"), &st)
		tr.add("times", nil, st.Atim, st.Mtim)
		timed(t, tr, dir, "utimensat omit both", func() error {
			return unix.UtimesNanoAt(unix.AT_FDCWD, p("f"), []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}, 0)
		}, "f")
		timed(t, tr, dir, "utimensat now", func() error {
			return unix.UtimesNanoAt(unix.AT_FDCWD, p("f"), []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}, 0)
		}, "f")
		timed(t, tr, dir, "utimensat the symlink", func() error {
			return unix.UtimesNanoAt(unix.AT_FDCWD, p("s"), when, unix.AT_SYMLINK_NOFOLLOW)
		}, "s", "f")
		unix.Lstat(p("s"), &st)
		tr.add("symlink times", nil, st.Atim, st.Mtim)
		timed(t, tr, dir, "chmod 07755", func() error { return unix.Chmod(p("f"), 0o7755) }, "f")
		lstatLine(tr, dir, "f")
		timed(t, tr, dir, "chown to another group", func() error { return os.Chown(p("f"), -1, 4242) }, "f")
		lstatLine(tr, dir, "f")
		timed(t, tr, dir, "chmod 06755 with another group", func() error { return unix.Chmod(p("f"), 0o6755) }, "f")
		lstatLine(tr, dir, "f")
		timed(t, tr, dir, "write as root", func() error {
			f, err := os.OpenFile(p("f"), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.Write([]byte("y"))
			return err
		}, "f")
		lstatLine(tr, dir, "f")
		timed(t, tr, dir, "chown changing nothing", func() error { return os.Chown(p("f"), -1, -1) }, "f")
		lstatLine(tr, dir, "f")
		tr.add("chmod 06755", unix.Chmod(p("f"), 0o6755))
		timed(t, tr, dir, "chown to a user", func() error { return os.Chown(p("f"), 4242, -1) }, "f")
		lstatLine(tr, dir, "f")
		tr.add("mkdir 01777", unix.Mkdir(p("sticky"), 0o1777))
		tr.add("mkdir g+s", unix.Mkdir(p("sgid"), 0o2755))
		tr.add("chmod g+s", unix.Chmod(p("sgid"), 0o2755))
		tr.add("chown sgid", os.Chown(p("sgid"), -1, 4242))
		tr.add("create in sgid", func() error {
			fd, err := unix.Open(p("sgid/f"), unix.O_CREAT|unix.O_WRONLY, 0o2755)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}())
		tr.add("mkdir in sgid", os.Mkdir(p("sgid/d"), 0o755))
		for _, n := range []string{"sticky", "sgid", "sgid/f", "sgid/d"} {
			lstatLine(tr, dir, n)
		}
		return tr
	},
}

// pageSize is tmpfs's page.
const pageSize = 4096

// memUsed is what statfs of a memory volume says is used: bytes and
// entries (the root's not counted).
func memUsed(t *testing.T, dir string) (bytes int64, entries int64) {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Files-st.Ffree) - 1
}

// waitMemUsed waits (without asserting how long) until statfs of dir
// shows bytes used, for a release the kernel sends after close returns.
func waitMemUsed(t *testing.T, dir string, bytes int64) (int64, int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, e := memUsed(t, dir)
		if b == bytes || time.Now().After(deadline) {
			return b, e
		}
	}
}

// TestMemVolumeUnlinkedFileKeepsItsCharge: a file unlinked while open
// keeps its pages and its entry until its last close, and they all come
// back then, as on tmpfs: the daemon holds no descriptor of it past the
// task's.
func TestMemVolumeUnlinkedFileKeepsItsCharge(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/secrets")
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 3*pageSize)); err != nil {
		t.Fatal(err)
	}
	if b, e := memUsed(t, dir); b != 3*pageSize || e != 1 {
		t.Fatalf("with the file: %d bytes and %d entries used; want %d and 1", b, e, 3*pageSize)
	}
	if err := os.Remove(filepath.Join(dir, "f")); err != nil {
		t.Fatal(err)
	}
	if b, e := memUsed(t, dir); b != 3*pageSize || e != 1 {
		t.Errorf("after the unlink: %d bytes and %d entries used; want %d and 1", b, e, 3*pageSize)
	}
	buf := make([]byte, 3*pageSize)
	if n, err := f.ReadAt(buf, 0); err != nil || n != len(buf) {
		t.Errorf("read of the unlinked file: %d bytes, %v", n, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if b, e := waitMemUsed(t, dir, 0); b != 0 || e != 0 {
		t.Errorf("after the last close: %d bytes and %d entries used; want none", b, e)
	}
	if _, err := os.Lstat(filepath.Join(dir, "f")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("lstat of the unlinked name: got %v, want not-exist", err)
	}
}

// lateReleases delays every RELEASE by delay, as a daemon thread the
// scheduler leaves waiting on a loaded machine does: the kernel sends it
// in the background, after close() has returned.
type lateReleases struct {
	fuse.RawFileSystem
	delay time.Duration
}

func (l *lateReleases) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	time.Sleep(l.delay)
	l.RawFileSystem.Release(cancel, in)
}

// TestMemVolumeFreesAFileClosedBeforeItsUnlink: "close, unlink" frees a
// memory file once the close's RELEASE is in, even when it reaches the
// daemon after the UNLINK; a file still open through another descriptor
// keeps its pages.
func TestMemVolumeFreesAFileClosedBeforeItsUnlink(t *testing.T) {
	tm := newTestMountTuned(t, store.Options{}, func(o *MountOptions) {
		o.interpose = func(h fuse.RawFileSystem) fuse.RawFileSystem {
			return &lateReleases{RawFileSystem: h, delay: 50 * time.Millisecond}
		}
	})
	if _, err := tm.store.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a1/web/secrets")
	if err := os.WriteFile(filepath.Join(dir, "closed"), make([]byte, 3*pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "closed")); err != nil {
		t.Fatal(err)
	}
	if b, e := waitMemUsed(t, dir, 0); b != 0 || e != 0 {
		t.Errorf("after close and unlink: %d bytes and %d entries used, want none", b, e)
	}

	f, err := os.Create(filepath.Join(dir, "kept"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, pageSize)); err != nil {
		t.Fatal(err)
	}
	dup, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	// The close of the copy flushes the handle the other still uses.
	if err := unix.Close(dup); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "kept")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if b, _ := memUsed(t, dir); b != pageSize {
		t.Errorf("after unlink of a file still open: %d bytes used, want %d", b, pageSize)
	}
	buf := make([]byte, pageSize)
	if n, err := f.ReadAt(buf, 0); err != nil || n != pageSize {
		t.Errorf("read of the unlinked file: %d bytes, %v", n, err)
	}
}

// memNobodyCases run as the nobody user, in a helper process, after a
// setup as root: what the kernel and the volume refuse or drop for a
// caller without capabilities.
var memNobodyCases = map[string]struct {
	setup func(t *testing.T, dir string, uid, gid int)
	run   func(dir string) *transcript
}{
	"Mknod": {
		setup: func(t *testing.T, dir string, uid, gid int) {},
		run: func(dir string) *transcript {
			tr := &transcript{}
			p := func(n string) string { return filepath.Join(dir, n) }
			tr.add("mknod char", unix.Mknod(p("null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
			tr.add("mknod block", unix.Mknod(p("loop"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
			tr.add("mknod whiteout", unix.Mknod(p("wh"), unix.S_IFCHR, 0))
			tr.add("mknod fifo", unix.Mknod(p("fifo"), unix.S_IFIFO|0o640, 0))
			for _, n := range []string{"null", "loop", "wh", "fifo"} {
				lstatLine(tr, dir, n)
			}
			ffreeLine(tr, dir)
			return tr
		},
	},
	"SetidBits": {
		setup: func(t *testing.T, dir string, uid, gid int) {
			for _, n := range []string{"w", "t", "c", "g"} {
				p := filepath.Join(dir, n)
				writeFile(t, p, "data")
				if err := os.Chown(p, uid, gid); err != nil {
					t.Fatal(err)
				}
				if err := unix.Chmod(p, 0o6755); err != nil {
					t.Fatal(err)
				}
			}
			// g's group is one nobody is not in.
			if err := os.Chown(filepath.Join(dir, "g"), uid, 4242); err != nil {
				t.Fatal(err)
			}
		},
		run: func(dir string) *transcript {
			tr := &transcript{}
			p := func(n string) string { return filepath.Join(dir, n) }
			tr.add("write", func() error {
				f, err := os.OpenFile(p("w"), os.O_WRONLY, 0)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = f.Write([]byte("x"))
				return err
			}())
			tr.add("truncate", os.Truncate(p("t"), 2))
			tr.add("chown -1 -1", os.Chown(p("c"), -1, -1))
			tr.add("chmod g+s, not in the group", unix.Chmod(p("g"), 0o2755))
			for _, n := range []string{"w", "t", "c", "g"} {
				lstatLine(tr, dir, n)
			}
			return tr
		},
	},
}

// TestMemVolumeLikeTmpfsAsNobody runs memNobodyCases on both backends
// and wants the same results.
func TestMemVolumeLikeTmpfsAsNobody(t *testing.T) {
	if name := os.Getenv("ALLOCFS_MEMCASE"); name != "" {
		// The helper process: become nobody (Go applies it to every
		// thread, and leaving uid 0 drops every capability), then run.
		var uid, gid int
		fmt.Sscanf(os.Getenv("ALLOCFS_MEMCASE_AS"), "%d:%d", &uid, &gid)
		if err := unix.Setgroups(nil); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setgid(gid); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setuid(uid); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%s\n", memNobodyCases[name].run(os.Getenv("ALLOCFS_MEMCASE_DIR")))
		return
	}
	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no nobody user to run as")
	}
	backends := memBackends(t)
	for name, c := range memNobodyCases {
		t.Run(name, func(t *testing.T) {
			var got [2]string
			for i, b := range backends {
				dir := b.fresh(t)
				for p := dir; p != "/" && p != os.TempDir(); p = filepath.Dir(p) {
					if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o005 != 0o005 {
						if err := os.Chmod(p, fi.Mode().Perm()|0o005); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := os.Chown(dir, nobody.UID, nobody.GID); err != nil {
					t.Fatal(err)
				}
				c.setup(t, dir, nobody.UID, nobody.GID)
				cmd := exec.Command(os.Args[0], "-test.run=^TestMemVolumeLikeTmpfsAsNobody$")
				cmd.Env = append(os.Environ(), "ALLOCFS_MEMCASE="+name, "ALLOCFS_MEMCASE_DIR="+dir,
					fmt.Sprintf("ALLOCFS_MEMCASE_AS=%d:%d", nobody.UID, nobody.GID))
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("helper on %s: %v (output %q)", b.name, err, out)
				}
				// The helper's own test verdict follows the transcript.
				got[i], _, _ = strings.Cut(string(out), "\nPASS")
			}
			if got[0] != got[1] {
				t.Errorf("allocfs differs from tmpfs:\n--- tmpfs\n%s\n--- allocfs\n%s", got[0], got[1])
			} else {
				t.Logf("both:\n%s", got[1])
			}
		})
	}
}
