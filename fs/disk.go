package fs

import (
	"errors"
	"os"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// disk is every step by which the store changes the data dir: each call is
// one step a crash can fall before or after. The store never changes the
// data dir any other way (what tasks write into layers goes through the
// mount, not through the store), so a test that wraps disk can stop the
// store at its Nth step, or throw away every write that was not synced,
// and see everything a real crash or power cut could leave behind
// (crash_test.go).
//
// Paths are absolute and built by the store from its own directory names
// and IDs it generated or checked, never from a request.
type disk interface {
	// mkdir creates a directory with mode; the umask applies, so the
	// caller sets the mode it wants with chmod afterwards.
	mkdir(path string, mode uint32) error
	lchown(path string, uid, gid int) error
	chmod(path string, mode uint32) error
	// writeFile creates path (it must not exist) holding data, unsynced.
	writeFile(path string, data []byte, mode uint32) error
	// appendFile appends data to path, creating it if needed, unsynced.
	appendFile(path string, data []byte) error
	truncate(path string, size int64) error
	// fsync makes path's data and its own metadata durable; for a
	// directory, the names in it.
	fsync(path string) error
	// syncfs makes everything on the filesystem holding path durable.
	syncfs(path string) error
	// rename is renameat2 with flags (0 or RENAME_NOREPLACE).
	rename(oldpath, newpath string, flags uint) error
	link(oldpath, newpath string) error
	// remove unlinks a file or removes an empty directory.
	remove(path string) error
	// removeAll removes a whole tree (a layer), never following links.
	removeAll(path string) error
}

// osDisk is the disk of a running daemon: every step is the system call.
type osDisk struct{}

func (osDisk) mkdir(p string, mode uint32) error {
	return pathErr("mkdir", p, unix.Mkdir(p, mode))
}

func (osDisk) lchown(p string, uid, gid int) error {
	return pathErr("lchown", p, unix.Lchown(p, uid, gid))
}

func (osDisk) chmod(p string, mode uint32) error {
	return pathErr("chmod", p, unix.Fchmodat(unix.AT_FDCWD, p, mode, 0))
}

func (osDisk) writeFile(p string, data []byte, mode uint32) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(mode))
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

func (osDisk) appendFile(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}

func (osDisk) truncate(p string, size int64) error {
	return pathErr("truncate", p, unix.Truncate(p, size))
}

func (osDisk) fsync(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return pathErr("open", p, err)
	}
	defer unix.Close(fd)
	return pathErr("fsync", p, unix.Fsync(fd))
}

func (osDisk) syncfs(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return pathErr("open", p, err)
	}
	defer unix.Close(fd)
	return pathErr("syncfs", p, unix.Syncfs(fd))
}

func (osDisk) rename(oldpath, newpath string, flags uint) error {
	if err := unix.Renameat2(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, flags); err != nil {
		return &os.LinkError{Op: "rename", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

func (osDisk) link(oldpath, newpath string) error {
	if err := unix.Linkat(unix.AT_FDCWD, oldpath, unix.AT_FDCWD, newpath, 0); err != nil {
		return &os.LinkError{Op: "link", Old: oldpath, New: newpath, Err: err}
	}
	return nil
}

func (osDisk) remove(p string) error { return os.Remove(p) }

func (osDisk) removeAll(p string) error { return allocdir.RemoveAll(p) }

func pathErr(op, p string, err error) error {
	if err == nil {
		return nil
	}
	return &os.PathError{Op: op, Path: p, Err: err}
}
