//go:build linux

package snapshot_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
)

// snapTestAllocID is the allocation ID used by the snapshot tests.
const snapTestAllocID = "0b4d2b1e-5ad1-4c61-9cf0-7e3e4f1c2a77"

// snapRoots are the roots of the test allocation, in Nomad's order.
var snapRoots = []string{"alloc/data", "web/local"}

// snapLongName needs a PAX header (more than 100 bytes).
var snapLongName = strings.Repeat("n", 150)

// snapBuildAlloc lays out a small allocation directory with every kind of
// node a snapshot meets, and returns its path. Times are whole seconds
// because the tar writer rounds them.
func snapBuildAlloc(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), snapTestAllocID)
	big := make([]byte, 3<<20+17)
	if _, err := rand.Read(big); err != nil {
		t.Fatal(err)
	}
	type file struct {
		name string
		mode os.FileMode
		body []byte
	}
	dirs := []struct {
		name string
		mode os.FileMode
	}{
		{"alloc", 0o755},
		{"alloc/data", 0o777},
		{"alloc/logs", 0o777},
		{"alloc/data/bin", 0o755},
		{"alloc/data/empty", 0o700},
		{"alloc/data/nested/deep/er", 0o750},
		{"alloc/data/sticky", 0o777 | os.ModeSticky},
		{"alloc/data/ro", 0o555},
		{"web", 0o777},
		{"web/local", 0o777},
		{"web/secrets", 0o777},
	}
	files := []file{
		{"alloc/data/a.txt", 0o644, []byte("hello\n")},
		{"alloc/data/secret.key", 0o600, []byte("k3y")},
		{"alloc/data/bin/run.sh", 0o755, []byte("#!/bin/sh\necho hi\n")},
		{"alloc/data/nested/deep/er/file", 0o640, []byte("x")},
		{"alloc/data/empty.bin", 0o644, nil},
		{"alloc/data/ro/f", 0o444, []byte("read only")},
		{"alloc/data/big.bin", 0o644, big},
		{"alloc/data/" + snapLongName, 0o644, []byte("long")},
		{"alloc/logs/web.stdout.0", 0o644, []byte("log line")},
		{"web/local/conf", 0o644, []byte("key = value\n")},
		{"web/secrets/token", 0o600, []byte("s3cr3t")},
	}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, d.name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.body, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []struct{ name, target string }{
		{"alloc/data/link", "a.txt"},
		{"alloc/data/uplink", "../../web/local/conf"},
	} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mkfifo(filepath.Join(dir, "alloc/data/fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Modes last: a read-only directory must not stop a non-root test
	// from filling it.
	for _, d := range dirs {
		if err := os.Chmod(filepath.Join(dir, d.name), d.mode); err != nil {
			t.Fatal(err)
		}
	}
	snapMakeRemovable(t, dir)
	snapSetTimes(t, dir)
	return dir
}

// snapMakeRemovable lets t.TempDir's cleanup remove dir even as non-root
// when it holds read-only directories.
func snapMakeRemovable(t *testing.T, dir string) {
	t.Cleanup(func() {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if d != nil && d.IsDir() {
				_ = os.Chmod(p, 0o755)
			}
			return nil
		})
	})
}

// snapSetTimes gives every node under dir a distinct whole-second mtime,
// deepest first so that setting a child's time does not disturb a parent.
func snapSetTimes(t *testing.T, dir string) {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		paths = append(paths, p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortStableFunc(paths, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	base := time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)
	for i, p := range paths {
		mt := base.Add(time.Duration(i) * time.Hour)
		ts := []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			t.Fatal(err)
		}
	}
}

// snapNode is what the tests compare of one node.
type snapNode struct {
	Mode     fs.FileMode
	Body     string
	Link     string
	MTime    time.Time
	UID, GID uint32
	Ino      uint64
}

