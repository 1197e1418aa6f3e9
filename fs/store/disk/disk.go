package disk

import (
	"errors"
	"os"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"golang.org/x/sys/unix"
)

// Disk is every step by which the store changes the data dir: each call is
// one step a crash can fall before or after. The store never changes the
// data dir any other way (what tasks write into layers goes through the
// mount, not through the store), so a Disk that wraps OS can stop the
// store at its Nth step, fail one step as a full or broken disk would, or
// throw away every write that was not synced, and see everything a real
// crash or power cut could leave behind (the store's crash_test.go). A
// daemon uses OS; the store's OpenWith takes another.
//
// Paths are absolute and built by the store from its own directory names
// and IDs it generated or checked, never from a request.
type Disk interface {
	// Mkdir creates a directory with mode; the umask applies, so the
	// caller sets the mode it wants with Chmod afterwards.
	Mkdir(path string, mode uint32) error
	// Lchown changes the owner of path, not following a link.
	Lchown(path string, uid, gid int) error
	// Chmod sets the mode of path, set-id and sticky bits included.
	Chmod(path string, mode uint32) error
	// WriteFile creates path (it must not exist) holding data, unsynced.
	WriteFile(path string, data []byte, mode uint32) error
	// AppendFile appends data to path, creating it if needed, unsynced.
	AppendFile(path string, data []byte) error
	// Truncate cuts the file path to size bytes.
	Truncate(path string, size int64) error
	// Fsync makes path's data and its own metadata durable; for a
	// directory, the names in it.
	Fsync(path string) error
	// Syncfs makes everything on the filesystem holding path durable.
	Syncfs(path string) error
	// Rename is renameat2 with flags (0 or RENAME_NOREPLACE).
	Rename(oldpath, newpath string, flags uint) error
	// MkdirAt and LinkAt are Mkdir and link(2) of entries named
	// fd-relative (a flatten's merge, which may go deeper than PATH_MAX).
	MkdirAt(l layer.Loc, mode uint32) error
	LinkAt(from, to layer.Loc) error
	// Remove unlinks a file or removes an empty directory.
	Remove(path string) error
	// RemoveAll removes a whole tree (a layer), never following links.
	RemoveAll(path string) error
}

// A merge of layers takes its steps on the store's disk.
var _ layer.MergeDisk = Disk(nil)

// OS is the disk of a running daemon: every step is the system call.
type OS struct{}

func (OS) Mkdir(p string, mode uint32) error {
	return pathErr("mkdir", p, unix.Mkdir(p, mode))
}

func (OS) Lchown(p string, uid, gid int) error {
	return pathErr("lchown", p, unix.Lchown(p, uid, gid))
}

func (OS) Chmod(p string, mode uint32) error {
	return pathErr("chmod", p, unix.Fchmodat(unix.AT_FDCWD, p, mode, 0))
}

func (OS) WriteFile(p string, data []byte, mode uint32) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(mode))
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

func (OS) AppendFile(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

func (OS) Truncate(p string, size int64) error {
	return pathErr("truncate", p, unix.Truncate(p, size))
}

func (OS) Fsync(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return pathErr("open", p, err)
	}
	defer unix.Close(fd)
	return pathErr("fsync", p, unix.Fsync(fd))
}

func (OS) Syncfs(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr("open", p, err)
	}
	defer unix.Close(fd)
	return pathErr("syncfs", p, unix.Syncfs(fd))
}

func (OS) Rename(oldpath, newpath string, flags uint) error {
	if err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, flags); err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

func (OS) MkdirAt(l layer.Loc, mode uint32) error { return l.Mkdir(mode) }

func (OS) LinkAt(from, to layer.Loc) error { return layer.Link(from, to) }

func (OS) Remove(p string) error { return os.Remove(p) }

func (OS) RemoveAll(p string) error { return allocdir.RemoveAll(p) }

func pathErr(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: p, Err: err}
}
