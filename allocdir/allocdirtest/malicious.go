package allocdirtest

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// tarEntry is one entry of a hand-made archive.
type tarEntry struct {
	name     string
	typ      byte
	body     string
	linkname string
	mode     int64
}

func tDir(name string) tarEntry { return tarEntry{name: name, typ: tar.TypeDir, mode: 0o755} }
func tFile(name, body string) tarEntry {
	return tarEntry{name: name, typ: tar.TypeReg, body: body, mode: 0o644}
}
func tSymlink(name, target string) tarEntry {
	return tarEntry{name: name, typ: tar.TypeSymlink, linkname: target, mode: 0o777}
}
func tHardLink(name, target string) tarEntry {
	return tarEntry{name: name, typ: tar.TypeLink, linkname: target, mode: 0o644}
}

// makeTar writes entries as a tar archive; without trailer the stream
// stops at the last entry's boundary, as a cut connection would.
func makeTar(t *testing.T, trailer bool, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name:     e.name,
			Typeflag: e.typ,
			Linkname: e.linkname,
			Mode:     e.mode,
			Size:     int64(len(e.body)),
			ModTime:  time.Unix(1700000000, 0),
		}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if e.typ == tar.TypeChar || e.typ == tar.TypeBlock {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatalf("tar body %q: %v", e.name, err)
			}
		}
	}
	var err error
	if trailer {
		err = tw.Close()
	} else {
		err = tw.Flush()
	}
	if err != nil {
		t.Fatalf("tar: %v", err)
	}
	return buf.Bytes()
}

// archiveScene is the ground a malicious archive is extracted on:
//
//	base/victim/sentinel   a file the archive tries to reach
//	base/work/             dest's parent, empty before and after
//	base/work/out          dest, which must never appear
type archiveScene struct {
	base, victim, work, dest string
}

const sentinelContent = "do not touch"

func newArchiveScene(t *testing.T) *archiveScene {
	t.Helper()
	base := t.TempDir()
	s := &archiveScene{
		base:   base,
		victim: filepath.Join(base, "victim"),
		work:   filepath.Join(base, "work"),
		dest:   filepath.Join(base, "work", "out"),
	}
	apply(t, base, file("victim/sentinel", sentinelContent, 0o644), dir("work", 0o755))
	return s
}

// check asserts that the extraction was refused as a bad archive and left
// no trace: no dest, nothing in dest's parent, the victim untouched.
func (s *archiveScene) check(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, allocdir.ErrArchive) {
		t.Errorf("ExtractSnapshot: got %v, want an error wrapping ErrArchive", err)
	}
	if _, err := os.Lstat(s.dest); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("dest after a refused archive: got %v, want it missing", err)
	}
	if entries, err := os.ReadDir(s.work); err != nil || len(entries) != 0 {
		var left []string
		for _, e := range entries {
			left = append(left, e.Name())
		}
		t.Errorf("dest's parent after a refused archive: got %v (%v), want it empty", left, err)
	}
	if got := tree(t, s.victim); len(got) != 2 {
		t.Errorf("victim dir: got %v, want only the sentinel", got)
	}
	p := filepath.Join(s.victim, "sentinel")
	if b, err := os.ReadFile(p); err != nil || string(b) != sentinelContent {
		t.Errorf("sentinel: got (%q, %v), want %q", b, err, sentinelContent)
	}
	if fi, err := os.Lstat(p); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink != 1 {
			t.Errorf("sentinel link count: got %d, want 1 (hard-linked from the archive)", st.Nlink)
		}
		if fi.Mode() != 0o644 {
			t.Errorf("sentinel mode: got %v, want -rw-r--r--", fi.Mode())
		}
	}
}