// snapReadTree describes every node under root by its slash path relative
// to root ("." for root), without following links.
func snapReadTree(t *testing.T, root string) map[string]snapNode {
	t.Helper()
	out := make(map[string]snapNode)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		n := snapNode{Mode: info.Mode(), MTime: info.ModTime(), UID: st.Uid, GID: st.Gid, Ino: st.Ino}
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.Body = string(b)
		case info.Mode()&fs.ModeSymlink != 0:
			if n.Link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		out[filepath.ToSlash(rel)] = n
		return nil
	})
	if err != nil {
		t.Fatalf("failed to read tree %q: %v", root, err)
	}
	return out
}

// snapCompareTrees fails on every node that differs between want and got,
// ignoring inode numbers.
func snapCompareTrees(t *testing.T, got, want map[string]snapNode) {
	t.Helper()
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("%s: missing from extracted tree", name)
			continue
		}
		g.Ino, w.Ino = 0, 0
		if g.Mode != w.Mode {
			t.Errorf("%s: got mode %v, want %v", name, g.Mode, w.Mode)
		}
		if g.Body != w.Body {
			t.Errorf("%s: got %d bytes of content, want %d (content differs)", name, len(g.Body), len(w.Body))
		}
		if g.Link != w.Link {
			t.Errorf("%s: got link target %q, want %q", name, g.Link, w.Link)
		}
		if !g.MTime.Equal(w.MTime) {
			t.Errorf("%s: got mtime %v, want %v", name, g.MTime, w.MTime)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: in extracted tree, not in source", name)
		}
	}
}

// snapWrite snapshots dir's roots with os.DirFS and returns the archive.
func snapWrite(t *testing.T, dir string, roots []string) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := snapshot.Write(&buf, snapTestAllocID, os.DirFS(dir), roots); err != nil {
		t.Fatalf("Write: got error %v, want nil", err)
	}
	return buf.Bytes()
}

// snapHeaders reads every header of an archive, failing on anything but
// a clean end.
func snapHeaders(t *testing.T, archive []byte) []*tar.Header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var out []*tar.Header
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("reading archive: got error %v, want nil", err)
		}
		out = append(out, hdr)
	}
}

// TestSnapshotDirFSImplementsReadLinkFS pins the Go 1.25 API the tests
// and callers rely on.
func TestSnapshotDirFSImplementsReadLinkFS(t *testing.T) {
	t.Parallel()
	var fsys fs.FS = os.DirFS(t.TempDir())
	if _, ok := fsys.(fs.ReadLinkFS); !ok {
		t.Fatalf("os.DirFS: got no fs.ReadLinkFS, want one")
	}
	if _, ok := fsys.(fs.ReadDirFS); !ok {
		t.Fatalf("os.DirFS: got no fs.ReadDirFS, want one")
	}
}

