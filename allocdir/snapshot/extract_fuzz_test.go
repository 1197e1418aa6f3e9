//go:build linux

package snapshot

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"
)

// FuzzExtract feeds Extract arbitrary archives, as a peer node may send
// them: it never panics, nothing is made beside the destination (an
// archive it refuses leaves nothing at all), and it never writes more
// than its limits allow.
func FuzzExtract(f *testing.F) {
	var good bytes.Buffer
	tree := fstest.MapFS{
		"alloc/data/f":     {Data: []byte("data"), Mode: 0o644, ModTime: time.Unix(1e9, 0)},
		"alloc/logs/x.log": {Data: []byte("log\n"), Mode: 0o600},
		"web/local/link":   {Data: []byte("../local/f"), Mode: os.ModeSymlink | 0o777},
		"web/local/f":      {Data: []byte("local"), Mode: 0o640},
	}
	if err := Write(&good, "a1", tree, []string{"alloc", "web"}); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	f.Add(good.Bytes()[:good.Len()/2])
	for _, hdr := range []*tar.Header{
		{Name: "alloc/data/../../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		{Name: "web/local/abs", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd", Mode: 0o777},
		{Name: "alloc/data/hard", Typeflag: tar.TypeLink, Linkname: "alloc/data/f"},
		{Name: "alloc/data/dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		{Name: "alloc/data/suid", Typeflag: tar.TypeReg, Size: 1, Mode: 0o4755},
	} {
		var b bytes.Buffer
		w := tar.NewWriter(&b)
		if err := w.WriteHeader(hdr); err != nil {
			f.Fatal(err)
		}
		if hdr.Size > 0 {
			w.Write([]byte("x"))
		}
		w.Close()
		f.Add(b.Bytes())
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, archive []byte) {
		parent := t.TempDir()
		dest := filepath.Join(parent, "dest")
		const maxBytes = 1 << 20
		_, err := Extract(bytes.NewReader(archive), dest, ExtractOptions{MaxBytes: maxBytes, MaxEntries: 1000})
		names, rerr := os.ReadDir(parent)
		if rerr != nil {
			t.Fatal(rerr)
		}
		switch {
		case err != nil && len(names) != 0:
			t.Fatalf("a refused archive (%v) left %d entries beside the destination, the first %q", err, len(names), names[0].Name())
		case err == nil && (len(names) != 1 || names[0].Name() != "dest"):
			t.Fatalf("an accepted archive made %v beside nothing but dest", names)
		}
		if err != nil {
			return
		}
		var total int64
		filepath.Walk(dest, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.Mode().IsRegular() {
				total += info.Size()
				if info.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
					t.Errorf("%s was extracted with a set-id bit (%v)", p, info.Mode())
				}
			}
			return nil
		})
		if total > maxBytes {
			t.Fatalf("extracted %d bytes of files, over the %d limit", total, maxBytes)
		}
	})
}