// testMaliciousArchives feeds ExtractSnapshot crafted archives, each a
// known attack or corruption, and checks that each is refused with
// ErrArchive and leaves nothing behind, inside or outside dest.
func testMaliciousArchives(t *testing.T, _ *harness) {
	big := strings.Repeat("z", 1024)
	passwd, passwdErr := os.ReadFile("/etc/passwd")

	for _, c := range []struct {
		name string
		// archive builds the stream; it may use the scene's paths.
		archive func(t *testing.T, s *archiveScene) []byte
		opts    allocdir.ExtractOptions
	}{
		// CVE-2024-1329: a link to /etc is refused outright.
		{name: "CVE-2024-1329/LinkToEtc", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", "/etc"))
		}},
		// CVE-2024-1329: an absolute link out, then a file written through it.
		{name: "CVE-2024-1329/WriteThroughAbsoluteLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", s.victim), tFile("alloc/data/l/pwned", "x"))
		}},
		// CVE-2022-24683 style: a relative link climbing out of dest.
		{name: "CVE-2022-24683/RelativeClimb", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", "../../../../victim"), tFile("alloc/data/l/pwned", "x"))
		}},
		// CVE-2022-24683 style: a deep climb to the host root.
		{name: "CVE-2022-24683/DeepClimb", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", strings.Repeat("../", 20)+"etc/passwd"))
		}},
		// Links that each stay inside lexically but climb out when followed
		// one through the other: d/a is the root, so b = d/a/.. is dest's
		// parent.
		{name: "CVE-2022-24683/ChainedClimb", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tDir("alloc/data/d"),
				tSymlink("alloc/data/d/a", "../../.."), tSymlink("alloc/data/b", "d/a/.."))
		}},
		// PR-23738: a file written through a link to "." (a parent that is
		// a link, even one that stays inside).
		{name: "PR-23738/WriteThroughDotLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", "."), tFile("alloc/data/l/f", "x"))
		}},
		// PR-23738: a file written through a link that climbs out.
		{name: "PR-23738/WriteThroughClimbLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", "../../.."), tFile("alloc/data/l/x", "x"))
		}},
		// PR-23738: a file entry over an earlier link of the same name.
		{name: "PR-23738/FileOverLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/f", "../../../../victim/sentinel"), tFile("alloc/data/f", "overwritten"))
		}},
		// The same file twice.
		{name: "DuplicateFile", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/f", "one"), tFile("alloc/data/f", "two"))
		}},
		// A file, then a directory of the same name.
		{name: "DuplicateFileThenDir", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/f", "one"), tDir("alloc/data/f"))
		}},
		// An absolute entry name.
		{name: "AbsoluteName", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile(filepath.Join(s.victim, "pwned"), "x"))
		}},
		// An absolute name that looks like the layout.
		{name: "AbsoluteLayoutName", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("/alloc/data"), tFile("/alloc/data/f", "x"))
		}},
		// A name climbing out with "..".
		{name: "DotDotName", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/../../../victim/pwned", "x"))
		}},
		// A ".." that would clean away inside is refused all the same.
		{name: "DotDotInsideName", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tDir("alloc/data/d"), tFile("alloc/data/d/../f", "x"))
		}},
		// A hard link to /etc/passwd.
		{name: "HardLinkToEtcPasswd", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tHardLink("alloc/data/p", "/etc/passwd"))
		}},
		// A hard link climbing out to the victim.
		{name: "HardLinkOutside", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tHardLink("alloc/data/p", "../../victim/sentinel"))
		}},
		// A hard link through an archive link that points out.
		{name: "HardLinkThroughLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tSymlink("alloc/data/l", s.victim), tHardLink("alloc/data/p", "alloc/data/l/sentinel"))
		}},
		// A character device (/dev/null's numbers).
		{name: "CharDevice", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tarEntry{name: "alloc/data/null", typ: tar.TypeChar, mode: 0o666})
		}},
		// A block device.
		{name: "BlockDevice", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tarEntry{name: "alloc/data/disk", typ: tar.TypeBlock, mode: 0o660})
		}},
		// More file bytes than MaxBytes allows.
		{name: "Oversize", opts: allocdir.ExtractOptions{MaxBytes: 100}, archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/big", big))
		}},
		// More entries than MaxEntries allows.
		{name: "TooManyEntries", opts: allocdir.ExtractOptions{MaxEntries: 3}, archive: func(t *testing.T, s *archiveScene) []byte {
			entries := []tarEntry{tDir("alloc/data")}
			for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
				entries = append(entries, tFile("alloc/data/"+n, n))
			}
			return makeTar(t, true, entries...)
		}},
		// The sender's in-band error entry, after good entries.
		{name: "SenderErrorEntry", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/f", "x"),
				tFile("NOMAD-"+allocA+"-ERROR.log", "Error snapshotting: disk on fire"))
		}},
		// A stream cut at an entry boundary: no end-of-archive trailer.
		{name: "TruncatedAtBoundary", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, false, tDir("alloc/data"), tFile("alloc/data/f", "x"), tFile("alloc/data/g", big))
		}},
		// A stream cut in the middle of a file's body.
		{name: "TruncatedMidFile", archive: func(t *testing.T, s *archiveScene) []byte {
			b := makeTar(t, false, tDir("alloc/data"), tFile("alloc/data/g", big))
			return b[:len(b)-300]
		}},
		// A stream cut in the middle of a header.
		{name: "TruncatedMidHeader", archive: func(t *testing.T, s *archiveScene) []byte {
			b := makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/f", "x"))
			return b[:512+100]
		}},
		// Nothing at all.
		{name: "EmptyStream", archive: func(t *testing.T, s *archiveScene) []byte {
			return nil
		}},
		// Bytes that are not a tar.
		{name: "Garbage", archive: func(t *testing.T, s *archiveScene) []byte {
			return bytes.Repeat([]byte("not a tar archive "), 100)
		}},
		// Entries outside Nomad's snapshot layout.
		{name: "Layout/AllocLogs", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/logs/x", "x"))
		}},
		{name: "Layout/AllocTmp", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("alloc/tmp/x", "x"))
		}},
		{name: "Layout/TaskSecrets", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tDir("web/local"), tFile("web/secrets/x", "x"))
		}},
		{name: "Layout/TaskPrivate", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("web/private/x", "x"))
		}},
		{name: "Layout/TaskTopLevelFile", archive: func(t *testing.T, s *archiveScene) []byte {
			return makeTar(t, true, tDir("alloc/data"), tFile("web/executor.out", "x"))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newArchiveScene(t)
			_, err := allocdir.ExtractSnapshot(bytes.NewReader(c.archive(t, s)), s.dest, c.opts)
			s.check(t, err)
			if passwdErr == nil {
				if b, err := os.ReadFile("/etc/passwd"); err != nil || !bytes.Equal(b, passwd) {
					t.Errorf("/etc/passwd changed: got (%d bytes, %v), want it as it was", len(b), err)
				}
			}
		})
	}

	// The control: a well-formed archive in the same scene is accepted, so
	// the refusals above are about the attack, not the scene.
	t.Run("Control", func(t *testing.T) {
		s := newArchiveScene(t)
		b := makeTar(t, true, tDir("alloc/data"), tFile("alloc/data/f", "x"), tSymlink("alloc/data/l", "f"),
			tDir("web/local"), tFile("web/local/g", "y"))
		if _, err := allocdir.ExtractSnapshot(bytes.NewReader(b), s.dest, allocdir.ExtractOptions{}); err != nil {
			t.Fatalf("ExtractSnapshot of a benign archive: %v", err)
		}
		if got, err := os.ReadFile(filepath.Join(s.dest, "alloc/data/l")); err != nil || string(got) != "x" {
			t.Errorf("alloc/data/l: got (%q, %v), want %q", got, err, "x")
		}
	})
}