// TestSnapshotHeaders checks names, order, types and owners of the
// entries, and that FIFOs and sockets are skipped and unrelated
// directories never included.
func TestSnapshotHeaders(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	sock := filepath.Join(dir, "web/local/sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("listen on %q: %v", sock, err)
	}
	t.Cleanup(func() { l.Close() })

	hdrs := snapHeaders(t, snapWrite(t, dir, snapRoots))
	var names []string
	for _, h := range hdrs {
		names = append(names, h.Name)
	}
	want := []string{
		"alloc/data",
		"alloc/data/a.txt",
		"alloc/data/big.bin",
		"alloc/data/bin",
		"alloc/data/bin/run.sh",
		"alloc/data/empty",
		"alloc/data/empty.bin",
		"alloc/data/link",
		"alloc/data/nested",
		"alloc/data/nested/deep",
		"alloc/data/nested/deep/er",
		"alloc/data/nested/deep/er/file",
		"alloc/data/" + snapLongName,
		"alloc/data/ro",
		"alloc/data/ro/f",
		"alloc/data/secret.key",
		"alloc/data/sticky",
		"alloc/data/uplink",
		"web/local",
		"web/local/conf",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("got entries\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	for _, h := range hdrs {
		var wantType byte
		switch {
		case strings.HasSuffix(h.Name, "link"):
			wantType = tar.TypeSymlink
		case slices.Contains([]string{"alloc/data", "alloc/data/bin", "alloc/data/empty", "alloc/data/nested", "alloc/data/nested/deep", "alloc/data/nested/deep/er", "alloc/data/ro", "alloc/data/sticky", "web/local"}, h.Name):
			wantType = tar.TypeDir
		default:
			wantType = tar.TypeReg
		}
		if h.Typeflag != wantType {
			t.Errorf("%s: got type %q, want %q", h.Name, h.Typeflag, wantType)
		}
		if h.Uid != os.Getuid() || h.Gid != os.Getgid() {
			t.Errorf("%s: got owner %d:%d, want %d:%d", h.Name, h.Uid, h.Gid, os.Getuid(), os.Getgid())
		}
	}
	for _, h := range hdrs {
		switch h.Name {
		case "alloc/data/link":
			if h.Linkname != "a.txt" {
				t.Errorf("%s: got target %q, want %q", h.Name, h.Linkname, "a.txt")
			}
		case "alloc/data/uplink":
			if h.Linkname != "../../web/local/conf" {
				t.Errorf("%s: got target %q, want %q", h.Name, h.Linkname, "../../web/local/conf")
			}
		case "alloc/data/sticky":
			if h.Mode != 0o1777 {
				t.Errorf("%s: got mode %o, want %o", h.Name, h.Mode, 0o1777)
			}
		case "alloc/data/big.bin":
			if h.Size != 3<<20+17 {
				t.Errorf("%s: got size %d, want %d", h.Name, h.Size, 3<<20+17)
			}
		}
	}
}

// TestSnapshotRoundTrip snapshots an allocation and extracts it again:
// content, modes, link targets and mtimes survive, the FIFO does not.
func TestSnapshotRoundTrip(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })

	for _, tc := range []struct {
		name string
		fsys fs.FS
	}{
		{"DirFS", os.DirFS(dir)},
		{"RootFS", root.FS()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := snapshot.Write(&buf, snapTestAllocID, tc.fsys, snapRoots); err != nil {
				t.Fatalf("Write: got error %v, want nil", err)
			}
			dest := filepath.Join(t.TempDir(), "dest")
			snapMakeRemovable(t, dest)
			stats, err := snapshot.Extract(&buf, dest, snapshot.ExtractOptions{})
			if err != nil {
				t.Fatalf("Extract: got error %v, want nil", err)
			}
			wantStats := snapshot.ExtractStats{Entries: 20, Dirs: 9, Files: 9, Symlinks: 2, Bytes: 3<<20 + 17 + 6 + 3 + 18 + 1 + 4 + 12 + 9}
			if stats != wantStats {
				t.Errorf("got stats %+v, want %+v", stats, wantStats)
			}
			for _, r := range snapRoots {
				want := snapReadTree(t, filepath.Join(dir, r))
				if _, ok := want["fifo"]; r == "alloc/data" && !ok {
					t.Fatalf("test tree lacks its FIFO")
				}
				delete(want, "fifo")
				snapCompareTrees(t, snapReadTree(t, filepath.Join(dest, r)), want)
			}
			for name, want := range map[string]os.FileMode{
				".":     os.ModeDir | 0o755,
				"alloc": os.ModeDir | 0o755,
				"web":   os.ModeDir | 0o755,
			} {
				fi, err := os.Lstat(filepath.Join(dest, name))
				if err != nil {
					t.Fatal(err)
				}
				if fi.Mode() != want {
					t.Errorf("%s: got mode %v, want %v", name, fi.Mode(), want)
				}
			}
			for _, absent := range []string{"alloc/logs", "web/secrets", "alloc/data/fifo"} {
				if _, err := os.Lstat(filepath.Join(dest, absent)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("%s: got stat error %v, want not-exist", absent, err)
				}
			}
			snapAssertNoTemp(t, filepath.Dir(dest))
		})
	}
}

