package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/gc"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/volume"
	"golang.org/x/sys/unix"
)

// records returns the store's records as JSON, for "nothing changed".
func records(t *testing.T, s *store.Store) string {
	t.Helper()
	return mustJSON(t, s.List())
}

// wantErrno checks that err is errno.
func wantErrno(t *testing.T, what string, err error, errno syscall.Errno) {
	t.Helper()
	if !errors.Is(err, errno) {
		t.Errorf("%s: %v, want %v", what, err, errno)
	}
}

// TestMountMkdirMakesAllocationsAndTasks: a mkdir at the mount root is an
// allocation's create, with alloc/{data,logs,tmp} in place and owned by
// the caller; a mkdir in its root a task's, with its layout; both are
// records the store holds (Nomad's, not for the collector), and what a
// chmod, chown or utimes of alloc/ sets stays in its layer.
func TestMountMkdirMakesAllocationsAndTasks(t *testing.T) {
	tm := newTestMount(t)
	a := filepath.Join(tm.dir, "9f0c7c1e-0ac2-4f36-8d2a-0c3e1a2b3c4d")
	must(t, os.Mkdir(a, 0o755))
	for _, d := range []string{"alloc", "alloc/data", "alloc/logs", "alloc/tmp"} {
		if fi, err := os.Stat(filepath.Join(a, d)); err != nil || !fi.IsDir() {
			t.Fatalf("%s after the mkdir of the allocation: %v", d, err)
		}
	}
	st := lstatT(t, a)
	if st.Mode&0o7777 != 0o755 || st.Uid != 0 {
		t.Errorf("the allocation's directory: mode %o uid %d, want 0755 and the caller's", st.Mode&0o7777, st.Uid)
	}
	id := filepath.Base(a)
	rec := mustState(t, tm.store, id)
	if rec.Origin != record.OriginMount || len(rec.Tasks) != 0 {
		t.Errorf("the record: origin %q, tasks %v; want %q and none", rec.Origin, rec.Tasks, record.OriginMount)
	}
	// Build: alloc/ is chmodded 0777 and chowned to nobody.
	must(t, os.Chmod(filepath.Join(a, "alloc"), 0o751))
	must(t, os.Chown(filepath.Join(a, "alloc"), 4321, 4322))
	must(t, unix.UtimesNano(filepath.Join(a, "alloc"), []unix.Timespec{unix.NsecToTimespec(1e18), unix.NsecToTimespec(2e18)}))
	st = lstatT(t, filepath.Join(a, "alloc"))
	if st.Mode&0o7777 != 0o751 || st.Uid != 4321 || st.Gid != 4322 || st.Mtim.Nano() != 2e18 {
		t.Errorf("alloc/ after chmod, chown, utimes: mode %o owner %d:%d mtime %d", st.Mode&0o7777, st.Uid, st.Gid, st.Mtim.Nano())
	}
	// alloc/ is a volume: its layer's root keeps what was set.
	if st := lstatT(t, tm.store.LayerPath(mustState(t, tm.store, id).Volumes[record.SharedVolume].Upper)); st.Mode&0o7777 != 0o751 || st.Uid != 4321 || st.Mtim.Nano() != 2e18 {
		t.Errorf("alloc/'s layer root keeps mode %o owner %d mtime %d", st.Mode&0o7777, st.Uid, st.Mtim.Nano())
	}
	// The task's view shows the same attribute.
	must(t, os.Mkdir(filepath.Join(a, "web"), 0o777))
	if got := names(t, filepath.Join(a, "web")); len(got) != 0 {
		t.Errorf("a new task directory holds %v, want nothing, as a new directory", got)
	}
	// Nomad makes the task's directories itself; a chroot task's alloc/
	// view too.
	nomadTaskDirs(t, filepath.Join(a, "web"))
	must(t, os.Mkdir(filepath.Join(a, "web/alloc"), 0o777))
	for _, d := range []string{"web/local", "web/tmp", "web/secrets", "web/private", "web/alloc/data"} {
		if fi, err := os.Stat(filepath.Join(a, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s after Nomad's mkdirs in the task: %v", d, err)
		}
	}
	if st := lstatT(t, filepath.Join(a, "web/alloc")); st.Mode&0o7777 != 0o751 {
		t.Errorf("web/alloc shows mode %o, want alloc/'s 0751", st.Mode&0o7777)
	}
	if rec := mustState(t, tm.store, id); rec.TaskIndex("web") < 0 || rec.Volumes["web/local"] == nil {
		t.Errorf("the record after the task's mkdir: %+v", rec)
	}
	// What Nomad writes in a task's root lands in its own layer.
	must(t, os.WriteFile(filepath.Join(a, "web/executor.out"), []byte("x"), 0o644))
	must(t, os.Mkdir(filepath.Join(a, "web/dev"), 0o755))
	if _, err := os.Lstat(filepath.Join(tm.store.LayerPath(mustState(t, tm.store, id).Volumes["web"].Upper), "executor.out")); err != nil {
		t.Errorf("executor.out is not in the task's layer: %v", err)
	}
	// The collector leaves it alone, stopped or not.
	if _, err := tm.store.Stop(id); err != nil {
		t.Fatal(err)
	}
	c := gc.NewCollector(testLogger(t), tm.store, gc.Config{MaxAllocs: -1})
	if got, _ := c.CollectAll("test"); len(got) != 0 {
		t.Errorf("the collector took %v, an allocation Nomad made through the mount", got)
	}
}

// TestMountMkdirRefusesBadNames: a name that is not an allocation ID, or
// one the store holds, is refused with the errno a user expects, and
// nothing is made.
func TestMountMkdirRefusesBadNames(t *testing.T) {
	tm := newTestMount(t)
	must(t, os.Mkdir(filepath.Join(tm.dir, "a1"), 0o755))
	before := records(t, tm.store)
	for name, want := range map[string]syscall.Errno{
		"a1":                     syscall.EEXIST,
		".":                      syscall.EEXIST,
		"..":                     syscall.EEXIST,
		"with\nnewline":          syscall.EINVAL,
		"with\x1b[31mescape":     syscall.EINVAL,
		".hidden":                syscall.EINVAL,
		strings.Repeat("x", 251): syscall.EINVAL,
		strings.Repeat("x", 256): syscall.ENAMETOOLONG,
		"not\xffutf8":            syscall.EINVAL,
	} {
		wantErrno(t, fmt.Sprintf("mkdir %q", name), unix.Mkdir(filepath.Join(tm.dir, name), 0o755), want)
	}
	a := filepath.Join(tm.dir, "a1")
	wantErrno(t, "mkdir a1/alloc", unix.Mkdir(filepath.Join(a, "alloc"), 0o755), syscall.EEXIST)
	wantErrno(t, "mkdir a1/alloc/data", unix.Mkdir(filepath.Join(a, "alloc/data"), 0o755), syscall.EEXIST)
	if after := records(t, tm.store); after != before {
		t.Errorf("refused mkdirs changed the store:\n%s\nwant\n%s", after, before)
	}
	if ids := tm.store.IDs(); !slices.Equal(ids, []string{"a1"}) {
		t.Errorf("the store holds %v, want [a1]", ids)
	}
}

// TestMountRemoveAllDestroys: os.RemoveAll of an allocation, one unlink
// and rmdir at a time as Nomad's GC does it, removes it from the store
// with its layers; an rmdir of a directory that still holds entries says
// ENOTEMPTY and changes nothing; each layout directory can be made again
// after its rmdir.
func TestMountRemoveAllDestroys(t *testing.T) {
	tm := newTestMount(t)
	a := filepath.Join(tm.dir, "a1")
	must(t, os.Mkdir(a, 0o755))
	must(t, os.Mkdir(filepath.Join(a, "web"), 0o777))
	nomadTaskDirs(t, filepath.Join(a, "web"))
	must(t, os.WriteFile(filepath.Join(a, "alloc/data/f"), []byte("data"), 0o644))
	must(t, os.WriteFile(filepath.Join(a, "web/local/l"), []byte("local"), 0o644))
	must(t, os.WriteFile(filepath.Join(a, "web/secrets/token"), []byte("s3cret"), 0o600))
	must(t, unix.Mkfifo(filepath.Join(a, "alloc/logs/.web.stdout.fifo"), 0o600))
	must(t, os.Mkdir(filepath.Join(a, "web/etc"), 0o755))
	layers := layerDirs(t, tm.store)

	before := records(t, tm.store)
	for _, d := range []string{"alloc/data", "web/local", "web/secrets", "web", "alloc", ""} {
		wantErrno(t, "rmdir of a non-empty "+d, unix.Rmdir(filepath.Join(a, d)), syscall.ENOTEMPTY)
	}
	if after := records(t, tm.store); after != before {
		t.Errorf("refused rmdirs changed the store")
	}

	// Made again after an rmdir.
	must(t, os.Remove(filepath.Join(a, "alloc/tmp")))
	wantErrno(t, "stat alloc/tmp after its rmdir", errOnly(os.Stat(filepath.Join(a, "alloc/tmp"))), syscall.ENOENT)
	must(t, os.Mkdir(filepath.Join(a, "alloc/tmp"), 0o777))
	must(t, os.Remove(filepath.Join(a, "web/private")))
	names, _ := os.ReadDir(filepath.Join(a, "web"))
	if slices.ContainsFunc(names, func(e os.DirEntry) bool { return e.Name() == "private" }) {
		t.Errorf("web/ still lists private/ after its rmdir")
	}
	must(t, os.Mkdir(filepath.Join(a, "web/private"), 0o777))

	if err := os.RemoveAll(a); err != nil {
		t.Fatalf("os.RemoveAll of the allocation: %v", err)
	}
	if _, err := tm.store.Get("a1"); !errors.Is(err, allocdir.ErrUnknownAlloc) {
		t.Errorf("the store after RemoveAll: %v, want the allocation gone", err)
	}
	if _, err := os.Lstat(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the allocation's directory after RemoveAll: %v", err)
	}
	for _, l := range layers {
		if _, err := os.Lstat(filepath.Join(tm.store.DataDir(), "layers", l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer %s outlived its allocation: %v", l, err)
		}
	}
}

// newAllocs makes allocations prev and new through the mount, with the
// tasks, as Nomad's Build and task directories do.
func newAllocs(t *testing.T, dir string, tasks ...string) (prev, next string) {
	t.Helper()
	prev, next = filepath.Join(dir, "prev"), filepath.Join(dir, "new")
	for _, a := range []string{prev, next} {
		must(t, os.Mkdir(a, 0o755))
		for _, task := range tasks {
			must(t, os.Mkdir(filepath.Join(a, task), 0o777))
			nomadTaskDirs(t, filepath.Join(a, task))
		}
	}
	return prev, next
}

// TestMountMoveIsARemap: Nomad's Move (os.Remove of the new allocation's
// empty alloc/data and <task>/local, then os.Rename of the previous ones
// onto them) hands the volumes over: the same layers, no byte copied, the
// new allocation reads the data and writes it in place, the previous one
// shows neither directory any more and keeps its logs; records say so.
// A rename onto the empty directory, without the removal, does the same.
func TestMountMoveIsARemap(t *testing.T) {
	tm := newTestMount(t)
	prev, next := newAllocs(t, tm.dir, "web", "db")
	must(t, os.WriteFile(filepath.Join(prev, "alloc/data/f"), []byte("data"), 0o644))
	must(t, os.WriteFile(filepath.Join(prev, "web/local/l"), []byte("web"), 0o644))
	must(t, os.WriteFile(filepath.Join(prev, "db/local/l"), []byte("db"), 0o644))
	must(t, os.WriteFile(filepath.Join(prev, "alloc/logs/web.stderr.0"), []byte("the log\n"), 0o644))
	rec := mustState(t, tm.store, "prev")
	dataLayer, webLayer := rec.Volumes["alloc/data"].Upper, rec.Volumes["web/local"].Upper

	// The file keeps its inode across the move, as on ext4.
	var before unix.Stat_t
	must(t, unix.Stat(filepath.Join(tm.store.LayerPath(dataLayer), "f"), &before))
	os.Remove(filepath.Join(next, "alloc/data"))
	must(t, os.Rename(filepath.Join(prev, "alloc/data"), filepath.Join(next, "alloc/data")))
	os.Remove(filepath.Join(next, "web/local"))
	must(t, os.Rename(filepath.Join(prev, "web/local"), filepath.Join(next, "web/local")))
	// No removal first: rename(2) onto the empty directory (os.Rename
	// refuses an existing directory itself, which is why Nomad removes
	// it first).
	must(t, unix.Rename(filepath.Join(prev, "db/local"), filepath.Join(next, "db/local")))

	for p, want := range map[string]string{"alloc/data/f": "data", "web/local/l": "web", "db/local/l": "db"} {
		if got, err := os.ReadFile(filepath.Join(next, p)); err != nil || string(got) != want {
			t.Errorf("new/%s: %q, %v; want %q", p, got, err, want)
		}
		if _, err := os.Lstat(filepath.Join(prev, filepath.Dir(p))); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("prev/%s after the move: %v, want it gone", filepath.Dir(p), err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(prev, "alloc/logs/web.stderr.0")); err != nil || string(got) != "the log\n" {
		t.Errorf("prev's log after the move: %q, %v", got, err)
	}
	rec = mustState(t, tm.store, "new")
	if rec.Volumes["alloc/data"].Upper != dataLayer || rec.Volumes["web/local"].Upper != webLayer || rec.Previous != "prev" {
		t.Errorf("new's record: %+v, want prev's layers %s and %s", rec, dataLayer, webLayer)
	}
	if old := mustState(t, tm.store, "prev"); old.Volumes["alloc/data"] != nil || old.Volumes["web/local"] != nil || old.MigratedTo != "new" {
		t.Errorf("prev's record still has the moved volumes: %+v", old)
	}
	must(t, os.WriteFile(filepath.Join(next, "alloc/data/f"), []byte("written in place"), 0o644))
	var after unix.Stat_t
	must(t, unix.Stat(filepath.Join(tm.store.LayerPath(dataLayer), "f"), &after))
	if after.Ino != before.Ino {
		t.Errorf("the moved file's backing inode changed: %d, was %d (a copy)", after.Ino, before.Ino)
	}
	// Once the rename is answered, the moved name shows the new
	// allocation's own node, with inode numbers in its own slot, as a
	// name looked up anew does.
	rec = mustState(t, tm.store, "new")
	want := (after.Ino | uint64(rec.Tags[dataLayer])<<layer.SaltShift) ^ tm.mount.slots.peek("new", 0)<<volume.ViewShift
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if st := lstatT(t, filepath.Join(next, "alloc/data/f")); st.Ino == want {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("new/alloc/data/f has st_ino %#x 5 s after the move, want %#x (the new allocation's slot)", st.Ino, want)
		}
	}
}

// TestMountRefusedRenames: a rename of a layout directory between
// allocations other than the Move, between views of alloc/, of or onto a
// memory volume or an alloc/ view, is refused with the errno of a mount
// point, ext4's for a non-empty target, and changes nothing.
func TestMountRefusedRenames(t *testing.T) {
	tm := newTestMount(t)
	prev, next := newAllocs(t, tm.dir, "web")
	must(t, os.Mkdir(filepath.Join(prev, "web/alloc"), 0o777))
	must(t, os.WriteFile(filepath.Join(next, "alloc/data/there"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(prev, "alloc/data/f"), []byte("x"), 0o644))
	before := records(t, tm.store)
	for _, c := range []struct {
		from, to string
		flags    uint
		want     syscall.Errno
	}{
		{"prev/alloc/logs", "new/alloc/logs", 0, syscall.EXDEV},
		{"prev/alloc/tmp", "new/alloc/tmp", 0, syscall.EXDEV},
		{"prev/alloc/data", "new/alloc/data", 0, syscall.ENOTEMPTY},
		{"prev/alloc/data", "new/alloc/data", unix.RENAME_NOREPLACE, syscall.EEXIST},
		{"prev/alloc/data", "new/alloc/data", unix.RENAME_EXCHANGE, syscall.EXDEV},
		{"prev/alloc/data", "prev/alloc/logs", unix.RENAME_NOREPLACE, syscall.EEXIST},
		{"prev/alloc/data", "prev/web/local", unix.RENAME_EXCHANGE, syscall.EBUSY},
		{"prev/alloc/data", "prev/web/secrets", 0, syscall.EBUSY},
		{"prev/alloc/data", "new/alloc/other", 0, syscall.EXDEV},
		{"prev/alloc/logs", "prev/web/alloc/l2", 0, syscall.EXDEV},
		{"prev/web/local", "new/web/tmp", 0, syscall.EXDEV},
		{"prev/web/local", "prev/web/private", 0, syscall.EBUSY},
		{"prev/web/local", "prev/web/alloc", 0, syscall.EBUSY},
		{"prev/web/secrets", "prev/web/s2", 0, syscall.EBUSY},
		{"prev/web/local", "prev/x", 0, syscall.EXDEV},
		{"prev/web/secrets", "new/web/secrets", 0, syscall.EXDEV},
		{"prev/web", "new/web2", 0, syscall.EXDEV},
		{"prev/web", "prev/web2", 0, syscall.EBUSY},
		{"prev", "other", 0, syscall.EBUSY},
	} {
		err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(tm.dir, c.from), unix.AT_FDCWD, filepath.Join(tm.dir, c.to), c.flags)
		wantErrno(t, fmt.Sprintf("rename %s %s (flags %#x)", c.from, c.to, c.flags), err, c.want)
	}
	// Onto itself: nothing to do, as rename(2) says.
	must(t, unix.Rename(filepath.Join(prev, "alloc/data"), filepath.Join(prev, "alloc/data")))
	if after := records(t, tm.store); after != before {
		t.Errorf("refused renames changed the store:\n%s\nwant\n%s", after, before)
	}
	if got, err := os.ReadFile(filepath.Join(prev, "alloc/data/f")); err != nil || string(got) != "x" {
		t.Errorf("prev's data after the refused renames: %q, %v", got, err)
	}
}

// TestMountTaskDirectoryRenames: a directory made at an allocation's root
// is a task's, and renames as a directory does on ext4 while it holds
// nothing of Nomad's making (no secrets/, private/ or chroot): its entries
// and inode number go with it, an empty one is replaced, and a directory
// handle opened before keeps working. What a plain directory could not
// do here is refused with the errno of docs/design/nomad-client.md, and
// changes nothing.
func TestMountTaskDirectoryRenames(t *testing.T) {
	tm := newTestMount(t)
	a := filepath.Join(tm.dir, "a1")
	must(t, os.Mkdir(a, 0o755))
	for _, d := range []string{"t1", "empty", "full", "nomads", "own/sub"} {
		must(t, os.MkdirAll(filepath.Join(a, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(a, "t1/f"), []byte("one"), 0o644))
	must(t, os.Mkdir(filepath.Join(a, "t1/local"), 0o777))
	must(t, os.WriteFile(filepath.Join(a, "t1/local/l"), []byte("local"), 0o644))
	must(t, os.WriteFile(filepath.Join(a, "full/f"), []byte("x"), 0o644))
	must(t, os.WriteFile(filepath.Join(a, "file"), []byte("x"), 0o644))
	// No task can have this name: a directory of the allocation's own
	// volume.
	must(t, os.Mkdir(filepath.Join(a, "plain\nd"), 0o755))
	nomadTaskDirs(t, filepath.Join(a, "nomads"))
	ino := lstatT(t, filepath.Join(a, "t1")).Ino
	dir, err := os.Open(filepath.Join(a, "t1"))
	must(t, err)
	defer dir.Close()

	before := records(t, tm.store)
	for _, c := range []struct {
		from, to string
		flags    uint
		want     syscall.Errno
	}{
		{"t1", "full", 0, syscall.ENOTEMPTY},
		{"t1", "empty", unix.RENAME_NOREPLACE, syscall.EEXIST},
		{"t1", "empty", unix.RENAME_EXCHANGE, syscall.EBUSY},
		{"t1", "own", 0, syscall.ENOTEMPTY},
		{"t1", "own/sub/t1", 0, syscall.EXDEV},
		{"t1", "file", 0, syscall.ENOTDIR},
		{"t1", "plain\\nd", 0, syscall.EXDEV},
		{"t1", "alloc", 0, syscall.EBUSY},
		{"t1", "alloc/data/t1", 0, syscall.EXDEV},
		{"t1", "with\nnewline", 0, syscall.EXDEV},
		{"nomads", "n2", 0, syscall.EBUSY},
		{"alloc", "a2", 0, syscall.EBUSY},
	} {
		to := strings.ReplaceAll(c.to, "\\n", "\n")
		err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(a, c.from), unix.AT_FDCWD, filepath.Join(a, to), c.flags)
		wantErrno(t, fmt.Sprintf("rename %s %q (flags %#x)", c.from, to, c.flags), err, c.want)
	}
	if after := records(t, tm.store); after != before {
		t.Errorf("refused renames changed the store:\n%s\nwant\n%s", after, before)
	}

	must(t, os.Rename(filepath.Join(a, "t1"), filepath.Join(a, "t2")))
	wantErrno(t, "stat t1 after its rename", errOnly(os.Lstat(filepath.Join(a, "t1"))), syscall.ENOENT)
	for p, want := range map[string]string{"t2/f": "one", "t2/local/l": "local"} {
		if got, err := os.ReadFile(filepath.Join(a, p)); err != nil || string(got) != want {
			t.Errorf("%s after the rename: %q, %v; want %q", p, got, err, want)
		}
	}
	if got := lstatT(t, filepath.Join(a, "t2")).Ino; got != ino {
		t.Errorf("t2's inode number %#x, want t1's %#x: a rename keeps the directory", got, ino)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), "f", &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Errorf("a handle of the directory opened before its rename: %v", err)
	}
	rec := mustState(t, tm.store, "a1")
	if rec.TaskIndex("t1") >= 0 || rec.TaskIndex("t2") < 0 || rec.Volumes["t2/local"] == nil || rec.Volumes["t1/local"] != nil {
		t.Errorf("the record after the rename: %+v", rec)
	}
	// Onto an empty directory, which goes with its layer.
	emptyLayer := rec.Volumes["empty"].Upper
	must(t, unix.Rename(filepath.Join(a, "t2"), filepath.Join(a, "empty")))
	if got, err := os.ReadFile(filepath.Join(a, "empty/f")); err != nil || string(got) != "one" {
		t.Errorf("empty/f after the rename over it: %q, %v", got, err)
	}
	if _, err := os.Lstat(tm.store.LayerPath(emptyLayer)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the layer of the directory a rename replaced: %v, want it gone", err)
	}
	// The renamed task is Nomad's as any other: a mkdir makes its layout.
	must(t, os.Mkdir(filepath.Join(a, "empty/secrets"), 0o777))
	if rec := mustState(t, tm.store, "a1"); rec.IsGone("empty/secrets") || len(rec.Tasks) != 4 {
		t.Errorf("the record after secrets/ was made in the renamed task: %+v", rec)
	}
	must(t, os.RemoveAll(a))
}

// TestMountVolumeRenames: data/, logs/ and tmp/ of alloc/, and a task's
// local/ and tmp/, rename inside their allocation as directories do on
// ext4 (mv alloc/data alloc/d2): the same layers under the new name, open
// files go on, an empty one is replaced, the layout's directory can be
// made again, the read side and the record follow, and rm -rf takes all
// of it.
func TestMountVolumeRenames(t *testing.T) {
	tm := newTestMount(t)
	a := filepath.Join(tm.dir, "a1")
	must(t, os.Mkdir(a, 0o755))
	must(t, os.Mkdir(filepath.Join(a, "web"), 0o777))
	nomadTaskDirs(t, filepath.Join(a, "web"))
	must(t, os.Mkdir(filepath.Join(a, "web/alloc"), 0o777))
	must(t, os.WriteFile(filepath.Join(a, "web/local/l"), []byte("local"), 0o644))
	f, err := os.OpenFile(filepath.Join(a, "alloc/data/f"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer f.Close()
	must(t, errOnly(f.WriteString("before ")))
	data := mustState(t, tm.store, "a1").Volumes["alloc/data"].Upper
	ino := lstatT(t, filepath.Join(a, "alloc/data")).Ino

	must(t, unix.Rename(filepath.Join(a, "alloc/data"), filepath.Join(a, "alloc/d2")))
	must(t, errOnly(f.WriteString("after")))
	if got, err := os.ReadFile(filepath.Join(a, "alloc/d2/f")); err != nil || string(got) != "before after" {
		t.Errorf("alloc/d2/f: %q, %v", got, err)
	}
	wantErrno(t, "stat alloc/data after its rename", errOnly(os.Lstat(filepath.Join(a, "alloc/data"))), syscall.ENOENT)
	if got := lstatT(t, filepath.Join(a, "alloc/d2")).Ino; got != ino {
		t.Errorf("alloc/d2's inode number %#x, want alloc/data's %#x", got, ino)
	}
	if got := names(t, filepath.Join(a, "web/alloc")); strings.Join(got, " ") != "d2 logs tmp" {
		t.Errorf("the task's view of alloc/: %v, want d2 logs tmp", got)
	}
	if v := mustState(t, tm.store, "a1").Volumes["alloc/d2"]; v == nil || v.Upper != data {
		t.Errorf("the record's alloc/d2: %+v, want alloc/data's layer %s", v, data)
	}
	ad := NewAllocDir(tm.mount.logger, tm.store, tm.mount, tm.dir, "a1")
	if _, err := ad.Stat("alloc/d2/f"); err != nil {
		t.Errorf("the read side's Stat(alloc/d2/f): %v", err)
	}
	// The layout's own directory is made again, empty.
	must(t, os.Mkdir(filepath.Join(a, "alloc/data"), 0o777))
	if got := names(t, filepath.Join(a, "alloc/data")); len(got) != 0 {
		t.Errorf("alloc/data made again holds %v", got)
	}
	// A file cannot take a renamed volume's name.
	wantErrno(t, "create alloc/d2", errOnly(os.OpenFile(filepath.Join(a, "alloc/d2"), os.O_CREATE|os.O_EXCL, 0o644)), syscall.EEXIST)

	// Into a task's directory and back, and over an empty volume.
	must(t, unix.Rename(filepath.Join(a, "alloc/d2"), filepath.Join(a, "web/d3")))
	must(t, unix.Rename(filepath.Join(a, "web/local"), filepath.Join(a, "web/l2")))
	must(t, unix.Rename(filepath.Join(a, "web/l2"), filepath.Join(a, "web/tmp")))
	for p, want := range map[string]string{"web/d3/f": "before after", "web/tmp/l": "local"} {
		if got, err := os.ReadFile(filepath.Join(a, p)); err != nil || string(got) != want {
			t.Errorf("%s: %q, %v; want %q", p, got, err, want)
		}
	}
	if got := names(t, filepath.Join(a, "web")); strings.Join(got, " ") != "alloc d3 private secrets tmp" {
		t.Errorf("web/ after the renames: %v", got)
	}
	// Onto a non-empty one, or a plain directory: refused, nothing
	// changed.
	must(t, os.Mkdir(filepath.Join(a, "web/plain"), 0o755))
	before := records(t, tm.store)
	wantErrno(t, "rename web/d3 web/tmp", unix.Rename(filepath.Join(a, "web/d3"), filepath.Join(a, "web/tmp")), syscall.ENOTEMPTY)
	wantErrno(t, "rename web/d3 web/plain", unix.Rename(filepath.Join(a, "web/d3"), filepath.Join(a, "web/plain")), syscall.EXDEV)
	if after := records(t, tm.store); after != before {
		t.Errorf("refused renames changed the store")
	}
	layers := layerDirs(t, tm.store)
	must(t, os.RemoveAll(a))
	for _, l := range layers {
		if _, err := os.Lstat(filepath.Join(tm.store.DataDir(), "layers", l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer %s outlived its allocation: %v", l, err)
		}
	}
}

// TestMountMoveRacesAWriter: a task of the previous allocation appends to
// its data while the Move happens; every byte it wrote is in the new
// allocation's file afterwards, as across a rename on ext4.
func TestMountMoveRacesAWriter(t *testing.T) {
	tm := newTestMount(t)
	prev, next := newAllocs(t, tm.dir)
	p := filepath.Join(prev, "alloc/data/f")
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	var wg sync.WaitGroup
	const writes = 2000
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range writes {
			if _, err := f.Write([]byte("0123456789")); err != nil {
				t.Errorf("a write during the move: %v", err)
				return
			}
		}
	}()
	os.Remove(filepath.Join(next, "alloc/data"))
	must(t, os.Rename(filepath.Join(prev, "alloc/data"), filepath.Join(next, "alloc/data")))
	wg.Wait()
	must(t, f.Close())
	if got, err := os.ReadFile(filepath.Join(next, "alloc/data/f")); err != nil || len(got) != writes*10 {
		t.Errorf("the new allocation's file: %d bytes, %v; want %d", len(got), err, writes*10)
	}
}

// TestMountsOnTopSurviveChanges: what Nomad mounts on the mount's
// directories (a tmpfs on secrets/, a bind of alloc/ onto a task's
// alloc/) stays mounted across the store changes that invalidate the
// kernel's entries: a chmod of alloc/, a task added, a Move into the
// allocation.
func TestMountsOnTopSurviveChanges(t *testing.T) {
	tm := newTestMount(t)
	prev, next := newAllocs(t, tm.dir, "web")
	secrets := filepath.Join(next, "web/secrets")
	must(t, unix.Mount("tmpfs", secrets, "tmpfs", unix.MS_NOEXEC, "size=1m"))
	t.Cleanup(func() { unix.Unmount(secrets, unix.MNT_DETACH) })
	must(t, os.WriteFile(filepath.Join(secrets, "token"), []byte("t"), 0o600))
	view := filepath.Join(next, "web/alloc")
	must(t, os.Mkdir(view, 0o777))
	must(t, unix.Mount(filepath.Join(next, "alloc"), view, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(view, unix.MNT_DETACH) })
	// An exec task's executor mounts dev/ and proc/ in the task's own
	// directory: entries of its volume, which no change of the record
	// touches.
	dev := filepath.Join(next, "web/dev")
	must(t, os.Mkdir(dev, 0o755))
	must(t, unix.Mount("tmpfs", dev, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { unix.Unmount(dev, unix.MNT_DETACH) })

	must(t, os.Chmod(filepath.Join(next, "alloc"), 0o777))
	must(t, os.Mkdir(filepath.Join(next, "db"), 0o777))
	os.Remove(filepath.Join(next, "alloc/data"))
	must(t, os.Rename(filepath.Join(prev, "alloc/data"), filepath.Join(next, "alloc/data")))
	// And a change through the API, which invalidates at once.
	if _, err := tm.store.Update("new", func(st *record.State) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(secrets, "token")); err != nil || string(got) != "t" {
		t.Errorf("the tmpfs on secrets/ after the changes: %q, %v", got, err)
	}
	for _, p := range []string{secrets, dev} {
		var sfs unix.Statfs_t
		if err := unix.Statfs(p, &sfs); err != nil || sfs.Type != unix.TMPFS_MAGIC {
			t.Errorf("%s is no longer the tmpfs: %#x, %v", p, sfs.Type, err)
		}
	}
	must(t, os.WriteFile(filepath.Join(next, "alloc/data/g"), []byte("g"), 0o644))
	if got, err := os.ReadFile(filepath.Join(view, "data/g")); err != nil || string(got) != "g" {
		t.Errorf("the bind of alloc/ after the changes: %q, %v", got, err)
	}
}
