package mountinfo

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestParse: roots and mount points are unescaped and the
// filesystem type is read after the separator, whatever the number of
// optional fields.
func TestParse(t *testing.T) {
	in := `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:45 / /var/lib/allocfs/mnt rw,nosuid,nodev,relatime shared:2 master:3 - fuse.allocfs allocfs:/var/lib/allocfs rw,user_id=0
37 22 0:46 / /tmp/with\040space\134x rw - tmpfs tmpfs rw
38 22 0:47 /kubepods/pod\0401 /sys/fs/cgroup ro - cgroup2 cgroup rw
`
	got, err := Parse(strings.NewReader(in))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := []Entry{
		{Root: "/", MountPoint: "/", FSType: "ext4", Source: "/dev/sda1", Device: "8:1", Options: "rw,relatime"},
		{Root: "/", MountPoint: "/var/lib/allocfs/mnt", FSType: "fuse.allocfs", Source: "allocfs:/var/lib/allocfs", Device: "0:45", Options: "rw,nosuid,nodev,relatime"},
		{Root: "/", MountPoint: `/tmp/with space\x`, FSType: "tmpfs", Source: "tmpfs", Device: "0:46", Options: "rw"},
		{Root: "/kubepods/pod 1", MountPoint: "/sys/fs/cgroup", FSType: "cgroup2", Source: "cgroup", Device: "0:47", Options: "ro"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if !got[1].HasOption("nosuid") || got[0].HasOption("nosuid") || got[1].HasOption("suid") {
		t.Errorf("HasOption: nosuid on %q %v, on %q %v; suid on %q %v",
			got[1].Options, got[1].HasOption("nosuid"), got[0].Options, got[0].HasOption("nosuid"), got[1].Options, got[1].HasOption("suid"))
	}
	if _, err := Parse(strings.NewReader("1 2 3 4 5 6 no separator here\n")); err == nil {
		t.Errorf("a line without the separator: got no error")
	}
}

// TestParseOwnTable: this machine's mount table parses and has a
// root mount.
func TestParseOwnTable(t *testing.T) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Skipf("no mountinfo: %v", err)
	}
	defer f.Close()
	mounts, err := Parse(f)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !slices.ContainsFunc(mounts, func(m Entry) bool { return m.MountPoint == "/" }) {
		t.Errorf("no mount at / among %d mounts", len(mounts))
	}
}
