package store

import "github.com/allocfs/allocfs/fs/layer"

// faultDisk takes every step on the real disk after asking fn, which may
// fail it as the disk would: tests use it to make one step of a change
// fail and check that nothing else changed.
type faultDisk struct {
	OSDisk
	fn func(op, path string) error
}

func (d faultDisk) Mkdir(p string, mode uint32) error {
	if err := d.fn("mkdir", p); err != nil {
		return pathErr("mkdir", p, err)
	}
	return d.OSDisk.Mkdir(p, mode)
}

func (d faultDisk) Lchown(p string, uid, gid int) error {
	if err := d.fn("lchown", p); err != nil {
		return pathErr("lchown", p, err)
	}
	return d.OSDisk.Lchown(p, uid, gid)
}

func (d faultDisk) Chmod(p string, mode uint32) error {
	if err := d.fn("chmod", p); err != nil {
		return pathErr("chmod", p, err)
	}
	return d.OSDisk.Chmod(p, mode)
}

func (d faultDisk) WriteFile(p string, data []byte, mode uint32) error {
	if err := d.fn("write", p); err != nil {
		return pathErr("write", p, err)
	}
	return d.OSDisk.WriteFile(p, data, mode)
}

func (d faultDisk) AppendFile(p string, data []byte) error {
	if err := d.fn("append", p); err != nil {
		return pathErr("append", p, err)
	}
	return d.OSDisk.AppendFile(p, data)
}

func (d faultDisk) Truncate(p string, size int64) error {
	if err := d.fn("truncate", p); err != nil {
		return pathErr("truncate", p, err)
	}
	return d.OSDisk.Truncate(p, size)
}

func (d faultDisk) Fsync(p string) error {
	if err := d.fn("fsync", p); err != nil {
		return pathErr("fsync", p, err)
	}
	return d.OSDisk.Fsync(p)
}

func (d faultDisk) Syncfs(p string) error {
	if err := d.fn("syncfs", p); err != nil {
		return pathErr("syncfs", p, err)
	}
	return d.OSDisk.Syncfs(p)
}

func (d faultDisk) Rename(oldpath, newpath string, flags uint) error {
	if err := d.fn("rename", newpath); err != nil {
		return pathErr("rename", newpath, err)
	}
	return d.OSDisk.Rename(oldpath, newpath, flags)
}

func (d faultDisk) MkdirAt(l layer.Loc, mode uint32) error {
	if err := d.fn("mkdir", l.String()); err != nil {
		return pathErr("mkdir", l.String(), err)
	}
	return d.OSDisk.MkdirAt(l, mode)
}

func (d faultDisk) LinkAt(from, to layer.Loc) error {
	if err := d.fn("link", to.String()); err != nil {
		return pathErr("link", to.String(), err)
	}
	return d.OSDisk.LinkAt(from, to)
}

func (d faultDisk) Remove(p string) error {
	if err := d.fn("remove", p); err != nil {
		return pathErr("remove", p, err)
	}
	return d.OSDisk.Remove(p)
}

func (d faultDisk) RemoveAll(p string) error {
	if err := d.fn("removeAll", p); err != nil {
		return pathErr("removeAll", p, err)
	}
	return d.OSDisk.RemoveAll(p)
}

// setFault makes every later step of s ask fn first; nil restores the
// plain disk.
func setFault(s *Store, fn func(op, path string) error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if fn == nil {
		s.disk = OSDisk{}
		return
	}
	s.disk = faultDisk{fn: fn}
}
