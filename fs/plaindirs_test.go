package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// TestMountLayoutDirectoriesArePlain: an allocation's own directory and
// its alloc/ accept what a directory of a local filesystem accepts (what
// libcontainer keeps in alloc/container, a template rendered into
// ${NOMAD_ALLOC_DIR}, a socket or a FIFO a task shares with its sidecar,
// a link pointing outside the mount), each <task>/alloc view shows the
// same, the entries live in the allocation's own layers and the API's
// read side lists them, and os.RemoveAll of the allocation, as Nomad's GC
// runs it, removes all of it. The layout's names keep their meaning: a
// mkdir of a task name in the allocation's root makes a task, and a file
// cannot take a layout child's name.
func TestMountLayoutDirectoriesArePlain(t *testing.T) {
	tm := newTestMount(t)
	a := filepath.Join(tm.dir, "a1")
	must(t, os.Mkdir(a, 0o755))
	must(t, os.Mkdir(filepath.Join(a, "web"), 0o777))
	nomadTaskDirs(t, filepath.Join(a, "web"))
	must(t, os.Mkdir(filepath.Join(a, "web/alloc"), 0o777))
	for _, dir := range []string{a, filepath.Join(a, "alloc")} {
		// A mkdir in the allocation's root makes a task: its entries
		// go in the root itself.
		c := dir
		if dir != a {
			c = filepath.Join(dir, "container")
			must(t, os.Mkdir(c, 0o711))
		}
		must(t, os.WriteFile(filepath.Join(c, "state.tmp"), []byte(`{"id":"x"}`), 0o600))
		must(t, os.Rename(filepath.Join(c, "state.tmp"), filepath.Join(c, "state.json")))
		must(t, os.Link(filepath.Join(c, "state.json"), filepath.Join(c, "state.link")))
		must(t, unix.Mkfifo(filepath.Join(c, "exec.fifo"), 0o622))
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
		must(t, err)
		// Through the directory's descriptor: a test's temporary
		// path can be longer than a socket address holds.
		d, err := os.Open(dir)
		must(t, err)
		must(t, unix.Bind(fd, &unix.SockaddrUnix{Name: fmt.Sprintf("/proc/self/fd/%d/api.sock", d.Fd())}))
		d.Close()
		unix.Close(fd)
		must(t, os.Symlink("/etc/passwd", filepath.Join(dir, "outside")))
		must(t, os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644))
		must(t, unix.Setxattr(filepath.Join(dir, "ready"), "user.allocfs", []byte("v"), 0))
		must(t, os.Chmod(filepath.Join(dir, "ready"), 0o600))
		must(t, os.Chown(filepath.Join(dir, "ready"), 65534, 65534))
		must(t, unix.UtimesNano(filepath.Join(dir, "ready"), []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(2e18)}))
		if st := lstatT(t, filepath.Join(c, "state.json")); st.Nlink != 2 {
			t.Errorf("%s: %d links, want 2", filepath.Join(c, "state.json"), st.Nlink)
		}
		if got, err := os.Readlink(filepath.Join(dir, "outside")); err != nil || got != "/etc/passwd" {
			t.Errorf("readlink %s: %q, %v", filepath.Join(dir, "outside"), got, err)
		}
	}
	// A task's view of alloc/ is alloc/, as Nomad's bind mount makes it.
	if got, err := os.ReadFile(filepath.Join(a, "web/alloc/container/state.json")); err != nil || string(got) != `{"id":"x"}` {
		t.Errorf("web/alloc/container/state.json: %q, %v", got, err)
	}
	wantNames := map[string][]string{
		"":      {"alloc", "api.sock", "exec.fifo", "outside", "ready", "state.json", "state.link", "web"},
		"alloc": {"api.sock", "container", "data", "logs", "outside", "ready", "tmp"},
	}
	ad := NewAllocDir(tm.mount.logger, tm.store, tm.mount, tm.dir, "a1")
	for dir, want := range wantNames {
		if got := names(t, filepath.Join(a, dir)); !slices.Equal(got, want) {
			t.Errorf("ls %s: %v, want %v", dir, got, want)
		}
		p := dir
		if p == "" {
			p = "."
		}
		infos, err := ad.List(p)
		must(t, err)
		var got []string
		for _, fi := range infos {
			got = append(got, fi.Name)
		}
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("the read side lists %s as %v, want %v", p, got, want)
		}
	}
	// A link pointing outside the mount is never followed by the API.
	for _, p := range []string{"outside", "alloc/outside"} {
		if _, err := ad.ReadAt(p, 0); !errors.Is(err, allocdir.ErrEscapes) {
			t.Errorf("the read side reads %s, a link to /etc/passwd: %v, want ErrEscapes", p, err)
		}
	}
	st := mustState(t, tm.store, "a1")
	for key, name := range map[string]string{record.RootVolume: "state.json", record.SharedVolume: "container/exec.fifo"} {
		if _, err := os.Lstat(filepath.Join(tm.store.LayerPath(st.Volumes[key].Upper), name)); err != nil {
			t.Errorf("%s is not in the layer of volume %q: %v", name, key, err)
		}
	}

	// A name no task can have is a plain directory; a task name over a
	// file is taken, as on a local filesystem.
	must(t, os.Mkdir(filepath.Join(a, "with\nnewline"), 0o755))
	must(t, os.WriteFile(filepath.Join(a, "db"), nil, 0o644))
	if err := unix.Mkdir(filepath.Join(a, "db"), 0o777); !errors.Is(err, syscall.EEXIST) {
		t.Errorf("mkdir of a task name a file has: %v, want EEXIST", err)
	}
	for _, p := range []string{"alloc", "web", "alloc/data", "web/local"} {
		if _, err := os.OpenFile(filepath.Join(a, p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); !errors.Is(err, syscall.EEXIST) {
			t.Errorf("create %s: %v, want EEXIST", p, err)
		}
	}
	if tasks := mustState(t, tm.store, "a1").Tasks; len(tasks) != 1 || tasks[0].Name != "web" {
		t.Errorf("tasks: %v, want web alone", tasks)
	}

	// Nomad's GC: os.RemoveAll, then nothing of the allocation is left.
	// A shell still in the directory and in its alloc/ keeps the
	// kernel's nodes of them past their removal.
	for _, p := range []string{a, filepath.Join(a, "alloc")} {
		held, err := os.Open(p)
		must(t, err)
		defer held.Close()
	}
	layers := st.LayerIDs()
	must(t, os.RemoveAll(a))
	if _, err := tm.store.Get("a1"); err == nil {
		t.Errorf("a1 is still in the store after os.RemoveAll")
	}
	for l := range layers {
		if _, err := os.Lstat(tm.store.LayerPath(l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer %s is still there: %v", l, err)
		}
	}
	// The ID again, after its GC: a new allocation, with nothing of the
	// collected one.
	must(t, os.Mkdir(a, 0o755))
	if got := names(t, a); !slices.Equal(got, []string{"alloc"}) {
		t.Errorf("a1 made again lists %v, want [alloc]", got)
	}
	if got := names(t, filepath.Join(a, "alloc")); !slices.Equal(got, []string{"data", "logs", "tmp"}) {
		t.Errorf("a1/alloc made again lists %v, want [data logs tmp]", got)
	}
	for _, p := range []string{filepath.Join(a, "ready"), filepath.Join(a, "alloc", "ready")} {
		if err := os.WriteFile(p, []byte("again"), 0o644); err != nil {
			t.Errorf("a file in a1 made again: %v", err)
		}
	}
	// alloc/ removed and made again while a shell holds the old one:
	// the new one is a new node, on its new layer.
	held, err := os.Open(filepath.Join(a, "alloc"))
	must(t, err)
	defer held.Close()
	must(t, os.Remove(filepath.Join(a, "alloc", "ready")))
	for _, d := range []string{"data", "logs", "tmp", ""} {
		must(t, os.Remove(filepath.Join(a, "alloc", d)))
	}
	must(t, os.Mkdir(filepath.Join(a, "alloc"), 0o777))
	if err := os.WriteFile(filepath.Join(a, "alloc", "ready"), []byte("again"), 0o644); err != nil {
		t.Errorf("a file in alloc/ made again: %v", err)
	}
}
