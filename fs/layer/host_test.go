package layer

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"testing"
)

// TestHostLayer: a host layer shows each entry's source at its place,
// the directories leading to it from its skeleton, nothing of the host
// around the entries, and nothing at all while it is off; a merged
// listing and a lookup through the stack agree with it.
func TestHostLayer(t *testing.T) {
	base := t.TempDir()
	host := filepath.Join(base, "host")
	for _, d := range []string{"usr/bin", "other"} {
		must(t, os.MkdirAll(filepath.Join(host, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(host, "usr/bin/ls"), []byte("ls"), 0o755))
	must(t, os.WriteFile(filepath.Join(host, "hosts"), []byte("hosts"), 0o644))
	entries, err := NewHostEntries(map[string]string{
		filepath.Join(host, "usr"):   "/usr",
		filepath.Join(host, "hosts"): "/etc/hosts",
		filepath.Join(host, "gone"):  "/gone",
	})
	must(t, err)
	if len(entries) != 2 {
		t.Fatalf("entries: %+v, want two (the missing source left out)", entries)
	}
	skel, empty, upper := filepath.Join(base, "skel"), filepath.Join(base, "empty"), filepath.Join(base, "upper")
	must(t, BuildSkeleton(skel, entries))
	must(t, os.Mkdir(empty, 0o755))
	must(t, os.Mkdir(upper, 0o755))
	on := false
	s := &Stack{Roots: []string{upper, skel}, Host: &HostLayer{Skeleton: skel, Empty: empty, Entries: entries, On: func() bool { return on }}}

	list := func(rel string) []string {
		t.Helper()
		layers := s.All()
		if rel != "" {
			var err error
			if layers, _, err = s.Visible(rel, s.All()); err != nil {
				t.Fatalf("Visible(%q): %v", rel, err)
			}
		}
		es, err := s.List(rel, layers)
		if err != nil {
			t.Fatalf("List(%q): %v", rel, err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Name)
		}
		sort.Strings(out)
		return out
	}
	if got := list(""); len(got) != 0 {
		t.Errorf("an off host layer lists %v, want nothing", got)
	}
	var st syscall.Stat_t
	if err := s.Lstat(1, "usr", &st); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("usr in an off host layer: %v, want ENOENT", err)
	}
	on = true
	if got := list(""); len(got) != 2 || got[0] != "etc" || got[1] != "usr" {
		t.Errorf("the host layer's root lists %v, want [etc usr]", got)
	}
	if got := list("usr/bin"); len(got) != 1 || got[0] != "ls" {
		t.Errorf("usr/bin lists %v, want [ls]", got)
	}
	layers, st, err := s.Visible("usr/bin/ls", s.All())
	if err != nil || layers[0] != 1 || st.Size != 2 {
		t.Errorf("Visible(usr/bin/ls): %v %+v %v", layers, st.Size, err)
	}
	fd, err := s.Open(1, "etc/hosts", os.O_RDONLY)
	must(t, err)
	b := make([]byte, 16)
	n, _ := syscall.Read(fd, b)
	syscall.Close(fd)
	if string(b[:n]) != "hosts" {
		t.Errorf("etc/hosts reads %q, want the host's file", b[:n])
	}
	for _, rel := range []string{"other", "usr/../other", "etc/hosts/x"} {
		if _, _, err := s.Visible(rel, s.All()); err == nil {
			t.Errorf("Visible(%q) found something: the host around the entries must not show", rel)
		}
	}
	// A copy-up takes the host's entry into the upper layer and leaves
	// the host as it was.
	must(t, s.CopyUp("usr", 1))
	must(t, s.CopyUp("usr/bin", 1))
	must(t, s.CopyUp("usr/bin/ls", 1))
	if b, err := os.ReadFile(filepath.Join(upper, "usr/bin/ls")); err != nil || string(b) != "ls" {
		t.Errorf("the copied-up file: %q, %v", b, err)
	}
	if _, err := os.Lstat(filepath.Join(host, "usr/bin/ls")); err != nil {
		t.Errorf("the host's file after the copy-up: %v", err)
	}
}
