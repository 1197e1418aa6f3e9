package quota

import "testing"

// TestDetectOff checks that without enable nothing is turned on, whatever
// the filesystem can do, and that the report says what would enforce
// limits and names the filesystem as the mount table does.
func TestDetectOff(t *testing.T) {
	dir := t.TempDir()
	m, r, err := Detect(dir, false, func(op, path string) error {
		t.Errorf("Detect without enable took a step: %s %s", op, path)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if m != nil || r.Enforced() || r.Mechanism != "" {
		t.Errorf("Detect without enable: mechanism %v, report %+v; want none", m, r)
	}
	if r.Why == "" {
		t.Errorf("report %+v does not say what would enforce limits", r)
	}
	if want := FSType(dir); r.Filesystem != want && r.Filesystem != "btrfs" {
		t.Errorf("report names the filesystem %q, want %q", r.Filesystem, want)
	}
}
