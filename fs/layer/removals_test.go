package layer

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestRemovalsHideWhatWasRemoved(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	r, err := OpenRemovals(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"usr/lib/a", "usr/lib/b", "etc/x"} {
		if err := r.Remove(rel); err != nil {
			t.Fatal(err)
		}
	}
	for rel, want := range map[string]bool{"usr/lib/a": true, "usr/lib/a/below": true, "usr/lib/c": false, "usr/lib": false, "etc/x": true, "etc": false, "": false} {
		if got := r.Hides(rel); got != want {
			t.Errorf("Hides(%q) = %v, want %v", rel, got, want)
		}
	}
	if hidden := r.HiddenIn("usr/lib"); hidden == nil || !hidden("a") || !hidden("b") || hidden("c") {
		t.Error("HiddenIn(usr/lib) does not tell a and b, and only them")
	}
	if r.HiddenIn("usr") != nil || r.HiddenIn("var") != nil {
		t.Error("HiddenIn tells of removals in a directory none was recorded in")
	}
	listing := r.HiddenIn("usr/lib")
	changes := r.Changes("usr")
	// The directory's removal makes its children's records redundant.
	if err := r.Remove("usr/lib"); err != nil {
		t.Fatal(err)
	}
	if r.Changes("usr") == changes {
		t.Error("a removal in usr/ left its count of changes as it was")
	}
	if !listing("c") {
		t.Error("a listing of usr/lib begun before its removal shows its host names after it")
	}
	if r.HiddenIn("usr/lib") != nil {
		t.Error("HiddenIn(usr/lib) after its removal tells of records below it")
	}
	if !r.Hides("usr/lib/a") || !r.Hides("usr/lib/zzz") {
		t.Error("the removal of usr/lib does not hide what lay below it")
	}
	if err := r.Remove(""); err == nil {
		t.Error("a removal of the volume root was recorded")
	}
	must(t, r.Sync())
	must(t, r.Close())

	again, err := OpenRemovals(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"usr/lib", "usr/lib/a", "etc/x"} {
		if !again.Hides(rel) {
			t.Errorf("read back, %q is not hidden", rel)
		}
	}
	if again.Hides("etc") || again.Hides("usr") {
		t.Error("read back, a directory nobody removed is hidden")
	}
}

// TestRemovalsCrashAnywhere cuts the log at every byte, as a crash in the
// middle of an append or a power cut before its data reached the disk
// may, and checks that each cut reads back as the records that lie
// wholly before it, and that an append after it reads back too.
func TestRemovalsCrashAnywhere(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "full")
	r, err := OpenRemovals(full)
	if err != nil {
		t.Fatal(err)
	}
	rels := []string{"bin/sh", "etc/passwd", "usr/share/doc/x y", "usr/share/doc"}
	var ends []int
	for _, rel := range rels {
		must(t, r.Remove(rel))
		fi, err := os.Stat(full)
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, int(fi.Size()))
	}
	must(t, r.Close())
	data, err := os.ReadFile(full)
	if err != nil {
		t.Fatal(err)
	}
	for cut := 0; cut <= len(data); cut++ {
		for _, tail := range [][]byte{nil, {0, 0, 0, 0, 0, 0, 0, 0, 0}, []byte("garbage!!")} {
			p := filepath.Join(dir, "cut")
			must(t, os.WriteFile(p, append(append([]byte(nil), data[:cut]...), tail...), 0o600))
			got, err := OpenRemovals(p)
			if err != nil {
				t.Fatal(err)
			}
			for i, rel := range rels {
				whole := ends[i] <= cut
				// usr/share/doc hides what lies below it once whole.
				hidden := whole || (rel == "usr/share/doc/x y" && ends[3] <= cut)
				if got.Hides(rel) != hidden {
					t.Fatalf("cut at %d of %d (tail %q): Hides(%q) = %v, want %v", cut, len(data), tail, rel, !hidden, hidden)
				}
			}
			must(t, got.Remove("after/crash"))
			must(t, got.Close())
			back, err := OpenRemovals(p)
			if err != nil {
				t.Fatal(err)
			}
			if !back.Hides("after/crash") {
				t.Fatalf("cut at %d (tail %q): the append after the crash is lost", cut, tail)
			}
		}
	}
}

// TestRemovalsCompact removes a tree large enough for the log to be
// written anew, and checks that it holds what it held, and little more.
func TestRemovalsCompact(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	r, err := OpenRemovals(p)
	if err != nil {
		t.Fatal(err)
	}
	var written int64
	for d := 0; written < 3*compactMin; d++ {
		dir := filepath.Join("usr/share", "d"+strconv.Itoa(d))
		for f := range 100 {
			rel := filepath.Join(dir, "file-with-a-long-name-"+strconv.Itoa(f))
			must(t, r.Remove(rel))
			written += int64(recordHeader + len(rel))
		}
		must(t, r.Remove(dir))
		written += int64(recordHeader + len(dir))
	}
	must(t, r.Remove("etc/kept"))
	must(t, r.Close())
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > compactMin+64<<10 {
		t.Errorf("log of %d bytes after %d written: never written anew", fi.Size(), written)
	}
	back, err := OpenRemovals(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, rel := range []string{"usr/share/d0", "usr/share/d0/file-with-a-long-name-1", "usr/share/d7", "etc/kept"} {
		if !back.Hides(rel) {
			t.Errorf("after the log was written anew, %q is not hidden", rel)
		}
	}
	if back.Hides("usr/share") || back.Hides("etc") {
		t.Error("after the log was written anew, a directory nobody removed is hidden")
	}
	if _, err := os.Lstat(p + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the log written anew left its temporary file: %v", err)
	}
}
