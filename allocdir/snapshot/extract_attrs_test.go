//go:build linux

package snapshot_test

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir/snapshot"
	"golang.org/x/sys/unix"
)

// extractAttrsArchive holds regular files whose modes a umask would
// change (group and other bits, the sticky bit, no bits at all), with
// owner 0:0 and one foreign owner.
func extractAttrsArchive(t *testing.T) ([]byte, map[string]os.FileMode) {
	t.Helper()
	mt := time.Date(2022, 1, 2, 3, 4, 5, 0, time.UTC)
	want := map[string]os.FileMode{
		"alloc/data/rw":       0o666,
		"alloc/data/exec":     0o775,
		"alloc/data/private":  0o600,
		"alloc/data/ro":       0o444,
		"alloc/data/none":     0,
		"alloc/data/sticky":   0o755 | os.ModeSticky,
		"alloc/data/d/nested": 0o640,
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, mode := range want {
		m := int64(mode.Perm())
		if mode&os.ModeSticky != 0 {
			m |= 0o1000
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: m, Size: int64(len(name)), ModTime: mt}
		if name == "alloc/data/d/nested" {
			hdr.Uid, hdr.Gid = 1234, 5678
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), want
}

// extractAttrsCheck compares what was extracted into dest with want:
// mode, content and mtime of every file.
func extractAttrsCheck(t *testing.T, dest string, want map[string]os.FileMode) {
	t.Helper()
	mt := time.Date(2022, 1, 2, 3, 4, 5, 0, time.UTC)
	for name, mode := range want {
		p := filepath.Join(dest, name)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if fi.Mode() != mode {
			t.Errorf("%s: got mode %v, want %v", name, fi.Mode(), mode)
		}
		if !fi.ModTime().Equal(mt) {
			t.Errorf("%s: got mtime %v, want %v", name, fi.ModTime(), mt)
		}
		if body, err := os.ReadFile(p); err != nil && mode.Perm()&0o400 != 0 {
			t.Errorf("%s: %v", name, err)
		} else if err == nil && string(body) != name {
			t.Errorf("%s: got content %q, want %q", name, body, name)
		}
	}
}

// TestExtractModesWhateverTheUmask: files are created with their final
// mode where the umask lets them; every mode comes out exact under a
// umask that strips nothing, one that strips the usual bits and one that
// strips everything. Not parallel: the umask belongs to the process.
func TestExtractModesWhateverTheUmask(t *testing.T) {
	archive, want := extractAttrsArchive(t)
	for _, mask := range []int{0, 0o022, 0o077, 0o777} {
		old := syscall.Umask(mask)
		dest := filepath.Join(t.TempDir(), "dest")
		snapMakeRemovable(t, dest)
		_, err := snapshot.Extract(bytes.NewReader(archive), dest, snapshot.ExtractOptions{})
		syscall.Umask(old)
		if err != nil {
			t.Fatalf("umask %#o: Extract: got error %v, want nil", mask, err)
		}
		t.Run(fmt.Sprintf("umask%04o", mask), func(t *testing.T) { extractAttrsCheck(t, dest, want) })
	}
}

// TestExtractOwnersUnderSetgidParent: the extractor skips a chown that
// would change nothing, but a staging directory that is setgid to
// another group gives new files that group, so files owned by the
// caller in the archive must still be chown-ed back to the caller.
func TestExtractOwnersUnderSetgidParent(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	archive, want := extractAttrsArchive(t)
	parent := filepath.Join(t.TempDir(), "staging")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(parent, 0, 4321); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o755|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	for _, chown := range []bool{true, false} {
		dest := filepath.Join(parent, fmt.Sprintf("dest-%v", chown))
		if _, err := snapshot.Extract(bytes.NewReader(archive), dest, snapshot.ExtractOptions{Chown: chown}); err != nil {
			t.Fatalf("Chown=%v: Extract: got error %v, want nil", chown, err)
		}
		extractAttrsCheck(t, dest, want)
		for name := range want {
			fi, err := os.Lstat(filepath.Join(dest, name))
			if err != nil {
				t.Fatal(err)
			}
			st := fi.Sys().(*syscall.Stat_t)
			wantUID, wantGID := uint32(0), uint32(0)
			switch {
			case !chown:
				// Not restored: what the setgid directory gives.
				wantGID = 4321
			case name == "alloc/data/d/nested":
				wantUID, wantGID = 1234, 5678
			}
			if st.Uid != wantUID || st.Gid != wantGID {
				t.Errorf("Chown=%v: %s: got owner %d:%d, want %d:%d", chown, name, st.Uid, st.Gid, wantUID, wantGID)
			}
		}
	}
}

// posixACL encodes a POSIX ACL xattr (version 2) of (tag, perm) entries
// with no qualifier.
func posixACL(entries ...[2]uint16) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint32(2))
	for _, e := range entries {
		binary.Write(&b, binary.LittleEndian, e[0])
		binary.Write(&b, binary.LittleEndian, e[1])
		binary.Write(&b, binary.LittleEndian, uint32(0xffffffff))
	}
	return b.Bytes()
}

// TestExtractModesUnderADefaultACL: the destination's parent has a default
// ACL (u::rwx,g::r-x,o::---), which the staging directory inherits and
// which, not the umask, trims the mode of a new file: every file must
// still come out with its header's mode.
func TestExtractModesUnderADefaultACL(t *testing.T) {
	t.Parallel()
	parent := filepath.Join(t.TempDir(), "acl")
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	const userObj, groupObj, other = 0x01, 0x04, 0x20
	if err := unix.Setxattr(parent, "system.posix_acl_default", posixACL([2]uint16{userObj, 7}, [2]uint16{groupObj, 5}, [2]uint16{other, 0}), 0); err != nil {
		t.Skipf("the filesystem takes no ACLs: %v", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	want := map[string]os.FileMode{"alloc/data/f644": 0o644, "alloc/data/f755": 0o755, "alloc/data/f600": 0o600}
	for name, mode := range want {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(mode), Size: 1, ModTime: time.Unix(1e9, 0)}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte("x"))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(parent, "dest")
	if _, err := snapshot.Extract(&buf, dest, snapshot.ExtractOptions{}); err != nil {
		t.Fatalf("Extract: %v", err)
	}
	for name, mode := range want {
		fi, err := os.Lstat(filepath.Join(dest, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != mode {
			t.Errorf("%s: got mode %v, want %v", name, fi.Mode(), mode)
		}
	}
}
