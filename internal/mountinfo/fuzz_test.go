package mountinfo

import (
	"strings"
	"testing"
)

// escape escapes a path as the kernel does in mountinfo (seq_path with
// " \t\n\\"): those four bytes as three-digit octal, every other byte as
// it is.
func escape(p string) string {
	var b strings.Builder
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case ' ', '\t', '\n', '\\':
			b.WriteString(`\` + string(rune('0'+c>>6)) + string(rune('0'+c>>3&7)) + string(rune('0'+c&7)))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// FuzzParse feeds the parser arbitrary mount tables: it never panics, it
// returns at most one entry per line, and the root, mount point, mount
// options and source of every entry it returns, written back as the
// kernel writes them, parse back to themselves.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue\n",
		"22 1 0:21 / /var/lib/allocfs/mnt rw,nosuid,nodev shared:1 - fuse.allocfs allocfs rw,user_id=0,group_id=0,allow_other\n",
		"40 22 0:33 /sub /with\\040space\\011tab\\134slash rw - overlay none rw\n",
		"41 22 0:34 / /no/optional rw - tmpfs tmpfs rw\n",
		"1 2 3 4 5 6 -\n",
		"1 2 3 4 5 6 - t\n",
		"42 22 0:35 / /odd\rname\vhere\u0085 rw - tmpfs tmpfs rw\n",
		"x\n",
		"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, table string) {
		entries, err := Parse(strings.NewReader(table))
		if err != nil {
			return
		}
		if lines := strings.Count(table, "\n") + 1; len(entries) > lines {
			t.Fatalf("%d entries from %d lines", len(entries), lines)
		}
		for _, e := range entries {
			if e.Root == "" || e.MountPoint == "" || e.Source == "" || e.Options == "" {
				// An empty field cannot be written back as one field.
				continue
			}
			line := "1 2 " + e.Device + " " + escape(e.Root) + " " + escape(e.MountPoint) + " " + e.Options + " - " + e.FSType + " " + escape(e.Source) + " rw\n"
			got, err := Parse(strings.NewReader(line))
			if err != nil || len(got) != 1 || got[0] != e {
				t.Fatalf("entry %+v written as %q parses to %+v, %v", e, line, got, err)
			}
		}
	})
}

// TestParseKeepsUnescapedWhitespace parses paths holding bytes the kernel
// does not escape (only space, tab, newline and backslash are): a
// carriage return, a vertical tab, a form feed and U+0085 belong to the
// path.
func TestParseKeepsUnescapedWhitespace(t *testing.T) {
	odd := "/mnt/a\rb\vc\fd\u0085e"
	entries, err := Parse(strings.NewReader("42 22 0:35 / " + odd + " rw shared:3 - tmpfs tmpfs rw\n"))
	if err != nil || len(entries) != 1 || entries[0].MountPoint != odd || entries[0].FSType != "tmpfs" {
		t.Fatalf("Parse: %+v, %v; want mount point %q of tmpfs", entries, err, odd)
	}
}
