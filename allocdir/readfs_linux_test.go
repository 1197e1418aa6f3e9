//go:build linux

package allocdir_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
)

// swappedFS lies in Lstat that every name is a regular file, as a check
// made just before a task swapped a FIFO in would see it.
type swappedFS struct{ allocdir.ReadFS }

func (s swappedFS) Lstat(name string) (fs.FileInfo, error) {
	fi, err := s.ReadFS.Lstat(name)
	if err != nil || name == "." || fi.IsDir() {
		return fi, err
	}
	return regularInfo{fi}, nil
}

type regularInfo struct{ fs.FileInfo }

func (regularInfo) Mode() fs.FileMode { return 0o644 }

// TestReadAtFIFOSwappedIn: a FIFO that replaced a file between the check
// and the open is refused with ErrNotRegular at once, not read, even with
// a writer holding it open.
func TestReadAtFIFOSwappedIn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "f")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	rs := allocdir.ReadSide{AllocID: "a1", Open: func() (allocdir.ReadFS, func(), error) {
		return swappedFS{allocdir.NewBeneathFS(fd)}, func() {}, nil
	}}
	done := make(chan error, 1)
	go func() {
		rc, err := rs.ReadAt("f", 0)
		if err == nil {
			rc.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, allocdir.ErrNotRegular) {
			t.Errorf("ReadAt: got %v, want an error wrapping ErrNotRegular", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadAt of a FIFO still blocked after 10s")
	}
}
