//go:build linux

package allocdirtest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
)

// eventTimeout is how long a watcher may take to report a change. It is
// several poll periods of a polling implementation.
const eventTimeout = 2 * time.Second

// hangTimeout is how long a call that must not block is given before the
// suite declares it hung.
const hangTimeout = 5 * time.Second

// requireRoot skips t unless the test runs as root, saying which
// assertion needs it and why.
func requireRoot(t *testing.T, reason string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("skipping: needs root (euid 0) to %s; running as uid %d", reason, os.Geteuid())
	}
}

// lookupOwner returns the numeric uid and primary gid of a user name.
func lookupOwner(t *testing.T, name string) (uid, gid uint32) {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		t.Skipf("skipping: user %q does not exist here: %v", name, err)
	}
	id, err1 := strconv.ParseUint(u.Uid, 10, 32)
	g, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("user %q has non-numeric ids %q/%q", name, u.Uid, u.Gid)
	}
	return uint32(id), uint32(g)
}

// fixture creates one thing below a root directory.
type fixture func(t *testing.T, root string)

// apply creates the fixtures below root, in order, with ordinary os calls.
func apply(t *testing.T, root string, fx ...fixture) {
	t.Helper()
	for _, f := range fx {
		f(t, root)
	}
}

// file creates a regular file (and missing parents, 0755) with content and
// exactly mode, whatever the umask.
func file(rel, content string, mode fs.FileMode) fixture {
	return func(t *testing.T, root string) {
		t.Helper()
		p := hostJoin(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
	}
}

// dir creates a directory (and missing parents, 0755) with exactly mode.
func dir(rel string, mode fs.FileMode) fixture {
	return func(t *testing.T, root string) {
		t.Helper()
		p := hostJoin(root, rel)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
	}
}

// symlink creates a symbolic link rel -> target (target verbatim).
func symlink(rel, target string) fixture {
	return func(t *testing.T, root string) {
		t.Helper()
		p := hostJoin(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
	}
}

// fifo creates a named pipe.
func fifo(rel string) fixture {
	return func(t *testing.T, root string) {
		t.Helper()
		if err := syscall.Mkfifo(hostJoin(root, rel), 0o666); err != nil {
			t.Fatalf("fixture %s: %v", rel, err)
		}
	}
}

// hostJoin joins a slash-separated relative path onto a host directory.
func hostJoin(root, rel string) string {
	return filepath.Join(root, filepath.FromSlash(rel))
}

// host returns the host path of rel inside the allocation.
func host(a allocdir.Interface, rel string) string {
	return hostJoin(a.AllocDirPath(), rel)
}

// readAt reads everything ReadAt(p, off) returns. A failing ReadAt must
// not hand out a reader.
func readAt(t *testing.T, a allocdir.FS, p string, off int64) (string, error) {
	t.Helper()
	rc, err := a.ReadAt(p, off)
	if err != nil {
		if rc != nil {
			rc.Close()
			t.Errorf("ReadAt(%q) failed with %v but returned a reader: got non-nil, want nil", p, err)
		}
		return "", err
	}
	if rc == nil {
		t.Fatalf("ReadAt(%q): got nil reader and nil error", p)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// mustRead asserts that ReadAt(p, 0) returns want.
func mustRead(t *testing.T, a allocdir.FS, p, want string) {
	t.Helper()
	got, err := readAt(t, a, p, 0)
	if err != nil {
		t.Errorf("ReadAt(%q): %v", p, err)
		return
	}
	if got != want {
		t.Errorf("ReadAt(%q): got %q, want %q", p, got, want)
	}
}

// wantNotExist asserts that Stat(p) fails with fs.ErrNotExist.
func wantNotExist(t *testing.T, a allocdir.FS, p string) {
	t.Helper()
	fi, err := a.Stat(p)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat(%q): got (%v, %v), want an error wrapping fs.ErrNotExist", p, describe(fi), err)
	}
}

// describe prints a FileInfo for failure messages.
func describe(fi *allocdir.FileInfo) string {
	if fi == nil {
		return "<nil>"
	}
	return fmt.Sprintf("{%s %s size=%d}", fi.Name, fi.FileMode, fi.Size)
}

// names returns the names of a listing.
func names(infos []*allocdir.FileInfo) []string {
	out := make([]string, 0, len(infos))
	for _, fi := range infos {
		out = append(out, fi.Name)
	}
	return out
}

// find returns the entry called name of a listing, or nil.
func find(infos []*allocdir.FileInfo, name string) *allocdir.FileInfo {
	for _, fi := range infos {
		if fi.Name == name {
			return fi
		}
	}
	return nil
}

// modeOf lstats a host path.
func modeOf(t *testing.T, p string) fs.FileMode {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return fi.Mode()
}

// wantMode asserts a host path's full mode (type, permissions and special
// bits).
func wantMode(t *testing.T, p string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Errorf("lstat %s: %v", p, err)
		return
	}
	if got := fi.Mode(); got != want {
		t.Errorf("mode of %s: got %v, want %v", p, got, want)
	}
}

// ownerOf returns the uid and gid of a host path.
func ownerOf(t *testing.T, p string) (uid, gid uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Fatalf("lstat %s: no syscall.Stat_t", p)
	}
	return st.Uid, st.Gid
}

// within runs fn and reports whether it returned before d. A call still
// running after d is left behind (it may leak); the caller fails the test.
func within(d time.Duration, fn func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// implGoroutines counts the goroutines started by allocfs code outside
// this suite: watchers an implementation left running. Goroutines of
// the runtime, the testing package or an in-process FUSE server (which
// starts and stops readers as load changes) are not counted, so the count
// is exact even when the implementation under test serves a mount.
func implGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		i := strings.LastIndex(g, "created by ")
		if i < 0 {
			continue
		}
		creator := g[i:]
		// The FUSE transport's request threads are the mount's, not a
		// watcher's: a busy queue grows one more (it keeps it while the
		// mount lives), whenever the load says so.
		if strings.Contains(creator, "github.com/allocfs/allocfs/") && !strings.Contains(creator, "/allocdirtest.") &&
			!strings.Contains(creator, "/fs/transport.") {
			count++
		}
	}
	return count
}