// TestSnapshotRoundTripOwners restores owners only when asked to.
func TestSnapshotRoundTripOwners(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	dir := snapBuildAlloc(t)
	for _, p := range []string{"alloc/data/a.txt", "alloc/data/bin", "alloc/data/link"} {
		if err := os.Lchown(filepath.Join(dir, p), 1234, 5678); err != nil {
			t.Fatal(err)
		}
	}
	archive := snapWrite(t, dir, snapRoots)
	for _, tc := range []struct {
		chown    bool
		uid, gid uint32
	}{{true, 1234, 5678}, {false, 0, 0}} {
		dest := filepath.Join(t.TempDir(), "dest")
		snapMakeRemovable(t, dest)
		if _, err := snapshot.Extract(bytes.NewReader(archive), dest, snapshot.ExtractOptions{Chown: tc.chown}); err != nil {
			t.Fatalf("Extract: got error %v, want nil", err)
		}
		tree := snapReadTree(t, filepath.Join(dest, "alloc/data"))
		for _, p := range []string{"a.txt", "bin", "link"} {
			if n := tree[p]; n.UID != tc.uid || n.GID != tc.gid {
				t.Errorf("Chown=%v: %s: got owner %d:%d, want %d:%d", tc.chown, p, n.UID, n.GID, tc.uid, tc.gid)
			}
		}
		if n := tree["secret.key"]; n.UID != 0 {
			t.Errorf("Chown=%v: secret.key: got uid %d, want 0", tc.chown, n.UID)
		}
	}
}

// TestSnapshotDropsSetID: a set-id file or directory comes back without
// the set-id bits, sticky survives.
func TestSnapshotDropsSetID(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	for p, m := range map[string]os.FileMode{
		"alloc/data/bin/run.sh": 0o755 | os.ModeSetuid | os.ModeSetgid,
		"alloc/data/bin":        0o775 | os.ModeSetgid | os.ModeSticky,
	} {
		if err := os.Chmod(filepath.Join(dir, p), m); err != nil {
			t.Fatal(err)
		}
	}
	dest := filepath.Join(t.TempDir(), "dest")
	snapMakeRemovable(t, dest)
	if _, err := snapshot.Extract(bytes.NewReader(snapWrite(t, dir, snapRoots)), dest, snapshot.ExtractOptions{}); err != nil {
		t.Fatalf("Extract: got error %v, want nil", err)
	}
	for p, want := range map[string]os.FileMode{
		"alloc/data/bin/run.sh": 0o755,
		"alloc/data/bin":        os.ModeDir | os.ModeSticky | 0o775,
	} {
		fi, err := os.Lstat(filepath.Join(dest, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: got mode %v, want %v", p, fi.Mode(), want)
		}
	}
}

// TestSnapshotMissingRootWritesErrorEntry: a missing root ends the archive
// with Nomad's error entry and a trailer, and the archive is refused.
func TestSnapshotMissingRootWritesErrorEntry(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	var buf bytes.Buffer
	err := snapshot.Write(&buf, snapTestAllocID, os.DirFS(dir), []string{"alloc/data", "api/local"})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Write: got error %v, want one wrapping fs.ErrNotExist", err)
	}
	archive := buf.Bytes()
	if tail := archive[len(archive)-1024:]; !bytes.Equal(tail, make([]byte, 1024)) {
		t.Fatalf("got no end-of-archive trailer, want one")
	}

	tr := tar.NewReader(bytes.NewReader(archive))
	var last *tar.Header
	var body []byte
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("reading archive: got error %v, want nil", err)
		}
		if last != nil && strings.HasPrefix(last.Name, "NOMAD-") {
			t.Fatalf("got entry %q after the error entry, want none", hdr.Name)
		}
		last = hdr
		if body, err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
	wantName := "NOMAD-" + snapTestAllocID + "-ERROR.log"
	if last == nil || last.Name != wantName {
		t.Fatalf("got last entry %v, want %q", last, wantName)
	}
	wantTime := time.Date(1999, 11, 30, 0, 0, 0, 0, time.UTC)
	if last.Typeflag != tar.TypeReg || last.Mode != 0o666 || !last.ModTime.Equal(wantTime) {
		t.Errorf("got type %q mode %o mtime %v, want %q %o %v", last.Typeflag, last.Mode, last.ModTime, tar.TypeReg, 0o666, wantTime)
	}
	if !strings.HasPrefix(string(body), "Error snapshotting: ") || !strings.Contains(string(body), "api/local") {
		t.Errorf("got body %q, want \"Error snapshotting: ...\" naming the root", body)
	}

	env := newSnapEnv(t)
	_, err = snapshot.Extract(bytes.NewReader(archive), env.dest, snapshot.ExtractOptions{})
	env.assertRefused(t, err)
	if !strings.Contains(err.Error(), "api/local") {
		t.Errorf("got error %q, want the sender's text in it", err)
	}
}

