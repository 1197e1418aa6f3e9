package storetest

import (
	"os"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/disk"
)

// FaultDisk takes every step on the real disk after asking Fn, which may
// fail it as the disk would: tests use it to make one step of a change
// fail and check that nothing else changed, or to record the steps a
// change takes.
type FaultDisk struct {
	disk.OS
	Fn func(op, path string) error
}

func (d FaultDisk) Mkdir(p string, mode uint32) error {
	if err := d.Fn("mkdir", p); err != nil {
		return &os.PathError{Op: "mkdir", Path: p, Err: err}
	}
	return d.OS.Mkdir(p, mode)
}

func (d FaultDisk) Lchown(p string, uid, gid int) error {
	if err := d.Fn("lchown", p); err != nil {
		return &os.PathError{Op: "lchown", Path: p, Err: err}
	}
	return d.OS.Lchown(p, uid, gid)
}

func (d FaultDisk) Chmod(p string, mode uint32) error {
	if err := d.Fn("chmod", p); err != nil {
		return &os.PathError{Op: "chmod", Path: p, Err: err}
	}
	return d.OS.Chmod(p, mode)
}

func (d FaultDisk) WriteFile(p string, data []byte, mode uint32) error {
	if err := d.Fn("write", p); err != nil {
		return &os.PathError{Op: "write", Path: p, Err: err}
	}
	return d.OS.WriteFile(p, data, mode)
}

func (d FaultDisk) AppendFile(p string, data []byte) error {
	if err := d.Fn("append", p); err != nil {
		return &os.PathError{Op: "append", Path: p, Err: err}
	}
	return d.OS.AppendFile(p, data)
}

func (d FaultDisk) Truncate(p string, size int64) error {
	if err := d.Fn("truncate", p); err != nil {
		return &os.PathError{Op: "truncate", Path: p, Err: err}
	}
	return d.OS.Truncate(p, size)
}

func (d FaultDisk) Fsync(p string) error {
	if err := d.Fn("fsync", p); err != nil {
		return &os.PathError{Op: "fsync", Path: p, Err: err}
	}
	return d.OS.Fsync(p)
}

func (d FaultDisk) Syncfs(p string) error {
	if err := d.Fn("syncfs", p); err != nil {
		return &os.PathError{Op: "syncfs", Path: p, Err: err}
	}
	return d.OS.Syncfs(p)
}

func (d FaultDisk) Rename(oldpath, newpath string, flags uint) error {
	if err := d.Fn("rename", newpath); err != nil {
		return &os.PathError{Op: "rename", Path: newpath, Err: err}
	}
	return d.OS.Rename(oldpath, newpath, flags)
}

func (d FaultDisk) MkdirAt(l layer.Loc, mode uint32) error {
	if err := d.Fn("mkdir", l.String()); err != nil {
		return &os.PathError{Op: "mkdir", Path: l.String(), Err: err}
	}
	return d.OS.MkdirAt(l, mode)
}

func (d FaultDisk) LinkAt(from, to layer.Loc) error {
	if err := d.Fn("link", to.String()); err != nil {
		return &os.PathError{Op: "link", Path: to.String(), Err: err}
	}
	return d.OS.LinkAt(from, to)
}

func (d FaultDisk) Remove(p string) error {
	if err := d.Fn("remove", p); err != nil {
		return &os.PathError{Op: "remove", Path: p, Err: err}
	}
	return d.OS.Remove(p)
}

func (d FaultDisk) RemoveAll(p string) error {
	if err := d.Fn("removeAll", p); err != nil {
		return &os.PathError{Op: "removeAll", Path: p, Err: err}
	}
	return d.OS.RemoveAll(p)
}