// settleGoroutines waits for the count of implementation goroutines to
// come back to at most before, and fails t with every goroutine's stack
// if it does not.
func settleGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := implGoroutines()
		if n <= before {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Errorf("goroutines after the watchers stopped: got %d, want at most %d (leak)\n%s", n, before, buf)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tree records every path below root (root itself as ".") with its mode,
// without following links. A missing root gives an empty tree.
func tree(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == root {
				return filepath.SkipAll
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		out[rel] = fi.Mode()
		return nil
	})
	if err != nil {
		t.Fatalf("walking %s: %v", root, err)
	}
	return out
}

// topLevel records root's own mode and its direct entries with modes.
func topLevel(t *testing.T, root string) map[string]fs.FileMode {
	t.Helper()
	out := map[string]fs.FileMode{".": modeOf(t, root)}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatalf("reading %s: %v", root, err)
	}
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatalf("lstat %s/%s: %v", root, e.Name(), err)
		}
		out[e.Name()] = fi.Mode()
	}
	return out
}

// diffTrees describes how after differs from before, or "" if it does not.
func diffTrees(before, after map[string]fs.FileMode) string {
	var diffs []string
	for p, m := range after {
		if old, ok := before[p]; !ok {
			diffs = append(diffs, fmt.Sprintf("created %s (%v)", p, m))
		} else if old != m {
			diffs = append(diffs, fmt.Sprintf("changed %s: %v -> %v", p, old, m))
		}
	}
	for p := range before {
		if _, ok := after[p]; !ok {
			diffs = append(diffs, "removed "+p)
		}
	}
	sort.Strings(diffs)
	return strings.Join(diffs, "; ")
}

// dumpTree logs the tree below root (at most 300 entries) to help read a
// failure.
func dumpTree(t *testing.T, root string) {
	var b strings.Builder
	n := 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			fmt.Fprintf(&b, "  %s: %v\n", p, err)
			return nil
		}
		if n++; n > 300 {
			b.WriteString("  ...\n")
			return filepath.SkipAll
		}
		line := p
		if fi, err := d.Info(); err == nil {
			line = fmt.Sprintf("%v %8d %s", fi.Mode(), fi.Size(), p)
			if fi.Mode()&fs.ModeSymlink != 0 {
				target, _ := os.Readlink(p)
				line += " -> " + target
			}
		}
		b.WriteString("  " + line + "\n")
		return nil
	})
	if err != nil {
		fmt.Fprintf(&b, "  walk: %v\n", err)
	}
	t.Logf("tree of %s:\n%s", root, b.String())
}
