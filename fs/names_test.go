package fs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestMountNameLengths checks names of 255 and 256 bytes on every kind
// of volume: a plain volume, one with a lower layer, and a memory volume.
// 255 bytes work for every way of making an entry; 256 give ENAMETOOLONG
// and leave nothing behind.
func TestMountNameLengths(t *testing.T) {
	tm := newTestMount(t)
	data := snapshotVolume(t, tm, func(string) {})
	dirs := map[string]string{
		"plain":    filepath.Join(tm.dir, "new/alloc/logs"),
		"snapshot": data,
		"memory":   filepath.Join(tm.dir, "new/web/secrets"),
	}
	long := strings.Repeat("n", 255)
	tooLong := strings.Repeat("n", 256)
	for kind, dir := range dirs {
		t.Run(kind, func(t *testing.T) {
			for _, mk := range []struct {
				how string
				do  func(p string) error
			}{
				{"create", func(p string) error { return os.WriteFile(p, nil, 0o644) }},
				{"mkdir", func(p string) error { return os.Mkdir(p, 0o755) }},
				{"symlink", func(p string) error { return os.Symlink("target", p) }},
				{"mkfifo", func(p string) error { return syscall.Mkfifo(p, 0o644) }},
			} {
				if err := mk.do(filepath.Join(dir, long)); err != nil {
					t.Errorf("%s of a 255-byte name: %v", mk.how, err)
				}
				must(t, os.RemoveAll(filepath.Join(dir, long)))
				if err := mk.do(filepath.Join(dir, tooLong)); !errors.Is(err, syscall.ENAMETOOLONG) {
					t.Errorf("%s of a 256-byte name: %v, want ENAMETOOLONG", mk.how, err)
				}
			}
			must(t, os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644))
			if err := os.Rename(filepath.Join(dir, "f"), filepath.Join(dir, tooLong)); !errors.Is(err, syscall.ENAMETOOLONG) {
				t.Errorf("rename to a 256-byte name: %v, want ENAMETOOLONG", err)
			}
			if err := os.Link(filepath.Join(dir, "f"), filepath.Join(dir, tooLong)); !errors.Is(err, syscall.ENAMETOOLONG) {
				t.Errorf("link to a 256-byte name: %v, want ENAMETOOLONG", err)
			}
			entries, err := os.ReadDir(dir)
			must(t, err)
			if len(entries) != 1 || entries[0].Name() != "f" {
				var names []string
				for _, e := range entries {
					names = append(names, e.Name())
				}
				t.Errorf("%s after the refused names: %v, want only f", kind, names)
			}
			must(t, os.Remove(filepath.Join(dir, "f")))
		})
	}
}
