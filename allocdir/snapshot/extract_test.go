//go:build linux

package snapshot_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/allocdir/snapshot"
)

// snapEnv is a sandbox for one extraction: dest sits deep below base so
// that a name climbing out of it still lands inside base, where the
// before/after comparison sees it, and outside holds a sentinel.
type snapEnv struct {
	base, outside, parent, dest string
	before                      map[string]snapNode
}

func newSnapEnv(t *testing.T) *snapEnv {
	t.Helper()
	base := t.TempDir()
	e := &snapEnv{
		base:    base,
		outside: filepath.Join(base, "outside"),
		parent:  filepath.Join(base, "p1", "p2", "p3", "p4"),
	}
	e.dest = filepath.Join(e.parent, "dest")
	for _, d := range []string{e.outside, e.parent} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(e.outside, "sentinel"), []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	e.before = snapReadTree(t, base)
	return e
}

// assertRefused checks that err wraps ErrArchive and that the extraction
// left no trace: no dest, no temp directory, nothing changed under base.
func (e *snapEnv) assertRefused(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, allocdir.ErrArchive) {
		t.Errorf("got error %v, want one wrapping ErrArchive", err)
	}
	t.Logf("refused: %v", err)
	e.assertNoTrace(t)
}

func (e *snapEnv) assertNoTrace(t *testing.T) {
	t.Helper()
	if _, err := os.Lstat(e.dest); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dest: got stat error %v, want not-exist", err)
	}
	snapAssertNoTemp(t, e.parent)
	after := snapReadTree(t, e.base)
	for name, n := range after {
		b, ok := e.before[name]
		// The parent's mtime moves because the temp directory was
		// created and removed in it; its content is still compared
		// entry by entry.
		sameTime := n.MTime.Equal(b.MTime) || name == "p1/p2/p3/p4"
		switch {
		case !ok:
			t.Errorf("%s: created outside the extraction", name)
		case n.Mode != b.Mode || n.Body != b.Body || n.Link != b.Link || n.Ino != b.Ino || !sameTime:
			t.Errorf("%s: changed: got %+v, want %+v", name, n, b)
		}
	}
	for name := range e.before {
		if _, ok := after[name]; !ok {
			t.Errorf("%s: removed", name)
		}
	}
}

// snapAssertNoTemp fails if an extraction temp directory is left in dir.
func snapAssertNoTemp(t *testing.T, dir string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".extract-") {
			t.Errorf("got leftover temp directory %q, want none", e.Name())
		}
	}
}

