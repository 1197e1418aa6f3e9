package fs

// faultDisk takes every step on the real disk after asking fn, which may
// fail it as the disk would: tests use it to make one step of a change
// fail and check that nothing else changed.
type faultDisk struct {
	osDisk
	fn func(op, path string) error
}

func (d faultDisk) mkdir(p string, mode uint32) error {
	if err := d.fn("mkdir", p); err != nil {
		return pathErr("mkdir", p, err)
	}
	return d.osDisk.mkdir(p, mode)
}

func (d faultDisk) lchown(p string, uid, gid int) error {
	if err := d.fn("lchown", p); err != nil {
		return pathErr("lchown", p, err)
	}
	return d.osDisk.lchown(p, uid, gid)
}

func (d faultDisk) chmod(p string, mode uint32) error {
	if err := d.fn("chmod", p); err != nil {
		return pathErr("chmod", p, err)
	}
	return d.osDisk.chmod(p, mode)
}

func (d faultDisk) writeFile(p string, data []byte, mode uint32) error {
	if err := d.fn("write", p); err != nil {
		return pathErr("write", p, err)
	}
	return d.osDisk.writeFile(p, data, mode)
}

func (d faultDisk) appendFile(p string, data []byte) error {
	if err := d.fn("append", p); err != nil {
		return pathErr("append", p, err)
	}
	return d.osDisk.appendFile(p, data)
}

func (d faultDisk) truncate(p string, size int64) error {
	if err := d.fn("truncate", p); err != nil {
		return pathErr("truncate", p, err)
	}
	return d.osDisk.truncate(p, size)
}

func (d faultDisk) fsync(p string) error {
	if err := d.fn("fsync", p); err != nil {
		return pathErr("fsync", p, err)
	}
	return d.osDisk.fsync(p)
}

func (d faultDisk) syncfs(p string) error {
	if err := d.fn("syncfs", p); err != nil {
		return pathErr("syncfs", p, err)
	}
	return d.osDisk.syncfs(p)
}

func (d faultDisk) rename(oldpath, newpath string, flags uint) error {
	if err := d.fn("rename", newpath); err != nil {
		return pathErr("rename", newpath, err)
	}
	return d.osDisk.rename(oldpath, newpath, flags)
}

func (d faultDisk) link(oldpath, newpath string) error {
	if err := d.fn("link", newpath); err != nil {
		return pathErr("link", newpath, err)
	}
	return d.osDisk.link(oldpath, newpath)
}

func (d faultDisk) remove(p string) error {
	if err := d.fn("remove", p); err != nil {
		return pathErr("remove", p, err)
	}
	return d.osDisk.remove(p)
}

func (d faultDisk) removeAll(p string) error {
	if err := d.fn("removeAll", p); err != nil {
		return pathErr("removeAll", p, err)
	}
	return d.osDisk.removeAll(p)
}

// setFault makes every later step of s ask fn first; nil restores the
// plain disk.
func setFault(s *Store, fn func(op, path string) error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if fn == nil {
		s.disk = osDisk{}
		return
	}
	s.disk = faultDisk{fn: fn}
}
