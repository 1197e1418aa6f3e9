package fs

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// TestMountOpenUnlinkedFiles checks that a file whose last name is
// unlinked while it is open still answers through its fd, as on a local
// filesystem: fstat shows no links, and fchmod, fchown and futimens
// (which reach the daemon without a handle) change it. Both a regular
// file (set-id, so served by the daemon) and a FIFO, whose opens the
// kernel serves itself, are checked.
func TestMountOpenUnlinkedFiles(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tm.dir, "a/alloc/data")
	for _, tc := range []struct {
		name string
		open func(p string) (int, error)
	}{
		{"set-id file", func(p string) (int, error) {
			return unix.Open(p, unix.O_RDWR|unix.O_CREAT, 04644)
		}},
		{"plain file", func(p string) (int, error) {
			return unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
		}},
		{"fifo", func(p string) (int, error) {
			if err := unix.Mkfifo(p, 0o644); err != nil {
				return -1, err
			}
			return unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK, 0)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, "f")
			fd, err := tc.open(p)
			must(t, err)
			defer unix.Close(fd)
			must(t, unix.Unlink(p))
			var st unix.Stat_t
			if err := unix.Fstat(fd, &st); err != nil || st.Nlink != 0 {
				t.Fatalf("fstat after unlink: nlink %d, %v; want 0 links", st.Nlink, err)
			}
			if err := unix.Fchown(fd, 4321, 4321); err != nil {
				t.Errorf("fchown after unlink: %v", err)
			}
			if err := unix.Fchmod(fd, 0o600); err != nil {
				t.Errorf("fchmod after unlink: %v", err)
			}
			ts := []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(1e18)}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), ts, 0); err != nil {
				t.Errorf("futimens after unlink: %v", err)
			}
			must(t, unix.Fstat(fd, &st))
			if st.Uid != 4321 || st.Gid != 4321 || st.Mode&07777 != 0o600 || st.Mtim.Nano() != 1e18 {
				t.Errorf("after the changes: owner %d:%d mode %o mtime %d; want 4321:4321 0600 %d", st.Uid, st.Gid, st.Mode&07777, st.Mtim.Nano(), int64(1e18))
			}
		})
	}
}

// TestMountOpenUnlinkedLowerFifo checks a FIFO of a lower layer, open,
// then unlinked and replaced by a rename: fstat through the open fd
// shows it with no links, as a local filesystem does.
func TestMountOpenUnlinkedLowerFifo(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(d string) {
		must(t, unix.Mkfifo(filepath.Join(d, "p"), 0o644))
	})
	p := filepath.Join(data, "p")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_NONBLOCK, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, os.WriteFile(filepath.Join(data, "new"), []byte("x"), 0o644))
	must(t, os.Rename(filepath.Join(data, "new"), p))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Nlink != 0 || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("fstat of the replaced FIFO: nlink %d type %o, %v; want a FIFO with no links", st.Nlink, st.Mode&unix.S_IFMT, err)
	}
}

// TestMountChangeOfACopiedUpFileWhoseNameIsGone: a lower file open
// read-only, copied up by a truncate through its name, and then renamed
// over, is the copy: an fchown through the old fd changes the copy and
// answers its size, not the lower file's (the bug was a second copy, of
// the lower file).
func TestMountChangeOfACopiedUpFileWhoseNameIsGone(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(old string) {
		must(t, os.WriteFile(filepath.Join(old, "f"), []byte("lower\n"), 0o644))
		must(t, os.WriteFile(filepath.Join(old, "g"), []byte("other\n"), 0o644))
	})
	p := filepath.Join(data, "f")
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	must(t, err)
	defer unix.Close(fd)
	must(t, unix.Truncate(p, 100000))
	must(t, unix.Rename(filepath.Join(data, "g"), p))
	must(t, unix.Fchown(fd, 4321, 4321))
	var st unix.Stat_t
	must(t, unix.Fstat(fd, &st))
	if st.Size != 100000 || st.Uid != 4321 || st.Nlink != 0 {
		t.Errorf("fstat after fchown: size %d, uid %d, nlink %d; want the copy: 100000, 4321, 0 links", st.Size, st.Uid, st.Nlink)
	}
	buf := make([]byte, 8)
	if n, err := unix.Pread(fd, buf, 0); err != nil || n != 8 || string(buf[:6]) != "lower\n" {
		t.Errorf("read through the old fd: %q, %v; want the copy's first bytes", buf[:n], err)
	}
}