// TestSnapshotRequiresReadLinkFS: an fs without lstat/readlink is
// refused before anything is written.
func TestSnapshotRequiresReadLinkFS(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	var buf bytes.Buffer
	err := snapshot.Write(&buf, snapTestAllocID, struct{ fs.FS }{os.DirFS(dir)}, snapRoots)
	if err == nil {
		t.Fatalf("got nil error, want one")
	}
	if buf.Len() != 0 {
		t.Errorf("got %d bytes written, want 0", buf.Len())
	}
}

var errSnapBoom = errors.New("boom")

// snapFailingWriter fails once more than limit bytes were written.
type snapFailingWriter struct{ limit, n int }

func (w *snapFailingWriter) Write(p []byte) (int, error) {
	if w.n+len(p) > w.limit {
		return 0, errSnapBoom
	}
	w.n += len(p)
	return len(p), nil
}

// TestSnapshotWriterError: a failing writer's error is returned as is.
func TestSnapshotWriterError(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	for _, limit := range []int{0, 4096, 2 << 20} {
		err := snapshot.Write(&snapFailingWriter{limit: limit}, snapTestAllocID, os.DirFS(dir), snapRoots)
		if !errors.Is(err, errSnapBoom) {
			t.Errorf("limit %d: got error %v, want %v", limit, err, errSnapBoom)
		}
	}
}

// snapSizeFS lies about one file: Lstat, and the Stat of the opened file,
// report size, and reads yield only body bytes of it, as if the file
// changed between its stat and its read.
type snapSizeFS struct {
	dir  string
	name string
	size int64
	body int64
}

func (s snapSizeFS) fsys() fs.FS { return os.DirFS(s.dir) }

// ReadDir tells the same lie as Lstat: a listing's entries carry the
// lstat the walk uses.
func (s snapSizeFS) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := s.fsys().(fs.ReadDirFS).ReadDir(name)
	for i, e := range entries {
		if path.Join(name, e.Name()) != s.name {
			continue
		}
		fi, err := e.Info()
		if err != nil {
			return nil, err
		}
		entries[i] = fs.FileInfoToDirEntry(snapSizedInfo{fi, s.size})
	}
	return entries, err
}
func (s snapSizeFS) ReadLink(name string) (string, error) {
	return s.fsys().(fs.ReadLinkFS).ReadLink(name)
}

func (s snapSizeFS) Lstat(name string) (fs.FileInfo, error) {
	fi, err := s.fsys().(fs.ReadLinkFS).Lstat(name)
	if err != nil || name != s.name {
		return fi, err
	}
	return snapSizedInfo{fi, s.size}, nil
}