// TestExtractRefusesMaliciousArchives runs every refused archive through
// the same assertions: ErrArchive, no dest, no temp directory, nothing
// written anywhere else.
func TestExtractRefusesMaliciousArchives(t *testing.T) {
	t.Parallel()
	passwd, err := os.Lstat("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	passwdLinks := passwd.Sys().(*syscall.Stat_t).Nlink

	valid := func(t *testing.T, e *snapEnv) []byte {
		return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/a", strings.Repeat("a", 700)), allocdirtest.TarDir("web/local"))
	}
	cases := []struct {
		name    string
		archive func(t *testing.T, e *snapEnv) []byte
		opts    snapshot.ExtractOptions
		check   func(t *testing.T, e *snapEnv)
	}{
		{name: "absolute_name", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarFile(filepath.Join(e.outside, "abs"), "x"))
		}, check: func(t *testing.T, e *snapEnv) { snapAssertAbsent(t, filepath.Join(e.outside, "abs")) }},
		{name: "dotdot_name", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/../../../x", "x"))
		}, check: func(t *testing.T, e *snapEnv) { snapAssertAbsent(t, filepath.Join(e.parent, "x")) }},
		{name: "dotdot_name_that_cleans_inside", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarFile("alloc/data/x/../y", "x"))
		}},
		{name: "empty_name", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarFile("", "x"))
		}},
		{name: "name_cleans_to_root", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("./"))
		}},
		{name: "outside_layout_alloc_logs", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/logs/x", "x"))
		}},
		{name: "outside_layout_task_secrets", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("web/local"), allocdirtest.TarFile("web/secrets/token", "x"))
		}},
		{name: "outside_layout_task_private", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarFile("web/private/key", "x"))
		}},
		{name: "outside_layout_alloc_local", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarFile("alloc/local/x", "x"))
		}},
		{name: "duplicate_entry", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", "1"), allocdirtest.TarFile("alloc/data/f", "2"))
		}},
		{name: "duplicate_entry_after_cleaning", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", "1"), allocdirtest.TarFile("./alloc//data/./f", "2"))
		}},
		{name: "duplicate_directory", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarDir("alloc/data"))
		}},
		{name: "CVE-2024-6717_duplicate_file_replaces_symlink", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/f", "../../web/local/g"), allocdirtest.TarFile("alloc/data/f", "x"))
		}},
		{name: "CVE-2022-24683_absolute_symlink_to_etc", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/etc", "/etc"))
		}},
		{name: "CVE-2024-1329_relative_symlink_climbs_out", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/l", "../../../../etc"))
		}},
		{name: "CVE-2024-1329_symlink_to_parent_of_root", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarSymlink("web", ".."))
		}},
		{name: "CVE-2024-1329_symlink_chain_climbs_out", archive: func(t *testing.T, e *snapEnv) []byte {
			// t is fine lexically (alloc/data/s/../../../etc cleans to
			// etc) and arrives before the link that makes it escape.
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/t", "s/../../../etc"), allocdirtest.TarSymlink("alloc/data/s", "../.."))
		}},
		{name: "CVE-2024-7625_write_through_symlink_to_dot", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/l", "."), allocdirtest.TarFile("alloc/data/l/f", "x"))
		}},
		{name: "CVE-2024-7625_write_through_symlink_to_root", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/l", "../../"), allocdirtest.TarFile("alloc/data/l/web/local/f", "x"))
		}},
		{name: "CVE-2024-7625_mkdir_through_symlink", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/l", "."), allocdirtest.TarDir("alloc/data/l/d"))
		}},
		{name: "CVE-2024-7625_write_through_absolute_symlink", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/l", e.outside), allocdirtest.TarFile("alloc/data/l/sentinel", "overwritten"), allocdirtest.TarFile("alloc/data/l/new", "x"))
		}, check: func(t *testing.T, e *snapEnv) {
			snapAssertAbsent(t, filepath.Join(e.outside, "new"))
		}},
		{name: "write_under_regular_file", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", "x"), allocdirtest.TarFile("alloc/data/f/g", "y"))
		}},
		{name: "symlink_empty_target", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarSymlink("alloc/data/l", ""))
		}},
		{name: "hardlink_to_etc_passwd", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarHardLink("alloc/data/passwd", "/etc/passwd"))
		}, check: func(t *testing.T, e *snapEnv) {
			fi, err := os.Lstat("/etc/passwd")
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Sys().(*syscall.Stat_t).Nlink; got != passwdLinks {
				t.Errorf("/etc/passwd: got %d links, want %d", got, passwdLinks)
			}
		}},
		{name: "hardlink_dotdot", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarHardLink("alloc/data/x", "../x"))
		}},
		{name: "hardlink_dotdot_to_outside_file", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarHardLink("alloc/data/x", "alloc/data/../../../../../outside/sentinel"))
		}, check: func(t *testing.T, e *snapEnv) {
			fi, err := os.Lstat(filepath.Join(e.outside, "sentinel"))
			if err != nil {
				t.Fatal(err)
			}
			if got := fi.Sys().(*syscall.Stat_t).Nlink; got != 1 {
				t.Errorf("sentinel: got %d links, want 1", got)
			}
		}},
		{name: "hardlink_unknown_entry", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarHardLink("alloc/data/x", "alloc/data/nope"))
		}},
		{name: "hardlink_to_directory", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarDir("alloc/data/d"), allocdirtest.TarHardLink("alloc/data/x", "alloc/data/d"))
		}},
		{name: "hardlink_to_symlink", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarSymlink("alloc/data/l", "."), allocdirtest.TarHardLink("alloc/data/x", "alloc/data/l"))
		}},
		{name: "char_device", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarEntry{Name: "alloc/data/mem", Type: tar.TypeChar, Mode: 0o666, Major: 1})
		}},
		{name: "block_device", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarEntry{Name: "alloc/data/sda", Type: tar.TypeBlock, Mode: 0o666, Major: 8})
		}},
		{name: "owner_out_of_range", opts: snapshot.ExtractOptions{Chown: true}, archive: func(t *testing.T, e *snapEnv) []byte {
			// -1 as a uid_t would mean "leave the owner alone".
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarEntry{Name: "alloc/data/f", Type: tar.TypeReg, Body: "x", Mode: 0o644, UID: 1<<32 - 1})
		}},
		{name: "oversize_file", opts: snapshot.ExtractOptions{MaxBytes: 50}, archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", strings.Repeat("x", 51)))
		}},
		{name: "oversize_total", opts: snapshot.ExtractOptions{MaxBytes: 50}, archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", strings.Repeat("x", 30)), allocdirtest.TarFile("alloc/data/g", strings.Repeat("x", 30)))
		}},
		{name: "name_longer_than_64KiB", archive: func(t *testing.T, e *snapEnv) []byte {
			deep := "alloc/data" + strings.Repeat("/"+strings.Repeat("d", 255), 64<<10/256)
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile(deep+"/f", "x"))
		}},
		{name: "too_many_entries", opts: snapshot.ExtractOptions{MaxEntries: 3}, archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/a", ""), allocdirtest.TarFile("alloc/data/b", ""), allocdirtest.TarFile("alloc/data/c", ""))
		}},
		{name: "error_entry", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/a", "x"), allocdirtest.TarFile("NOMAD-prev-ERROR.log", "Error snapshotting: disk on fire"))
		}},
		{name: "truncated_at_entry_boundary", archive: func(t *testing.T, e *snapEnv) []byte {
			return allocdirtest.Tar(t, false, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/a", strings.Repeat("a", 700)), allocdirtest.TarDir("web/local"))
		}},
		{name: "truncated_after_one_zero_block", archive: func(t *testing.T, e *snapEnv) []byte {
			b := allocdirtest.Tar(t, false, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/a", strings.Repeat("a", 700)))
			return append(b, make([]byte, 512)...)
		}},
		{name: "truncated_mid_body", archive: func(t *testing.T, e *snapEnv) []byte {
			b := valid(t, e)
			return b[:512+512+300]
		}},
		{name: "truncated_mid_header", archive: func(t *testing.T, e *snapEnv) []byte {
			return valid(t, e)[:512+100]
		}},
		{name: "empty_stream", archive: func(t *testing.T, e *snapEnv) []byte { return nil }},
		{name: "garbage", archive: func(t *testing.T, e *snapEnv) []byte {
			return bytes.Repeat([]byte("this is not a tar archive\n"), 100)
		}},
		{name: "garbage_after_valid_entry", archive: func(t *testing.T, e *snapEnv) []byte {
			b := allocdirtest.Tar(t, false, allocdirtest.TarDir("alloc/data"))
			return append(b, bytes.Repeat([]byte{0xa5}, 1024)...)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newSnapEnv(t)
			_, err := snapshot.Extract(bytes.NewReader(tc.archive(t, e)), e.dest, tc.opts)
			e.assertRefused(t, err)
			if tc.check != nil {
				tc.check(t, e)
			}
		})
	}
}

