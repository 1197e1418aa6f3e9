package difftest

import (
	"fmt"
	"strings"
)

// Diff is one way two results, or two trees, differ.
type Diff struct {
	// Path is the entry of the tree that differs; empty for a result.
	Path string
	// Field is the class of what differs ("errno", "mode set-id/sticky
	// bits", "xattrs"...): what a divergence is classified by.
	Field string
	// Vol and Ref are what each side had, for the report.
	Vol, Ref string
}

func (d Diff) String() string {
	p := ""
	if d.Path != "" {
		p = d.Path + ": "
	}
	return fmt.Sprintf("%s%s: allocfs %s, reference %s", p, d.Field, d.Vol, d.Ref)
}

// CompareResults lists how the allocfs side's answer differs from the
// reference's.
func CompareResults(vol, ref Result) []Diff {
	var out []Diff
	if vol.Errno != ref.Errno {
		return []Diff{{Field: "errno", Vol: orOK(vol.Errno), Ref: orOK(ref.Errno)}}
	}
	if vol.N != ref.N {
		out = append(out, Diff{Field: "byte count", Vol: fmt.Sprint(vol.N), Ref: fmt.Sprint(ref.N)})
	}
	if vol.Data != ref.Data {
		out = append(out, Diff{Field: "data", Vol: short(vol.Data), Ref: short(ref.Data)})
	}
	if strings.Join(vol.Names, ",") != strings.Join(ref.Names, ",") {
		out = append(out, Diff{Field: "names", Vol: fmt.Sprint(vol.Names), Ref: fmt.Sprint(ref.Names)})
	}
	if vol.FstatErr != ref.FstatErr {
		out = append(out, Diff{Field: "fstat errno", Vol: orOK(vol.FstatErr), Ref: orOK(ref.FstatErr)})
	}
	switch {
	case vol.FstatErr != ref.FstatErr:
		// Reported above; the missing stat is the same difference.
	case (vol.Stat == nil) != (ref.Stat == nil):
		out = append(out, Diff{Field: "fstat missing", Vol: fmt.Sprint(vol.Stat != nil), Ref: fmt.Sprint(ref.Stat != nil)})
	case vol.Stat != nil:
		out = append(out, compareAttr("", vol.Stat, ref.Stat)...)
	}
	return out
}

func orOK(errno string) string {
	if errno == "" {
		return "OK"
	}
	return errno
}

func short(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%q...(%d bytes)", s[:40], len(s))
	}
	return fmt.Sprintf("%q", s)
}

func compareAttr(path string, vol, ref *Attr) []Diff {
	var out []Diff
	add := func(field string, v, r any) {
		out = append(out, Diff{Path: path, Field: field, Vol: fmt.Sprint(v), Ref: fmt.Sprint(r)})
	}
	if vol.Type != ref.Type {
		add("type", vol.Type, ref.Type)
		return out
	}
	if vol.Perm&0o7000 != ref.Perm&0o7000 {
		add("mode set-id/sticky bits", fmt.Sprintf("%#o", vol.Perm), fmt.Sprintf("%#o", ref.Perm))
	}
	if vol.Perm&0o777 != ref.Perm&0o777 {
		add("mode permission bits", fmt.Sprintf("%#o", vol.Perm), fmt.Sprintf("%#o", ref.Perm))
	}
	if vol.UID != ref.UID || vol.GID != ref.GID {
		add("owner", fmt.Sprintf("%d:%d", vol.UID, vol.GID), fmt.Sprintf("%d:%d", ref.UID, ref.GID))
	}
	if vol.Size != ref.Size {
		add("size", vol.Size, ref.Size)
	}
	if vol.Nlink != ref.Nlink {
		add("nlink", vol.Nlink, ref.Nlink)
	}
	if vol.Rdev != ref.Rdev {
		add("rdev", vol.Rdev, ref.Rdev)
	}
	if vol.Sparse != ref.Sparse {
		add("sparseness", vol.Sparse, ref.Sparse)
	}
	return out
}
