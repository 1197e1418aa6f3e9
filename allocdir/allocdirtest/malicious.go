//go:build linux

package allocdirtest

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
)

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
		t.Errorf("snapshot.Extract: got %v, want an error wrapping ErrArchive", err)
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

// testMaliciousArchives feeds snapshot.Extract crafted archives, each a
// known attack or corruption, and checks that each is refused with
// ErrArchive and leaves nothing behind, inside or outside dest.
func testMaliciousArchives(t *testing.T, _ *harness) {
	big := strings.Repeat("z", 1024)
	passwd, passwdErr := os.ReadFile("/etc/passwd")

	for _, c := range []struct {
		name string
		// archive builds the stream; it may use the scene's paths.
		archive func(t *testing.T, s *archiveScene) []byte
		opts    snapshot.ExtractOptions
		// wantType: refused for its entry type (snapshot.ErrEntryType).
		wantType bool
	}{
		// CVE-2024-1329: a link to /etc is refused outright.
		{name: "CVE-2024-1329/LinkToEtc", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", "/etc"))
		}},
		// CVE-2024-1329: an absolute link out, then a file written through it.
		{name: "CVE-2024-1329/WriteThroughAbsoluteLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", s.victim), TarFile("alloc/data/l/pwned", "x"))
		}},
		// CVE-2022-24683 style: a relative link climbing out of dest.
		{name: "CVE-2022-24683/RelativeClimb", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", "../../../../victim"), TarFile("alloc/data/l/pwned", "x"))
		}},
		// CVE-2022-24683 style: a deep climb to the host root.
		{name: "CVE-2022-24683/DeepClimb", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", strings.Repeat("../", 20)+"etc/passwd"))
		}},
		// Links that each stay inside lexically but climb out when followed
		// one through the other: d/a is the root, so b = d/a/.. is dest's
		// parent.
		{name: "CVE-2022-24683/ChainedClimb", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarDir("alloc/data/d"),
				TarSymlink("alloc/data/d/a", "../../.."), TarSymlink("alloc/data/b", "d/a/.."))
		}},
		// PR-23738: a file written through a link to "." (a parent that is
		// a link, even one that stays inside).
		{name: "PR-23738/WriteThroughDotLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", "."), TarFile("alloc/data/l/f", "x"))
		}},
		// PR-23738: a file written through a link that climbs out.
		{name: "PR-23738/WriteThroughClimbLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", "../../.."), TarFile("alloc/data/l/x", "x"))
		}},
		// PR-23738: a file entry over an earlier link of the same name.
		{name: "PR-23738/FileOverLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/f", "../../../../victim/sentinel"), TarFile("alloc/data/f", "overwritten"))
		}},
		// The same file twice.
		{name: "DuplicateFile", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/f", "one"), TarFile("alloc/data/f", "two"))
		}},
		// A file, then a directory of the same name.
		{name: "DuplicateFileThenDir", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/f", "one"), TarDir("alloc/data/f"))
		}},
		// An absolute entry name.
		{name: "AbsoluteName", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile(filepath.Join(s.victim, "pwned"), "x"))
		}},
		// An absolute name that looks like the layout.
		{name: "AbsoluteLayoutName", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("/alloc/data"), TarFile("/alloc/data/f", "x"))
		}},
		// A name climbing out with "..".
		{name: "DotDotName", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/../../../victim/pwned", "x"))
		}},
		// A ".." that would clean away inside is refused all the same.
		{name: "DotDotInsideName", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarDir("alloc/data/d"), TarFile("alloc/data/d/../f", "x"))
		}},
		// A hard link to /etc/passwd.
		{name: "HardLinkToEtcPasswd", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarHardLink("alloc/data/p", "/etc/passwd"))
		}},
		// A hard link climbing out to the victim.
		{name: "HardLinkOutside", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarHardLink("alloc/data/p", "../../victim/sentinel"))
		}},
		// A hard link through an archive link that points out.
		{name: "HardLinkThroughLink", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarSymlink("alloc/data/l", s.victim), TarHardLink("alloc/data/p", "alloc/data/l/sentinel"))
		}},
		// A hard link to a file of the archive itself: no snapshot writer
		// makes one (each name is a full file), so it is refused too.
		{name: "HardLinkInside", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/f", "x"), TarHardLink("alloc/data/g", "alloc/data/f"))
		}},
		// A FIFO.
		{name: "FIFO", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarEntry{Name: "alloc/data/fifo", Type: tar.TypeFifo, Mode: 0o644})
		}},
		// A 16 GiB file of zeros from 2 KiB on the wire, old GNU form.
		{name: "SparseGNU", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return SparseGNUArchive("alloc/data/big", 16<<30)
		}},
		// The same in the PAX forms, which archive/tar reports as a
		// regular file.
		{name: "SparsePAX1.0", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return SparsePAXArchive("alloc/data/big", 16<<30, 0)
		}},
		{name: "SparsePAX0.1", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return SparsePAXArchive("alloc/data/big", 16<<30, 1)
		}},
		// A character device (/dev/null's numbers).
		{name: "CharDevice", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarEntry{Name: "alloc/data/null", Type: tar.TypeChar, Mode: 0o666, Major: 1, Minor: 3})
		}},
		// A block device.
		{name: "BlockDevice", wantType: true, archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarEntry{Name: "alloc/data/disk", Type: tar.TypeBlock, Mode: 0o660, Major: 1, Minor: 3})
		}},
		// More file bytes than MaxBytes allows.
		{name: "Oversize", opts: snapshot.ExtractOptions{MaxBytes: 100}, archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/big", big))
		}},
		// More entries than MaxEntries allows.
		{name: "TooManyEntries", opts: snapshot.ExtractOptions{MaxEntries: 3}, archive: func(t *testing.T, s *archiveScene) []byte {
			entries := []TarEntry{TarDir("alloc/data")}
			for _, n := range []string{"a", "b", "c", "d", "e", "f"} {
				entries = append(entries, TarFile("alloc/data/"+n, n))
			}
			return Tar(t, true, entries...)
		}},
		// The sender's in-band error entry, after good entries.
		{name: "SenderErrorEntry", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/f", "x"),
				TarFile("NOMAD-"+allocA+"-ERROR.log", "Error snapshotting: disk on fire"))
		}},
		// A stream cut at an entry boundary: no end-of-archive trailer.
		{name: "TruncatedAtBoundary", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, false, TarDir("alloc/data"), TarFile("alloc/data/f", "x"), TarFile("alloc/data/g", big))
		}},
		// A stream cut in the middle of a file's body.
		{name: "TruncatedMidFile", archive: func(t *testing.T, s *archiveScene) []byte {
			b := Tar(t, false, TarDir("alloc/data"), TarFile("alloc/data/g", big))
			return b[:len(b)-300]
		}},
		// A stream cut in the middle of a header.
		{name: "TruncatedMidHeader", archive: func(t *testing.T, s *archiveScene) []byte {
			b := Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/f", "x"))
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
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/logs/x", "x"))
		}},
		{name: "Layout/AllocTmp", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("alloc/tmp/x", "x"))
		}},
		{name: "Layout/TaskSecrets", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarDir("web/local"), TarFile("web/secrets/x", "x"))
		}},
		{name: "Layout/TaskPrivate", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("web/private/x", "x"))
		}},
		{name: "Layout/TaskTopLevelFile", archive: func(t *testing.T, s *archiveScene) []byte {
			return Tar(t, true, TarDir("alloc/data"), TarFile("web/executor.out", "x"))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newArchiveScene(t)
			_, err := snapshot.Extract(bytes.NewReader(c.archive(t, s)), s.dest, c.opts)
			s.check(t, err)
			if c.wantType && !errors.Is(err, snapshot.ErrEntryType) {
				t.Errorf("snapshot.Extract: got %v, want an error wrapping ErrEntryType", err)
			}
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
		b := Tar(t, true, TarDir("alloc/data"), TarFile("alloc/data/f", "x"), TarSymlink("alloc/data/l", "f"),
			TarDir("web/local"), TarFile("web/local/g", "y"))
		if _, err := snapshot.Extract(bytes.NewReader(b), s.dest, snapshot.ExtractOptions{}); err != nil {
			t.Fatalf("snapshot.Extract of a benign archive: %v", err)
		}
		if got, err := os.ReadFile(filepath.Join(s.dest, "alloc/data/l")); err != nil || string(got) != "x" {
			t.Errorf("alloc/data/l: got (%q, %v), want %q", got, err, "x")
		}
	})
}