func (s snapSizeFS) Open(name string) (fs.File, error) {
	f, err := s.fsys().Open(name)
	if err != nil || name != s.name {
		return f, err
	}
	return snapShortFile{f, io.LimitReader(f, s.body), s.size}, nil
}

type snapSizedInfo struct {
	fs.FileInfo
	size int64
}

func (i snapSizedInfo) Size() int64 { return i.size }

type snapShortFile struct {
	fs.File
	r    io.Reader
	size int64
}

func (f snapShortFile) Read(p []byte) (int, error) { return f.r.Read(p) }

func (f snapShortFile) Stat() (fs.FileInfo, error) {
	fi, err := f.File.Stat()
	if err != nil {
		return nil, err
	}
	return snapSizedInfo{fi, f.size}, nil
}

// TestSnapshotFileShrank: fewer bytes than stat-ed is an error reported
// in-band after the short entry was padded out.
func TestSnapshotFileShrank(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	fsys := snapSizeFS{dir: dir, name: "alloc/data/big.bin", size: 3<<20 + 17, body: 1<<20 + 5}
	var buf bytes.Buffer
	err := snapshot.Write(&buf, snapTestAllocID, fsys, snapRoots)
	if err == nil {
		t.Fatalf("got nil error, want one")
	}
	hdrs := snapHeaders(t, buf.Bytes())
	if got, want := hdrs[len(hdrs)-1].Name, "NOMAD-"+snapTestAllocID+"-ERROR.log"; got != want {
		t.Fatalf("got last entry %q, want %q", got, want)
	}
	env := newSnapEnv(t)
	_, err = snapshot.Extract(bytes.NewReader(buf.Bytes()), env.dest, snapshot.ExtractOptions{})
	env.assertRefused(t, err)
}