// TestExtractOverlongNameErrorIsShort: the refusal of a name past the cap
// says why without quoting all of it.
func TestExtractOverlongNameErrorIsShort(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t)
	deep := "alloc/data" + strings.Repeat("/"+strings.Repeat("d", 255), 64<<10/256) + "/f"
	archive := allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile(deep, "x"))
	_, err := snapshot.Extract(bytes.NewReader(archive), e.dest, snapshot.ExtractOptions{})
	e.assertRefused(t, err)
	if msg := err.Error(); len(msg) > 1024 || !strings.Contains(msg, "longer than 65536 bytes") {
		t.Errorf("got a %d-byte error %q, want a short one naming the cap", len(msg), msg)
	}
}

// TestExtractErrorEntryText: the sender's error text reaches the caller.
func TestExtractErrorEntryText(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t)
	archive := allocdirtest.Tar(t, true, allocdirtest.TarFile("NOMAD-prev-ERROR.log", "Error snapshotting: disk on fire"))
	_, err := snapshot.Extract(bytes.NewReader(archive), e.dest, snapshot.ExtractOptions{})
	e.assertRefused(t, err)
	if err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("got error %v, want the sender's text in it", err)
	}
}

func snapAssertAbsent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: got stat error %v, want not-exist", p, err)
	}
}

