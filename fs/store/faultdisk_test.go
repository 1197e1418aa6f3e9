package store

import (
	"os"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/disk"
)

// faultDisk takes every step on the real disk after asking fn, which may
// fail it as the disk would: tests use it to make one step of a change
// fail and check that nothing else changed.
type faultDisk struct {
	disk.OS
	fn func(op, path string) error
}

func (d faultDisk) Mkdir(p string, mode uint32) error {
	if err := d.fn("mkdir", p); err != nil {
		return &os.PathError{Op: "mkdir", Path: p, Err: err}
	}
	return d.OS.Mkdir(p, mode)
}

func (d faultDisk) Lchown(p string, uid, gid int) error {
	if err := d.fn("lchown", p); err != nil {
		return &os.PathError{Op: "lchown", Path: p, Err: err}
	}
	return d.OS.Lchown(p, uid, gid)
}

func (d faultDisk) Chmod(p string, mode uint32) error {
	if err := d.fn("chmod", p); err != nil {
		return &os.PathError{Op: "chmod", Path: p, Err: err}
	}
	return d.OS.Chmod(p, mode)
}

func (d faultDisk) WriteFile(p string, data []byte, mode uint32) error {
	if err := d.fn("write", p); err != nil {
		return &os.PathError{Op: "write", Path: p, Err: err}
	}
	return d.OS.WriteFile(p, data, mode)
}

func (d faultDisk) AppendFile(p string, data []byte) error {
	if err := d.fn("append", p); err != nil {
		return &os.PathError{Op: "append", Path: p, Err: err}
	}
	return d.OS.AppendFile(p, data)
}

func (d faultDisk) Truncate(p string, size int64) error {
	if err := d.fn("truncate", p); err != nil {
		return &os.PathError{Op: "truncate", Path: p, Err: err}
	}
	return d.OS.Truncate(p, size)
}

func (d faultDisk) Fsync(p string) error {
	if err := d.fn("fsync", p); err != nil {
		return &os.PathError{Op: "fsync", Path: p, Err: err}
	}
	return d.OS.Fsync(p)
}

func (d faultDisk) Syncfs(p string) error {
	if err := d.fn("syncfs", p); err != nil {
		return &os.PathError{Op: "syncfs", Path: p, Err: err}
	}
	return d.OS.Syncfs(p)
}

func (d faultDisk) Rename(oldpath, newpath string, flags uint) error {
	if err := d.fn("rename", newpath); err != nil {
		return &os.PathError{Op: "rename", Path: newpath, Err: err}
	}
	return d.OS.Rename(oldpath, newpath, flags)
}

func (d faultDisk) MkdirAt(l layer.Loc, mode uint32) error {
	if err := d.fn("mkdir", l.String()); err != nil {
		return &os.PathError{Op: "mkdir", Path: l.String(), Err: err}
	}
	return d.OS.MkdirAt(l, mode)
}

func (d faultDisk) LinkAt(from, to layer.Loc) error {
	if err := d.fn("link", to.String()); err != nil {
		return &os.PathError{Op: "link", Path: to.String(), Err: err}
	}
	return d.OS.LinkAt(from, to)
}

func (d faultDisk) Remove(p string) error {
	if err := d.fn("remove", p); err != nil {
		return &os.PathError{Op: "remove", Path: p, Err: err}
	}
	return d.OS.Remove(p)
}

func (d faultDisk) RemoveAll(p string) error {
	if err := d.fn("removeAll", p); err != nil {
		return &os.PathError{Op: "removeAll", Path: p, Err: err}
	}
	return d.OS.RemoveAll(p)
}

// setFault makes every later step of s ask fn first; nil restores the
// plain disk.
func setFault(s *Store, fn func(op, path string) error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if fn == nil {
		s.disk = disk.OS{}
		return
	}
	s.disk = faultDisk{fn: fn}
}