// blockSize is tar's record unit.
const blockSize = 512

// rawHeader is one hand-built tar header block. The tar writer refuses
// to write sparse files, so the sparse archives are assembled from these.
type rawHeader [blockSize]byte

func (h *rawHeader) str(off, size int, s string) {
	if len(s) > size {
		panic(fmt.Sprintf("tar field at %d: %q longer than %d bytes", off, s, size))
	}
	copy(h[off:off+size], s)
}

// num writes n in base-256 (GNU), which holds any size.
func (h *rawHeader) num(off, size int, n int64) {
	f := h[off : off+size]
	clear(f)
	for i := size - 1; i > 0 && n > 0; i-- {
		f[i] = byte(n)
		n >>= 8
	}
	f[0] = 0x80
}

func (h *rawHeader) octal(off, size int, n int64) {
	h.str(off, size, fmt.Sprintf("%0*o", size-1, n))
}

// seal writes the checksum, computed with the checksum field as spaces.
func (h *rawHeader) seal() {
	copy(h[148:156], "        ")
	var sum int64
	for _, b := range h {
		sum += int64(b)
	}
	h.str(148, 8, fmt.Sprintf("%06o\x00 ", sum))
}

// newRawHeader starts a header of type typ for name, mode 0644, whose
// body on the wire is size bytes. gnu selects the old GNU magic (needed
// by TypeGNUSparse), else POSIX ustar.
func newRawHeader(name string, typ byte, size int64, gnu bool) *rawHeader {
	h := new(rawHeader)
	h.str(0, 100, name)
	h.octal(100, 8, 0o644)
	h.octal(108, 8, 0)
	h.octal(116, 8, 0)
	h.octal(124, 12, size)
	h.octal(136, 12, 1700000000)
	h[156] = typ
	if gnu {
		h.str(257, 8, "ustar  \x00")
	} else {
		h.str(257, 8, "ustar\x0000")
	}
	return h
}