// TestExtractAcceptsForeignArchives takes what other tar writers produce:
// trailing slashes, "./" prefixes, missing parent entries, a directory
// entry after its content and global headers.
func TestExtractAcceptsForeignArchives(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "x"}},
		{Typeflag: tar.TypeReg, Name: "./alloc/data/x/f", Mode: 0o640, Size: 3, ModTime: mt},
		{Typeflag: tar.TypeDir, Name: "alloc/data/x/", Mode: 0o750, ModTime: mt},
		{Typeflag: tar.TypeSymlink, Name: "web/local/up", Linkname: "../../alloc/data/x/f", ModTime: mt},
		{Typeflag: tar.TypeSymlink, Name: "web/local/loop", Linkname: "loop"},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("writing %q: %v", h.Name, err)
		}
		if h.Size > 0 {
			if _, err := tw.Write([]byte("abc")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "dest")
	stats, err := snapshot.Extract(&buf, dest, snapshot.ExtractOptions{})
	if err != nil {
		t.Fatalf("Extract: got error %v, want nil", err)
	}
	want := snapshot.ExtractStats{Entries: 5, Dirs: 1, Files: 1, Symlinks: 2, Skipped: 1, Bytes: 3}
	if stats != want {
		t.Errorf("got stats %+v, want %+v", stats, want)
	}
	tree := snapReadTree(t, dest)
	if n := tree["alloc/data/x"]; n.Mode != os.ModeDir|0o750 || !n.MTime.Equal(mt) {
		t.Errorf("alloc/data/x: got mode %v mtime %v, want %v %v", n.Mode, n.MTime, os.ModeDir|0o750, mt)
	}
	for _, implicit := range []string{"alloc", "alloc/data", "web", "web/local"} {
		if n := tree[implicit]; n.Mode != os.ModeDir|0o755 {
			t.Errorf("%s: got mode %v, want %v", implicit, n.Mode, os.ModeDir|0o755)
		}
	}
	if f := tree["alloc/data/x/f"]; f.Body != "abc" || f.Mode != 0o640 {
		t.Errorf("alloc/data/x/f: got %q mode %v, want %q %v", f.Body, f.Mode, "abc", os.FileMode(0o640))
	}
	if n := tree["web/local/up"]; n.Link != "../../alloc/data/x/f" || !n.MTime.Equal(mt) {
		t.Errorf("web/local/up: got target %q mtime %v, want %q %v", n.Link, n.MTime, "../../alloc/data/x/f", mt)
	}
}

// TestExtractEmptyArchive: an archive that is only a trailer yields an
// empty allocation directory.
func TestExtractEmptyArchive(t *testing.T) {
	t.Parallel()
	dest := filepath.Join(t.TempDir(), "dest")
	stats, err := snapshot.Extract(bytes.NewReader(allocdirtest.Tar(t, true)), dest, snapshot.ExtractOptions{})
	if err != nil {
		t.Fatalf("got error %v, want nil", err)
	}
	if stats != (snapshot.ExtractStats{}) {
		t.Errorf("got stats %+v, want zero", stats)
	}
	entries, err := os.ReadDir(dest)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("got %d entries, want 0", len(entries))
	}
}

// TestExtractDestExists: an existing dest (even a dangling symlink) is
// never replaced nor written into.
func TestExtractDestExists(t *testing.T) {
	t.Parallel()
	archive := allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", "x"))
	for _, kind := range []string{"dir", "symlink"} {
		t.Run(kind, func(t *testing.T) {
			e := newSnapEnv(t)
			if kind == "dir" {
				if err := os.Mkdir(e.dest, 0o755); err != nil {
					t.Fatal(err)
				}
			} else if err := os.Symlink(e.outside, e.dest); err != nil {
				t.Fatal(err)
			}
			_, err := snapshot.Extract(bytes.NewReader(archive), e.dest, snapshot.ExtractOptions{})
			if !errors.Is(err, fs.ErrExist) {
				t.Errorf("got error %v, want one wrapping fs.ErrExist", err)
			}
			snapAssertNoTemp(t, e.parent)
			snapAssertAbsent(t, filepath.Join(e.outside, "alloc"))
		})
	}
}

// TestExtractParentMissing: dest's parent is not created.
func TestExtractParentMissing(t *testing.T) {
	t.Parallel()
	dest := filepath.Join(t.TempDir(), "missing", "dest")
	_, err := snapshot.Extract(bytes.NewReader(allocdirtest.Tar(t, true)), dest, snapshot.ExtractOptions{})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("got error %v, want one wrapping fs.ErrNotExist", err)
	}
	snapAssertAbsent(t, filepath.Dir(dest))
}

