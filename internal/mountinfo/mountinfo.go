package mountinfo

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Entry is one line of /proc/self/mountinfo, the fields allocfs uses.
type Entry struct {
	// Root is the directory of the filesystem mounted there: "/" unless
	// a subtree was bind-mounted (a container's cgroup2, for one).
	Root       string
	MountPoint string
	FSType     string
	Source     string
	// Device is the filesystem's device, "major:minor"; a FUSE
	// connection's minor names it in /sys/fs/fuse/connections.
	Device string
	// Options are the mount's own options, comma-separated
	// ("rw,nosuid,nodev,relatime"): what mount(2)'s flags made of this
	// place, as against the filesystem's options after the separator.
	Options string
}

// HasOption reports whether the mount's own options include opt.
func (e Entry) HasOption(opt string) bool {
	for o := range strings.SplitSeq(e.Options, ",") {
		if o == opt {
			return true
		}
	}
	return false
}

// Parse reads the format of proc(5)'s mountinfo:
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
//
// The root is the fourth field, the mount point the fifth, the mount's
// options the sixth; after the "-" separator come the
// filesystem type and the source. Spaces, tabs, newlines and backslashes
// in paths are escaped as octal (\040).
func Parse(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		// Fields are separated by one space, and the kernel escapes only
		// space, tab, newline and backslash in paths: any other byte,
		// a carriage return or a vertical tab included, is part of the
		// field it is in.
		fields := strings.Split(sc.Text(), " ")
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) {
			return nil, fmt.Errorf("line %d: unexpected format: %q", line, sc.Text())
		}
		e := Entry{Root: unescape(fields[3]), MountPoint: unescape(fields[4]), FSType: fields[sep+1], Device: fields[2], Options: fields[5]}
		if sep+2 < len(fields) {
			e.Source = unescape(fields[sep+2])
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Read parses the mount table of the calling process, or of the
// file at path when it is not empty (tests point it at a fixture).
func Read(path string) ([]Entry, error) {
	if path == "" {
		path = "/proc/self/mountinfo"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read the mount table: %w", err)
	}
	defer f.Close()
	mounts, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("failed to read the mount table %s: %w", path, err)
	}
	return mounts, nil
}

// unescape undoes the kernel's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
