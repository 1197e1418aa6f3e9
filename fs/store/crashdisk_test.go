package store

import (
	"errors"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/storetest"
)

// errDead is the failure of every step from the one a crash falls on.
var errDead = errors.New("crashed here")

// crashDisk takes steps on the real disk until step limit (1-based; 0
// never dies), which fails with every later one. With power set it keeps,
// in image, what a power cut at the current instant would leave.
type crashDisk struct {
	disk.OS
	t       *testing.T
	dataDir string
	limit   int
	steps   int
	power   bool
	// image is a copy of the data dir as a power cut would leave it, taken
	// at the last sync before the crash.
	image string
	// dirty holds, by inode, the files the store wrote and has not synced
	// since; durable their content at their last sync.
	dirty   map[uint64]bool
	durable map[uint64][]byte
	// trail names every step taken, for the log.
	trail []string
}

// short names p the way the log shows it: relative to the data dir, with
// layer IDs elided.
func (d *crashDisk) short(p string) string {
	rel, err := filepath.Rel(d.dataDir, p)
	if err != nil {
		return p
	}
	parts := strings.Split(rel, "/")
	if len(parts) > 1 && (parts[0] == layersDirName || parts[0] == stagingDirName) {
		parts[1] = "*"
	}
	if len(parts) > 1 && parts[0] == stateDirName && strings.HasSuffix(parts[1], ".tmp") {
		parts[1] = "*.tmp"
	}
	return strings.Join(parts, "/")
}

func newCrashDisk(t *testing.T, dataDir, image string, limit int, power bool) *crashDisk {
	return &crashDisk{t: t, dataDir: dataDir, image: image, limit: limit, power: power,
		dirty: make(map[uint64]bool), durable: make(map[uint64][]byte)}
}

// step counts one step, named op on path p for the log, and says
// whether the process is dead by now.
func (d *crashDisk) step(op, p string) error {
	d.steps++
	d.trail = append(d.trail, op+" "+d.short(p))
	if d.limit > 0 && d.steps >= d.limit {
		return errDead
	}
	return nil
}

func inode(p string) (uint64, bool) {
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0, false
	}
	return st.Ino, true
}

func (d *crashDisk) wrote(p string) {
	if ino, ok := inode(p); ok {
		d.dirty[ino] = true
	}
}

// capture takes the image a power cut right now would leave.
func (d *crashDisk) capture() {
	if !d.power {
		return
	}
	img := filepath.Join(d.t.TempDir(), "image")
	storetest.CopyDataDir(d.t, d.dataDir, img)
	err := filepath.WalkDir(d.dataDir, func(p string, e iofs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		ino, _ := inode(p)
		if !d.dirty[ino] {
			return nil
		}
		rel, _ := filepath.Rel(d.dataDir, p)
		return os.WriteFile(filepath.Join(img, rel), d.durable[ino], 0o600)
	})
	if err != nil {
		d.t.Fatalf("image of %s: %v", d.dataDir, err)
	}
	d.image = img
}

func (d *crashDisk) Mkdir(p string, mode uint32) error {
	if err := d.step("mkdir", p); err != nil {
		return err
	}
	return d.OS.Mkdir(p, mode)
}

func (d *crashDisk) Lchown(p string, uid, gid int) error {
	if err := d.step("lchown", p); err != nil {
		return err
	}
	return d.OS.Lchown(p, uid, gid)
}

func (d *crashDisk) Chmod(p string, mode uint32) error {
	if err := d.step("chmod", p); err != nil {
		return err
	}
	return d.OS.Chmod(p, mode)
}

func (d *crashDisk) WriteFile(p string, data []byte, mode uint32) error {
	if err := d.step("writeFile", p); err != nil {
		return err
	}
	err := d.OS.WriteFile(p, data, mode)
	d.wrote(p)
	return err
}

func (d *crashDisk) AppendFile(p string, data []byte) error {
	if err := d.step("appendFile", p); err != nil {
		return err
	}
	if ino, ok := inode(p); ok && !d.dirty[ino] {
		cur, _ := os.ReadFile(p)
		d.durable[ino] = cur
	}
	err := d.OS.AppendFile(p, data)
	d.wrote(p)
	return err
}

func (d *crashDisk) Truncate(p string, size int64) error {
	if err := d.step("truncate", p); err != nil {
		return err
	}
	if ino, ok := inode(p); ok && d.dirty[ino] && int64(len(d.durable[ino])) > size {
		d.durable[ino] = d.durable[ino][:size]
	}
	return d.OS.Truncate(p, size)
}

func (d *crashDisk) Fsync(p string) error {
	if err := d.step("fsync", p); err != nil {
		return err
	}
	if err := d.OS.Fsync(p); err != nil {
		return err
	}
	if ino, ok := inode(p); ok {
		delete(d.dirty, ino)
		delete(d.durable, ino)
	}
	d.capture()
	return nil
}

func (d *crashDisk) Syncfs(p string) error {
	if err := d.step("syncfs", p); err != nil {
		return err
	}
	if err := d.OS.Syncfs(p); err != nil {
		return err
	}
	d.dirty = make(map[uint64]bool)
	d.durable = make(map[uint64][]byte)
	d.capture()
	return nil
}

func (d *crashDisk) Rename(oldpath, newpath string, flags uint) error {
	if err := d.step("rename", newpath); err != nil {
		return err
	}
	return d.OS.Rename(oldpath, newpath, flags)
}

func (d *crashDisk) MkdirAt(l layer.Loc, mode uint32) error {
	if err := d.step("mkdir", l.String()); err != nil {
		return err
	}
	return d.OS.MkdirAt(l, mode)
}

func (d *crashDisk) LinkAt(from, to layer.Loc) error {
	if err := d.step("link", to.String()); err != nil {
		return err
	}
	return d.OS.LinkAt(from, to)
}

func (d *crashDisk) Remove(p string) error {
	if err := d.step("remove", p); err != nil {
		return err
	}
	return d.OS.Remove(p)
}

func (d *crashDisk) RemoveAll(p string) error {
	if err := d.step("removeAll", p); err != nil {
		return err
	}
	return d.OS.RemoveAll(p)
}
