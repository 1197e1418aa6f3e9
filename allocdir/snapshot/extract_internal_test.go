//go:build linux

package snapshot

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// TestExtractBeneathBackstop: if a directory the extractor created is
// swapped for a symbolic link behind its back (a race), openat2 refuses
// to go through it and nothing is written outside.
func TestExtractBeneathBackstop(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	root := filepath.Join(base, "root")
	for _, d := range []string{filepath.Join(outside, "data"), root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "alloc")); err != nil {
		t.Fatal(err)
	}
	x, err := newExtractor(root, ExtractOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer x.close()

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "alloc/data/f", Mode: 0o644, Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	err = x.run(&buf)
	t.Logf("refused: %v", err)
	if !errors.Is(err, allocdir.ErrArchive) {
		t.Errorf("got error %v, want one wrapping ErrArchive", err)
	}
	if _, err := os.Lstat(filepath.Join(outside, "data", "f")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("outside/data/f: got stat error %v, want not-exist", err)
	}
}
