//go:build linux

package allocdirtest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir/snapshot"
)

// snapshotItem is one fixture of the round trip and what must come back.
type snapshotItem struct {
	rel     string
	kind    fs.FileMode // 0 (regular), fs.ModeDir or fs.ModeSymlink
	content string      // file content or link target
	perm    fs.FileMode
}

// snapshotTree is what the round trip archives: files with content and
// several modes, nested and empty directories and a relative link.
var snapshotTree = []snapshotItem{
	{rel: "alloc/data/file.txt", content: "hello", perm: 0o600},
	{rel: "alloc/data/run.sh", content: "#!/bin/sh\necho hi\n", perm: 0o755},
	{rel: "alloc/data/nested", kind: fs.ModeDir, perm: 0o755},
	{rel: "alloc/data/nested/deeper", kind: fs.ModeDir, perm: 0o700},
	{rel: "alloc/data/nested/deeper/n.txt", content: strings.Repeat("n", 3000), perm: 0o644},
	{rel: "alloc/data/empty", kind: fs.ModeDir, perm: 0o750},
	{rel: "alloc/data/rel", kind: fs.ModeSymlink, content: "nested/deeper/n.txt"},
	{rel: "web/local/conf", content: "port = 8080\n", perm: 0o640},
	{rel: "web/local/sub", kind: fs.ModeDir, perm: 0o755},
	{rel: "web/local/sub/x", content: "", perm: 0o644},
}

// applySnapshotTree creates snapshotTree below an allocation root.
func applySnapshotTree(t *testing.T, root string) {
	t.Helper()
	for _, it := range snapshotTree {
		switch it.kind {
		case fs.ModeDir:
			apply(t, root, dir(it.rel, it.perm))
		case fs.ModeSymlink:
			apply(t, root, symlink(it.rel, it.content))
		default:
			apply(t, root, file(it.rel, it.content, it.perm))
		}
	}
	// Directories that were given a restrictive mode before their content
	// was created get it (again) last.
	for _, it := range snapshotTree {
		if it.kind == fs.ModeDir {
			apply(t, root, dir(it.rel, it.perm))
		}
	}
}

// tarEntries lists the headers of an archive, failing t on a read error.
func tarEntries(t *testing.T, b []byte) []*tar.Header {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []*tar.Header
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("reading the snapshot as tar: %v", err)
		}
		out = append(out, hdr)
	}
}