// TestSnapshotFileGrew: bytes added after the stat are left out and the
// archive stays consistent.
func TestSnapshotFileGrew(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	fsys := snapSizeFS{dir: dir, name: "alloc/data/a.txt", size: 3, body: 1 << 30}
	var buf bytes.Buffer
	if err := snapshot.Write(&buf, snapTestAllocID, fsys, snapRoots); err != nil {
		t.Fatalf("Write: got error %v, want nil", err)
	}
	dest := filepath.Join(t.TempDir(), "dest")
	snapMakeRemovable(t, dest)
	if _, err := snapshot.Extract(&buf, dest, snapshot.ExtractOptions{}); err != nil {
		t.Fatalf("Extract: got error %v, want nil", err)
	}
	got, err := os.ReadFile(filepath.Join(dest, "alloc/data/a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "hel" {
		t.Errorf("got content %q, want %q", got, "hel")
	}
}

// snapStaleFS is the on-disk snapshot filesystem, whose listings carry
// each entry's lstat, with a change made right after the listing of
// alloc/data: the walk then holds information that is no longer true.
type snapStaleFS struct {
	allocdir.ReadFS
	after func()
}

func (s snapStaleFS) ReadDir(name string) ([]fs.DirEntry, error) {
	entries, err := s.ReadFS.ReadDir(name)
	if name == "alloc/data" {
		s.after()
	}
	return entries, err
}

// snapStaleRun snapshots dir through snapStaleFS, calling change right
// after the listing of alloc/data.
func snapStaleRun(t *testing.T, dir string, change func()) ([]byte, error) {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var buf bytes.Buffer
	err = snapshot.Write(&buf, snapTestAllocID, snapStaleFS{allocdir.NewBeneathFS(fd), change}, snapRoots)
	return buf.Bytes(), err
}

// TestSnapshotFileChangedSinceListing: a file replaced or resized
// between the listing of its directory and its read is archived as it is
// when read, not refused: only a name that no longer is a regular file
// is an error.
func TestSnapshotFileChangedSinceListing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, p string)
		want   string
	}{
		{"replaced", func(t *testing.T, p string) {
			if err := os.WriteFile(p+".new", []byte("replacement, longer"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		}, "replacement, longer"},
		{"truncated", func(t *testing.T, p string) {
			if err := os.Truncate(p, 2); err != nil {
				t.Fatal(err)
			}
		}, "he"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := snapBuildAlloc(t)
			p := filepath.Join(dir, "alloc/data/a.txt")
			archive, err := snapStaleRun(t, dir, func() { tc.change(t, p) })
			if err != nil {
				t.Fatalf("Write: got error %v, want nil", err)
			}
			dest := filepath.Join(t.TempDir(), "dest")
			snapMakeRemovable(t, dest)
			if _, err := snapshot.Extract(bytes.NewReader(archive), dest, snapshot.ExtractOptions{}); err != nil {
				t.Fatalf("Extract: got error %v, want nil", err)
			}
			got, err := os.ReadFile(filepath.Join(dest, "alloc/data/a.txt"))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got content %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSnapshotHeaderDescribesTheFileRead: after the listing of its
// directory, a file is removed and a root-only file of the same size takes
// its name, usually with the same inode number. Its bytes must go out
// under its own mode and owner, not the listed file's.
func TestSnapshotHeaderDescribesTheFileRead(t *testing.T) {
	t.Parallel()
	dir := snapBuildAlloc(t)
	p := filepath.Join(dir, "alloc/data/public")
	if err := os.WriteFile(p, []byte("public"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	archive, err := snapStaleRun(t, dir, func() {
		if err := os.Remove(p); err != nil {
			t.Error(err)
		}
		if err := os.WriteFile(p, []byte("SECRET"), 0o600); err != nil {
			t.Error(err)
		}
		if err := os.Lchown(p, 0, 0); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatal("no entry for alloc/data/public")
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != "alloc/data/public" {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != "SECRET" || h.Mode&0o777 != 0o600 || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("got %q under mode %o owner %d:%d, want the new file's 0600 0:0", body, h.Mode&0o777, h.Uid, h.Gid)
		}
		return
	}
}

// TestSnapshotEntryChangedKindSinceListing: a name whose file became a
// link or a directory between the listing of its directory and its turn in
// the walk is archived as what it is then, never with the content of
// something else under the old kind's header.
func TestSnapshotEntryChangedKindSinceListing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		make  func(p string) error
		check func(t *testing.T, h *tar.Header)
	}{
		{"link", func(p string) error { return os.Symlink("secret.key", p) }, func(t *testing.T, h *tar.Header) {
			if h.Typeflag != tar.TypeSymlink || h.Linkname != "secret.key" {
				t.Errorf("got type %q to %q, want a link to secret.key", h.Typeflag, h.Linkname)
			}
		}},
		{"directory", func(p string) error { return os.Mkdir(p, 0o755) }, func(t *testing.T, h *tar.Header) {
			if h.Typeflag != tar.TypeDir {
				t.Errorf("got type %q, want a directory", h.Typeflag)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := snapBuildAlloc(t)
			p := filepath.Join(dir, "alloc/data/a.txt")
			archive, err := snapStaleRun(t, dir, func() {
				if err := os.Remove(p); err != nil {
					t.Error(err)
				}
				if err := tc.make(p); err != nil {
					t.Error(err)
				}
			})
			if err != nil {
				t.Fatalf("Write: %v", err)
			}
			var found *tar.Header
			for _, h := range snapHeaders(t, archive) {
				if h.Name == "alloc/data/a.txt" {
					found = h
				}
			}
			if found == nil {
				t.Fatalf("no entry for the changed name")
			}
			tc.check(t, found)
			env := newSnapEnv(t)
			if _, err := snapshot.Extract(bytes.NewReader(archive), env.dest, snapshot.ExtractOptions{}); err != nil {
				t.Errorf("extracting: %v", err)
			}
		})
	}
}