// padded returns b followed by zeros up to a whole number of blocks.
func padded(b []byte) []byte {
	if r := len(b) % blockSize; r != 0 {
		b = append(b, make([]byte, blockSize-r)...)
	}
	return b
}

// trailer is tar's end-of-archive marker.
func trailer() []byte { return make([]byte, 2*blockSize) }

// SparseGNUArchive returns a complete archive holding one file, name, in
// the old GNU sparse form (type 'S'): one byte of data on the wire, which
// a reader that honours the sparse map expands to realSize bytes, all but
// the last of them zeros. The archive is 2 KiB whatever realSize is.
func SparseGNUArchive(name string, realSize int64) []byte {
	h := newRawHeader(name, tar.TypeGNUSparse, 1, true)
	// The sparse map: one region of one byte, at the very end.
	h.num(386, 12, realSize-1)
	h.num(398, 12, 1)
	h[482] = 0 // no extension blocks
	h.num(483, 12, realSize)
	h.seal()
	out := append([]byte(nil), h[:]...)
	out = append(out, padded([]byte("x"))...)
	return append(out, trailer()...)
}

// SparsePAXArchive returns a complete archive holding one file, name, in
// the PAX sparse form archive/tar reports as a regular file: format 1.0
// (minor 0: the map leads the body) or 0.1 (minor 1: the map is a
// record). As with SparseGNUArchive, one byte on the wire becomes
// realSize bytes.
func SparsePAXArchive(name string, realSize int64, minor int) []byte {
	recs := []string{
		"GNU.sparse.name=" + name,
		"GNU.sparse.realsize=" + strconv.FormatInt(realSize, 10),
	}
	var body []byte
	switch minor {
	case 0:
		recs = append(recs, "GNU.sparse.major=1", "GNU.sparse.minor=0")
		body = padded([]byte(fmt.Sprintf("1\n%d\n1\n", realSize-1)))
	case 1:
		recs = append(recs, "GNU.sparse.major=0", "GNU.sparse.minor=1",
			"GNU.sparse.numblocks=1", fmt.Sprintf("GNU.sparse.map=%d,1", realSize-1))
	default:
		panic(fmt.Sprintf("PAX sparse format minor %d: want 0 (1.0) or 1 (0.1)", minor))
	}
	body = append(body, 'x')
	var pax []byte
	for _, r := range recs {
		pax = append(pax, paxRecord(r)...)
	}
	ph := newRawHeader("PaxHeaders/"+path.Base(name), tar.TypeXHeader, int64(len(pax)), false)
	ph.seal()
	fh := newRawHeader(path.Join(path.Dir(name), "GNUSparseFile.0", path.Base(name)), tar.TypeReg, int64(len(body)), false)
	fh.seal()
	out := append([]byte(nil), ph[:]...)
	out = append(out, padded(pax)...)
	out = append(out, fh[:]...)
	out = append(out, padded(body)...)
	return append(out, trailer()...)
}

// paxRecord formats "key=value" as a PAX record: its length, in decimal,
// counts itself.
func paxRecord(kv string) string {
	n := len(kv) + 3 // space, newline, one digit
	for {
		r := fmt.Sprintf("%d %s\n", n, kv)
		if len(r) == n {
			return r
		}
		n = len(r)
	}
}
