package fs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// TestAllowSuid: the mount is nosuid unless MountOptions.AllowSuid, on
// every server kind, and nodev either way. A set-uid root copy of id(1)
// on the mount, run by nobody, runs as root only with AllowSuid: a task
// gains nothing from a set-id file by default.
func TestAllowSuid(t *testing.T) {
	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no user nobody to run the set-uid program as")
	}
	idPath, err := exec.LookPath("id")
	if err != nil {
		fstest.Lacks(t, "id (coreutils) is needed as the set-uid program: %v", err)
	}
	idBinary, err := os.ReadFile(idPath)
	must(t, err)
	for _, srv := range mountServers {
		for _, allow := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/allow %v", srv.name, allow), func(t *testing.T) {
				fstest.RequireFUSE(t)
				if err := transport.IOUringUsable(); srv.ring && err != nil {
					fstest.Lacks(t, "no FUSE over io_uring here: %v", err)
				}
				tm, vol, _ := setidSidesTuned(t, func(o *MountOptions) {
					srv.tune(o)
					o.AllowSuid = allow
				})
				entry := mountEntry(t, tm.dir)
				if got := entry.HasOption("nosuid"); got == allow {
					t.Errorf("the mount's options are %q: nosuid %v with AllowSuid %v", entry.Options, got, allow)
				}
				if !entry.HasOption("nodev") {
					t.Errorf("the mount's options are %q: no nodev", entry.Options)
				}
				p := filepath.Join(vol, "id")
				must(t, os.WriteFile(p, idBinary, 0o755))
				must(t, unix.Chmod(p, 0o4755))
				if got := modeOf(t, p); got != "type 100000 mode 4755" {
					t.Fatalf("the program on the mount is %s, not set-uid", got)
				}
				// Through a shell of the host's: the test process
				// serves the mount, and a child it forks execs with the
				// parent's thread held (vfork) until the program is read;
				// should the Go runtime stop the world meanwhile, the
				// read would wait for the server, and the server for the
				// held thread.
				cmd := exec.Command("/bin/sh", "-c", `exec "$0" -u`, p)
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(nobody.UID), Gid: uint32(nobody.GID)}}
				var stderr bytes.Buffer
				cmd.Stderr = &stderr
				out, err := cmd.Output()
				if err != nil {
					t.Fatalf("%s -u as nobody: %v: %s", p, err, stderr.Bytes())
				}
				want := strconv.Itoa(nobody.UID)
				if allow {
					want = "0"
				}
				if got := strings.TrimSpace(string(out)); got != want {
					t.Errorf("a set-uid root program on the mount, run by uid %d, has euid %s; want %s (AllowSuid %v)", nobody.UID, got, want, allow)
				}
			})
		}
	}
}

// mountEntry returns the entry of /proc/self/mountinfo mounted on top at
// dir.
func mountEntry(t *testing.T, dir string) mountinfo.Entry {
	t.Helper()
	mounts, err := mountinfo.Read("")
	must(t, err)
	var top *mountinfo.Entry
	for i := range mounts {
		if mounts[i].MountPoint == dir {
			top = &mounts[i]
		}
	}
	if top == nil {
		t.Fatalf("nothing is mounted at %s", dir)
	}
	return *top
}
