package restart

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/transport"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestHeldSession: a session recorded by SaveSession is taken back with
// its mount point; a missing, unreadable, malformed or foreign record is
// refused with an error that names what is wrong, and the record is left
// as it was.
func TestHeldSession(t *testing.T) {
	good := SessionFile{
		Session:    transport.Session{Version: 1, Dir: "/srv/alloc", Kernel: fuse.InitIn{Major: 7, Minor: 45}, MaxWrite: 1 << 20, MaxPages: 256},
		Generation: 3,
	}
	dataDir := t.TempDir()
	if err := SaveSession(dataDir, good); err != nil {
		t.Fatal(err)
	}
	if dir, err := HeldSession(dataDir); err != nil || dir != "/srv/alloc" {
		t.Fatalf("HeldSession of a good record: %q, %v; want /srv/alloc", dir, err)
	}
	if f, err := LoadSession(dataDir); err != nil || f.Generation != 3 || f.Session.MaxPages != 256 {
		t.Errorf("LoadSession: %+v, %v; want generation 3 and the negotiated sizes", f, err)
	}

	if _, err := HeldSession(t.TempDir()); err == nil || !strings.Contains(err.Error(), "previous daemon recorded") {
		t.Errorf("HeldSession without a record: %v, want it to say none was recorded", err)
	}
	foreign := good
	foreign.Session.Version = 99
	malformed := good
	malformed.Session.Dir = "relative"
	old := good
	old.Session.Kernel.Minor = 20
	for _, c := range []struct {
		name   string
		record func(dataDir string) error
		want   string
	}{
		{"not JSON", func(d string) error {
			return os.WriteFile(StateFile(d, "session.json"), []byte("{\"session\": "), 0o600)
		}, "session.json"},
		{"another version", func(d string) error { return SaveSession(d, foreign) }, "version 99"},
		{"a relative mount point", func(d string) error { return SaveSession(d, malformed) }, "malformed"},
		{"an old kernel", func(d string) error { return SaveSession(d, old) }, "7.20"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.MkdirAll(filepath.Join(d, stateDir), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := c.record(d); err != nil {
				t.Fatal(err)
			}
			before, err := os.ReadFile(StateFile(d, "session.json"))
			if err != nil {
				t.Fatal(err)
			}
			if dir, err := HeldSession(d); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("HeldSession: %q, %v; want a refusal naming %q", dir, err, c.want)
			}
			after, err := os.ReadFile(StateFile(d, "session.json"))
			if err != nil || !bytes.Equal(before, after) {
				t.Errorf("the record changed: %q -> %q, %v", before, after, err)
			}
		})
	}
}

// TestRemoveState removes the whole fuse/ directory, and is content when
// there is none.
func TestRemoveState(t *testing.T) {
	d := t.TempDir()
	if err := WriteReplace(StateFile(d, "slots.json"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveState(d); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d, stateDir)); !os.IsNotExist(err) {
		t.Errorf("fuse/ after RemoveState: %v, want it gone", err)
	}
	if err := RemoveState(d); err != nil {
		t.Errorf("RemoveState without a fuse/ directory: %v", err)
	}
}

// TestProtocolOf: a serve takes a mount over from holders of the versions
// it knows, and from no other.
func TestProtocolOf(t *testing.T) {
	for v := 1; v <= Protocol; v++ {
		if got := ProtocolOf(Version(v)); got != v {
			t.Errorf("ProtocolOf(%q) = %d, want %d", Version(v), got, v)
		}
	}
	for _, answer := range []string{"", Version(Protocol + 1), Version(0), "allocfs-holder", "nginx 1.25"} {
		if got := ProtocolOf(answer); got != 0 {
			t.Errorf("ProtocolOf(%q) = %d, want 0 (refused)", answer, got)
		}
	}
}