// testSnapshot checks Snapshot: the tar's names and roots, what is left
// out, that links are not followed, FIFOs, and a round trip through
// snapshot.Extract.
func testSnapshot(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	applySnapshotTree(t, a.AllocDirPath())
	apply(t, a.AllocDirPath(),
		file("alloc/logs/web.stdout.0", "log", 0o644),
		file("alloc/tmp/t", "tmp", 0o644),
		file("web/tmp/t", "tmp", 0o644),
		file("web/secrets/s", "secret", 0o600),
		file("web/private/p", "private", 0o600),
		file("web/executor.out", "out", 0o644),
	)
	var buf bytes.Buffer
	if err := a.Snapshot(&buf); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	archive := buf.Bytes()

	// Names are relative to the alloc dir (no "./", no leading or trailing
	// "/"), alloc/data comes first, parents precede children, and nothing
	// but alloc/data and the tasks' local/ is included.
	t.Run("Names", func(t *testing.T) {
		hdrs := tarEntries(t, archive)
		if len(hdrs) == 0 || hdrs[0].Name != "alloc/data" {
			t.Fatalf("first entry: got %v, want alloc/data", hdrNames(hdrs[:min(1, len(hdrs))]))
		}
		seen := map[string]bool{}
		for _, hdr := range hdrs {
			n := hdr.Name
			if strings.HasPrefix(n, "./") || strings.HasPrefix(n, "/") || strings.HasSuffix(n, "/") {
				t.Errorf("entry name %q: want no leading ./ or / and no trailing /", n)
			}
			if n != "alloc/data" && n != "web/local" {
				if parent := filepath.Dir(n); !seen[parent] {
					t.Errorf("entry %q comes before its parent %q", n, parent)
				}
			}
			if !strings.HasPrefix(n+"/", "alloc/data/") && !strings.HasPrefix(n+"/", "web/local/") {
				t.Errorf("entry %q is outside alloc/data and web/local", n)
			}
			if strings.HasPrefix(n, "NOMAD-") {
				t.Errorf("entry %q: a successful snapshot has no error entry", n)
			}
			seen[n] = true
		}
		want := []string{"alloc/data", "web/local"}
		for _, it := range snapshotTree {
			want = append(want, it.rel)
		}
		got := hdrNames(hdrs)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("entries: got %v, want %v", got, want)
		}
	})

	// The archive unpacks with snapshot.Extract to the same content, modes,
	// link targets and empty directories.
	t.Run("RoundTrip", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "out")
		stats, err := snapshot.Extract(bytes.NewReader(archive), out, snapshot.ExtractOptions{})
		if err != nil {
			t.Fatalf("snapshot.Extract: %v", err)
		}
		var files, dirs, links int
		var size int64
		for _, it := range snapshotTree {
			p := hostJoin(out, it.rel)
			fi, err := os.Lstat(p)
			if err != nil {
				t.Errorf("%s: %v", it.rel, err)
				continue
			}
			switch it.kind {
			case fs.ModeSymlink:
				links++
				target, err := os.Readlink(p)
				if err != nil || target != it.content {
					t.Errorf("%s: got link to (%q, %v), want %q", it.rel, target, err, it.content)
				}
			case fs.ModeDir:
				dirs++
				if fi.Mode() != fs.ModeDir|it.perm {
					t.Errorf("%s: got mode %v, want %v", it.rel, fi.Mode(), fs.ModeDir|it.perm)
				}
			default:
				files++
				size += int64(len(it.content))
				if fi.Mode() != it.perm {
					t.Errorf("%s: got mode %v, want %v", it.rel, fi.Mode(), it.perm)
				}
				if b, err := os.ReadFile(p); err != nil || string(b) != it.content {
					t.Errorf("%s: got content (%q, %v), want %q", it.rel, b, err, it.content)
				}
			}
		}
		wantMode(t, hostJoin(out, "alloc/data"), fs.ModeDir|0o777)
		wantMode(t, hostJoin(out, "web/local"), fs.ModeDir|0o777)
		if infos, err := os.ReadDir(hostJoin(out, "alloc/data/empty")); err != nil || len(infos) != 0 {
			t.Errorf("empty dir after extraction: got (%d entries, %v), want present and empty", len(infos), err)
		}
		for _, gone := range []string{"alloc/logs", "alloc/tmp", "web/tmp", "web/secrets", "web/private", "web/executor.out"} {
			if _, err := os.Lstat(hostJoin(out, gone)); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s after extraction: got %v, want it missing", gone, err)
			}
		}
		dirs += 2 // alloc/data and web/local
		want := snapshot.ExtractStats{Entries: files + dirs + links, Dirs: dirs, Files: files, Symlinks: links, Bytes: size}
		if stats != want {
			t.Errorf("ExtractStats: got %+v, want %+v", stats, want)
		}
	})

	// Extraction into an existing directory is refused and leaves it alone.
	t.Run("DestExists", func(t *testing.T) {
		out := t.TempDir()
		apply(t, out, file("mine", "mine", 0o644))
		if _, err := snapshot.Extract(bytes.NewReader(archive), out, snapshot.ExtractOptions{}); err == nil {
			t.Errorf("snapshot.Extract into an existing dir: got nil, want an error")
		}
		if got := tree(t, out); len(got) != 2 {
			t.Errorf("existing dir after a refused extraction: got %v, want only mine", got)
		}
	})

	// Links are archived as links with their raw target and never
	// descended, wherever they point.
	t.Run("LinksNotFollowed", func(t *testing.T) {
		b := h.built(t, allocB, "web")
		apply(t, b.AllocDirPath(),
			file("web/secrets/s", "secret", 0o600),
			symlink("alloc/data/etc", "/etc"),
			symlink("alloc/data/sec", "../../web/secrets"),
			symlink("web/local/up", "../.."),
		)
		var buf bytes.Buffer
		if err := b.Snapshot(&buf); err != nil {
			t.Fatalf("Snapshot: %v", err)
		}
		got := map[string]string{}
		for _, hdr := range tarEntries(t, buf.Bytes()) {
			got[hdr.Name] = hdr.Linkname
			if hdr.Typeflag != tar.TypeSymlink && hdr.Typeflag != tar.TypeDir {
				t.Errorf("entry %q: got type %q, want only the roots and the links", hdr.Name, hdr.Typeflag)
			}
		}
		for name, target := range map[string]string{"alloc/data/etc": "/etc", "alloc/data/sec": "../../web/secrets", "web/local/up": "../.."} {
			if got[name] != target {
				t.Errorf("link %s: got target %q, want %q", name, got[name], target)
			}
		}
		if len(got) != 5 {
			t.Errorf("entries: got %v, want the two roots and three links", got)
		}
	})

	// A FIFO in the data does not hang the snapshot.
	t.Run("FIFO", func(t *testing.T) {
		c := h.built(t, allocC, "web")
		apply(t, c.AllocDirPath(), file("alloc/data/f", "x", 0o644), fifo("alloc/data/pipe"))
		var err error
		if !within(hangTimeout, func() { err = c.Snapshot(io.Discard) }) {
			unblockFIFO(host(c, "alloc/data/pipe"))
			t.Fatalf("Snapshot with a FIFO still running after %v", hangTimeout)
		}
		t.Logf("Snapshot with a FIFO: %v", err)
	})
}

func hdrNames(hdrs []*tar.Header) []string {
	out := make([]string, 0, len(hdrs))
	for _, h := range hdrs {
		out = append(out, h.Name)
	}
	return out
}
