//go:build linux

package daemon

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestWarnSuidKept: a daemon that takes over a mount made with the other
// --allow-suid says the mount keeps it; one that agrees with the mount,
// or finds no allocfs mount there, says nothing.
func TestWarnSuidKept(t *testing.T) {
	table := filepath.Join(t.TempDir(), "mountinfo")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(table, []byte(`22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
36 22 0:45 / /var/lib/allocfs/mnt rw,nosuid,nodev,relatime shared:2 - fuse.allocfs allocfs:/var/lib/allocfs rw,user_id=0
37 22 0:46 / /srv/suid rw,nodev,relatime shared:3 - fuse.allocfs allocfs:/srv rw,user_id=0
38 22 0:47 / /srv/other rw,nosuid - tmpfs tmpfs rw
`), 0o644))
	for _, c := range []struct {
		dir       string
		allowSuid bool
		warn      bool
	}{
		{"/var/lib/allocfs/mnt", false, false},
		{"/var/lib/allocfs/mnt", true, true},
		{"/srv/suid", true, false},
		{"/srv/suid", false, true},
		{"/srv/other", true, false},
		{"/nowhere", true, false},
	} {
		var out bytes.Buffer
		warnSuidKept(hclog.New(&hclog.LoggerOptions{Output: &out}), c.dir, c.allowSuid, table)
		if got := strings.Contains(out.String(), "set-id setting"); got != c.warn {
			t.Errorf("taking over %s with --allow-suid=%v: warned %v, want %v: %q", c.dir, c.allowSuid, got, c.warn, out.String())
		}
	}
}
