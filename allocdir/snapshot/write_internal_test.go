//go:build linux

package snapshot

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
)

// rawFS is the on-disk snapshot filesystem as the walk sees it, raw fds
// included.
type rawFS interface {
	allocdir.ReadFS
	fdOpener
}

// beneathFS returns the on-disk snapshot filesystem over fd.
func beneathFS(t *testing.T, fd int) rawFS {
	t.Helper()
	fsys, ok := allocdir.NewBeneathFS(fd).(rawFS)
	if !ok {
		t.Fatal("allocdir.NewBeneathFS does not implement fdOpener: this test would not test it")
	}
	return fsys
}

// swapAfterListing is the on-disk snapshot filesystem (raw fds
// included: the embedded rawFS brings OpenFd) with a change made right
// after the listing of alloc/data.
type swapAfterListing struct {
	rawFS
	after func()
}

func (s swapAfterListing) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := s.rawFS.ReadDir(name)
	if name == "alloc/data" && s.after != nil {
		s.after()
	}
	return entries, err
}

// rawSnapshotTree writes alloc/data with an empty file, a small one and
// one larger than the copy buffer, and returns the allocation directory,
// an fd of it and the files' contents.
func rawSnapshotTree(t *testing.T) (string, int, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	big := make([]byte, 2*copyBufSize+123)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"empty": nil, "small": []byte("small file\n"), "big": big}
	data := filepath.Join(dir, "alloc", "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(data, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return dir, fd, files
}

// TestSnapshotRawFdRoundTrip: files read through raw fds arrive whole,
// from empty to several copy buffers long.
func TestSnapshotRawFdRoundTrip(t *testing.T) {
	t.Parallel()
	_, fd, files := rawSnapshotTree(t)
	var buf bytes.Buffer
	if err := Write(&buf, "a1", beneathFS(t, fd), []string{"alloc/data"}); err != nil {
		t.Fatalf("Write: got error %v, want nil", err)
	}
	tr := tar.NewReader(&buf)
	got := map[string][]byte{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		got[filepath.Base(hdr.Name)] = body
	}
	if len(got) != len(files) {
		t.Errorf("got %d files, want %d", len(got), len(files))
	}
	for name, want := range files {
		if !bytes.Equal(got[name], want) {
			t.Errorf("%s: got %d bytes, want %d (or different content)", name, len(got[name]), len(want))
		}
	}
}

// TestSnapshotRawFdSkipsFIFOSwappedIn: a FIFO swapped in for a file after
// the listing neither blocks the walk nor is read: the walk looks at the
// name again and skips it, as it skips every FIFO.
func TestSnapshotRawFdSkipsFIFOSwappedIn(t *testing.T) {
	t.Parallel()
	dir, fd, _ := rawSnapshotTree(t)
	p := filepath.Join(dir, "alloc", "data", "small")
	swap := func() {
		if err := os.Remove(p); err != nil {
			t.Error(err)
		}
		if err := unix.Mkfifo(p, 0o644); err != nil {
			t.Error(err)
		}
	}
	var buf bytes.Buffer
	if err := Write(&buf, "a1", swapAfterListing{beneathFS(t, fd), swap}, []string{"alloc/data"}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if hdr.Name == "alloc/data/small" {
			t.Errorf("got an entry for the FIFO, want none")
		}
	}
}
