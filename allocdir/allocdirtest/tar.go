package allocdirtest

import (
	"archive/tar"
	"bytes"
	"testing"
	"time"
)

// TarEntry is one entry of a hand-made archive, for the tests that feed
// the snapshot extractor (here, package snapshot's and package migrate's)
// what no snapshot writer makes.
type TarEntry struct {
	Name string
	Type byte
	Body string
	// Link is a symbolic or hard link's target.
	Link string
	Mode int64
	// Major and Minor are a device's numbers.
	Major, Minor int64
	UID          int
}

// TarDir, TarFile, TarSymlink and TarHardLink are the common entries, with
// the modes a snapshot writer gives them.
func TarDir(name string) TarEntry { return TarEntry{Name: name, Type: tar.TypeDir, Mode: 0o755} }
func TarFile(name, body string) TarEntry {
	return TarEntry{Name: name, Type: tar.TypeReg, Body: body, Mode: 0o644}
}
func TarSymlink(name, target string) TarEntry {
	return TarEntry{Name: name, Type: tar.TypeSymlink, Link: target, Mode: 0o777}
}
func TarHardLink(name, target string) TarEntry {
	return TarEntry{Name: name, Type: tar.TypeLink, Link: target, Mode: 0o644}
}

// Tar writes entries as a tar archive, all with one modification time.
// Without trailer the stream stops at the last entry's boundary, as a
// connection cut there would.
func Tar(t testing.TB, trailer bool, entries ...TarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name:     e.Name,
			Typeflag: e.Type,
			Linkname: e.Link,
			Mode:     e.Mode,
			ModTime:  time.Unix(1_700_000_000, 0),
			Devmajor: e.Major,
			Devminor: e.Minor,
			Uid:      e.UID,
		}
		if e.Type == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatalf("tar header %q: %v", e.Name, err)
		}
		if hdr.Size > 0 {
			if _, err := tw.Write([]byte(e.Body)); err != nil {
				t.Fatalf("tar body %q: %v", e.Name, err)
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
