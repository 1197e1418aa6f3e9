package fs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	"golang.org/x/sys/unix"
)

// mountServers are the ways a mount's requests can be served. Each hands
// a WRITE to the handler chain through a method of its own (the own loop
// calls Write, go-fuse's server Writev), so what the chain does with a
// request's flags is checked on each.
var mountServers = []struct {
	name string
	tune func(*MountOptions)
	ring bool
}{
	{"own loop over /dev/fuse", func(o *MountOptions) { o.IOUring = false }, false},
	{"own loop over io_uring", func(o *MountOptions) { o.IOUring = true }, true},
	{"go-fuse", func(o *MountOptions) { o.GoFuseServer = true }, false},
}

// TestKillprivOnEveryServer: an unprivileged write (write, pwrite,
// append) to a set-uid or set-gid file clears the bits ext4 clears,
// whichever server serves the mount. Each file is written through the
// view it was chmod'ed through, where the kernel knows the bits and
// clears them first with a SETATTR, and through the allocation's other
// view of the same volume (<task>/alloc), a kernel inode of its own whose
// cached mode does not show them yet: there only the WRITE's
// FUSE_WRITE_KILL_SUIDGID tells the daemon to clear them.
func TestKillprivOnEveryServer(t *testing.T) {
	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no user nobody to own the files")
	}
	for _, srv := range mountServers {
		t.Run(srv.name, func(t *testing.T) {
			fstest.RequireFUSE(t)
			if err := transport.IOUringUsable(); srv.ring && err != nil {
				fstest.Lacks(t, "no FUSE over io_uring here: %v", err)
			}
			tm, vol, native := setidSidesTuned(t, srv.tune)
			if tm.mount.ioUring != srv.ring {
				t.Fatalf("requests over io_uring: %v, want %v", tm.mount.ioUring, srv.ring)
			}
			otherView := filepath.Join(tm.dir, "a", "web", "alloc", "data")
			writers := []struct {
				name     string
				uid, gid int
				modes    []uint32
			}{
				{"owner", nobody.UID, nobody.GID, []uint32{0o4755, 0o2755, 0o6755, 0o2745}},
				{"other", 4321, 4321, []uint32{0o6777, 0o4777, 0o2767}},
			}
			type kase struct {
				name, via, writer string
				mode              uint32
			}
			var cases []kase
			jobs := map[string]*strings.Builder{}
			for _, way := range []string{"write", "pwrite", "append"} {
				for _, w := range writers {
					if jobs[w.name] == nil {
						jobs[w.name] = &strings.Builder{}
					}
					for _, mode := range w.modes {
						for _, via := range []string{"same view", "other view"} {
							name := fmt.Sprintf("%s-%s-%04o-%s", way, w.name, mode, strings.ReplaceAll(via, " ", "-"))
							for _, dir := range []string{vol, native} {
								makeSetidFile(t, filepath.Join(dir, name), nobody, mode&0o777)
							}
							target := filepath.Join(vol, name)
							if via == "other view" {
								// The other view's inode caches the
								// mode before the bits are set.
								target = filepath.Join(otherView, name)
								modeOf(t, target)
							}
							for _, dir := range []string{vol, native} {
								must(t, unix.Chmod(filepath.Join(dir, name), mode))
							}
							fmt.Fprintf(jobs[w.name], "%s %s -\n%s %s -\n", way, filepath.Join(native, name), way, target)
							cases = append(cases, kase{name, via, w.name, mode})
						}
					}
				}
			}
			for _, w := range writers {
				cmd := exec.Command(os.Args[0], "-test.run", "^TestKillprivWriter$", "-test.count", "1")
				cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", killprivWriterEnv, w.uid, w.gid))
				cmd.Stdin = strings.NewReader(jobs[w.name].String())
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("the writes as %s: %v\n%s", w.name, err, out)
				}
			}
			st, err := tm.store.Get("a")
			must(t, err)
			upper := tm.store.LayerPath(st.Volumes["alloc/data"].Upper)
			killed := 0
			for _, c := range cases {
				want := modeOf(t, filepath.Join(native, c.name))
				if !strings.HasSuffix(want, fmt.Sprintf("mode %04o", c.mode)) {
					killed++
				}
				if got := modeOf(t, filepath.Join(upper, c.name)); got != want {
					t.Errorf("%s by %s through the %s: the layer holds %s, ext4 %s", c.name, c.writer, c.via, got, want)
				}
				// The view the bits were set through caches its mode;
				// the one written through shows the write's.
				if c.via == "same view" {
					if got := modeOf(t, filepath.Join(vol, c.name)); got != want {
						t.Errorf("%s by %s through the %s: %s through the mount, %s on ext4", c.name, c.writer, c.via, got, want)
					}
				}
				if got, want := readAll(t, filepath.Join(upper, c.name)), readAll(t, filepath.Join(native, c.name)); !bytes.Equal(got, want) {
					t.Errorf("%s by %s through the %s: the data differs from ext4's", c.name, c.writer, c.via)
				}
			}
			if killed == 0 {
				t.Fatalf("ext4 cleared no set-id bits in %d cases: the test's premise is wrong", len(cases))
			}
		})
	}
}