// snapFailingReader returns its data, then err.
type snapFailingReader struct {
	r   io.Reader
	err error
}

func (f *snapFailingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

// TestExtractReaderError: a failing source is reported as such, not as a
// bad archive, and leaves nothing behind.
func TestExtractReaderError(t *testing.T) {
	t.Parallel()
	full := allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/a", strings.Repeat("a", 5000)))
	for _, cut := range []int{0, 512, 512 + 512 + 1000, 512 + 512 + 5120} {
		e := newSnapEnv(t)
		r := &snapFailingReader{r: bytes.NewReader(full[:cut]), err: errSnapBoom}
		_, err := snapshot.Extract(r, e.dest, snapshot.ExtractOptions{})
		if !errors.Is(err, errSnapBoom) {
			t.Errorf("cut %d: got error %v, want one wrapping %v", cut, err, errSnapBoom)
		}
		if errors.Is(err, allocdir.ErrArchive) {
			t.Errorf("cut %d: got error %v wrapping ErrArchive, want a transport error", cut, err)
		}
		e.assertNoTrace(t)
	}
}

// TestExtractDiskFull: ENOSPC is an error of this node, not of the
// archive, and the partial tree is removed. It needs a small tmpfs.
func TestExtractDiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount %q: %v", mnt, err)
		}
	})
	dest := filepath.Join(mnt, "dest")
	archive := allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/big", strings.Repeat("x", 1<<20)))
	_, err := snapshot.Extract(bytes.NewReader(archive), dest, snapshot.ExtractOptions{})
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("got error %v, want one wrapping ENOSPC", err)
	}
	if errors.Is(err, allocdir.ErrArchive) {
		t.Errorf("got error %v wrapping ErrArchive, want a local error", err)
	}
	entries, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("got %d entries left in %q, want 0", len(entries), mnt)
	}
}

// TestExtractSparse16GiB: a sparse file, in each of its forms, is a few
// KiB on the wire and 16 GiB of zeros once expanded. It is refused before
// a byte is written, with ErrEntryType, and leaves nothing behind.
func TestExtractSparse16GiB(t *testing.T) {
	t.Parallel()
	const realSize = 16 << 30
	for _, tc := range []struct {
		name    string
		archive []byte
	}{
		{"gnu", allocdirtest.SparseGNUArchive("alloc/data/big", realSize)},
		{"pax_1.0", allocdirtest.SparsePAXArchive("alloc/data/big", realSize, 0)},
		{"pax_0.1", allocdirtest.SparsePAXArchive("alloc/data/big", realSize, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The archive is what it claims: archive/tar expands it.
			if len(tc.archive) > 4<<10 {
				t.Fatalf("archive is %d bytes, want at most 4 KiB", len(tc.archive))
			}
			hdr, err := tar.NewReader(bytes.NewReader(tc.archive)).Next()
			if err != nil {
				t.Fatalf("archive/tar cannot read the crafted archive: %v", err)
			}
			if hdr.Name != "alloc/data/big" || hdr.Size != realSize {
				t.Fatalf("archive/tar reads %q of %d bytes, want %q of %d", hdr.Name, hdr.Size, "alloc/data/big", int64(realSize))
			}

			e := newSnapEnv(t)
			stats, err := snapshot.Extract(bytes.NewReader(tc.archive), e.dest, snapshot.ExtractOptions{})
			e.assertRefused(t, err)
			if !errors.Is(err, snapshot.ErrEntryType) {
				t.Errorf("got error %v, want one wrapping ErrEntryType", err)
			}
			if stats.Bytes != 0 {
				t.Errorf("got %d bytes written, want 0", stats.Bytes)
			}
		})
	}
}

// TestExtractRefusesEntryTypes: every type a snapshot writer never
// produces is refused with ErrEntryType, wherever it is in the archive,
// and leaves nothing behind.
func TestExtractRefusesEntryTypes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		entry allocdirtest.TarEntry
	}{
		{"hard_link_to_archive_file", allocdirtest.TarHardLink("alloc/data/g", "alloc/data/f")},
		{"fifo", allocdirtest.TarEntry{Name: "alloc/data/fifo", Type: tar.TypeFifo, Mode: 0o644}},
		{"char_device", allocdirtest.TarEntry{Name: "alloc/data/null", Type: tar.TypeChar, Mode: 0o666, Major: 1}},
		{"block_device", allocdirtest.TarEntry{Name: "alloc/data/sda", Type: tar.TypeBlock, Mode: 0o660, Major: 8}},
		{"contiguous_file", allocdirtest.TarEntry{Name: "alloc/data/c", Type: tar.TypeCont, Mode: 0o644}},
		{"vendor_type", allocdirtest.TarEntry{Name: "alloc/data/v", Type: 'V', Mode: 0o644}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newSnapEnv(t)
			archive := allocdirtest.Tar(t, true, allocdirtest.TarDir("alloc/data"), allocdirtest.TarFile("alloc/data/f", "x"), tc.entry, allocdirtest.TarFile("alloc/data/z", "z"))
			_, err := snapshot.Extract(bytes.NewReader(archive), e.dest, snapshot.ExtractOptions{})
			e.assertRefused(t, err)
			if !errors.Is(err, snapshot.ErrEntryType) {
				t.Errorf("got error %v, want one wrapping ErrEntryType", err)
			}
		})
	}
}

// TestExtractManyLongNamesBoundedMemory: what extraction keeps while it
// runs does not grow with the names of the archive. 4,000 entries with
// names of 3.8 KB (15 MB of names, half of them directories) go through
// Extract while the heap is measured just before the trailer.
// Not parallel: it measures the whole process's heap.
func TestExtractManyLongNamesBoundedMemory(t *testing.T) {
	const (
		entries = 4000
		// Enough for the copy buffer and a few hundred bytes per entry,
		// far below the names themselves.
		maxGrowth = 4 << 20
	)
	// 15 components of 250 bytes: every name is near PATH_MAX.
	var chain []string
	for i := range 15 {
		chain = append(chain, fmt.Sprintf("%03d%s", i, strings.Repeat("n", 247)))
	}
	deep := "alloc/data/" + strings.Join(chain, "/")

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	pr, pw := io.Pipe()
	var peak uint64
	var nameBytes int64
	go func() {
		tw := tar.NewWriter(pw)
		write := func(h *tar.Header, body string) error {
			nameBytes += int64(len(h.Name))
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			_, err := io.WriteString(tw, body)
			return err
		}
		err := write(&tar.Header{Typeflag: tar.TypeDir, Name: "alloc/data", Mode: 0o755}, "")
		for i := 0; err == nil && i < entries; i++ {
			if i%2 == 0 {
				err = write(&tar.Header{Typeflag: tar.TypeDir, Name: fmt.Sprintf("%s/d%05d", deep, i), Mode: 0o750}, "")
			} else {
				err = write(&tar.Header{Typeflag: tar.TypeReg, Name: fmt.Sprintf("%s/f%05d", deep, i), Mode: 0o640, Size: 1}, "x")
			}
		}
		if err == nil {
			// A pipe write returns once the reader took every byte: the
			// extractor holds all it will hold but the last entry.
			err = tw.Flush()
		}
		if err == nil {
			peak = heap()
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()

	base := heap()
	dest := filepath.Join(t.TempDir(), "dest")
	stats, err := snapshot.Extract(pr, dest, snapshot.ExtractOptions{})
	if err != nil {
		t.Fatalf("Extract: %v", err)
	}
	if stats.Entries != entries+1 || stats.Dirs != entries/2+1 || stats.Files != entries/2 {
		t.Errorf("got stats %+v, want %d entries, %d dirs, %d files", stats, entries+1, entries/2+1, entries/2)
	}
	growth := int64(peak) - int64(base)
	t.Logf("names: %d bytes in %d entries; heap growth while extracting: %d bytes (%d per entry)",
		nameBytes, entries, growth, growth/entries)
	if nameBytes < 3*maxGrowth {
		t.Fatalf("got %d bytes of names, want at least %d for the measurement to mean anything", nameBytes, 3*maxGrowth)
	}
	if growth > maxGrowth {
		t.Errorf("heap grew by %d bytes while extracting, want at most %d: extraction keeps the names", growth, maxGrowth)
	}
	// The metadata kept for the directories was applied.
	fi, err := os.Stat(filepath.Join(dest, deep, "d00000"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o750 {
		t.Errorf("%s/d00000: got mode %v, want %v", deep, fi.Mode().Perm(), os.FileMode(0o750))
	}
}
