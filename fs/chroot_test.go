package fs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// hostTree makes a small host tree for a chroot environment and returns
// its root: bin/ with a program, etc/ with a nested directory, a symbolic
// link leading out of it and a file only root may read, and a lone file.
func hostTree(t *testing.T) string {
	t.Helper()
	h := filepath.Join(t.TempDir(), "host")
	for _, d := range []string{"bin", "etc/ssl/certs", "usr/lib"} {
		must(t, os.MkdirAll(filepath.Join(h, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(h, "bin/tool"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(h, "etc/ssl/certs/ca.pem"), []byte("certificate"), 0o644))
	must(t, os.WriteFile(filepath.Join(h, "etc/shadow"), []byte("secret"), 0o600))
	must(t, os.Symlink("/root/.ssh/id_rsa", filepath.Join(h, "etc/evil")))
	must(t, os.WriteFile(filepath.Join(h, "resolv.conf"), []byte("nameserver 10.0.0.1\n"), 0o644))
	must(t, os.Symlink("usr/lib", filepath.Join(h, "lib")))
	return h
}

// treeSum is a digest of every name, mode, owner and byte of the tree at
// root, for "the host is as it was".
func treeSum(t *testing.T, root string) string {
	t.Helper()
	h := sha256.New()
	must(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		h.Write([]byte(rel))
		h.Write([]byte{byte(st.Mode), byte(st.Mode >> 8), byte(st.Mode >> 16), byte(st.Uid), byte(st.Gid)})
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			h.Write(b)
		}
		return nil
	}))
	return hex.EncodeToString(h.Sum(nil))
}

// chrootMount is a mount whose chroot environment is the host tree h:
// h/bin at /bin, h/etc at /etc, the lone file at /etc/resolv.conf... (a
// file entry), h/lib (a link to usr/lib) at /lib, and a path the host
// lacks.
func chrootMount(t *testing.T, h string) *testMount {
	t.Helper()
	return newTestMountTuned(t, store.Options{}, func(o *MountOptions) {
		o.ChrootEnv = map[string]string{
			filepath.Join(h, "bin"):         "/bin",
			filepath.Join(h, "etc"):         "/etc",
			filepath.Join(h, "resolv.conf"): "/run/resolvconf/resolv.conf",
			filepath.Join(h, "lib"):         "/lib",
			filepath.Join(h, "missing"):     "/missing",
		}
	})
}

// nomadTask makes, as Nomad's client does through the mount, allocation
// a1 and task's directory, given to nobody as Nomad's Build does, with
// the directories Nomad makes in it (nomadTaskDirs).
func nomadTask(t *testing.T, tm *testMount, task string) string {
	t.Helper()
	a := filepath.Join(tm.dir, "a1")
	if _, err := os.Lstat(a); errors.Is(err, os.ErrNotExist) {
		must(t, os.Mkdir(a, 0o755))
	}
	d := filepath.Join(a, task)
	must(t, os.Mkdir(d, 0o777))
	must(t, os.Chmod(d, 0o777))
	must(t, os.Chown(d, 65534, 65534))
	nomadTaskDirs(t, d)
	return d
}

// nomadTaskDirs makes in the task directory d what Nomad's task runner
// makes there before a driver runs: local/, tmp/, secrets/ and private/
// (a task directory starts empty, as on a local filesystem).
func nomadTaskDirs(t testing.TB, d string) {
	t.Helper()
	for _, c := range []struct {
		name string
		mode os.FileMode
	}{{"local", 0o777}, {"tmp", 0o777 | os.ModeSticky}, {"secrets", 0o777}, {"private", 0o777}} {
		must(t, os.Mkdir(filepath.Join(d, c.name), 0o777))
		must(t, os.Chmod(filepath.Join(d, c.name), c.mode))
	}
}

// names lists dir.
func names(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	must(t, err)
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
}

// TestMountChrootOnlyWhereNomadBuildsOne: a task directory shows the
// chroot environment once Nomad starts building a chroot in it (the chown
// of the empty directory to root), and from then on for good, a restart
// of the mount included; a raw_exec-like task directory, one its task
// wrote into first, and a task of an allocation made through the API
// never do.
func TestMountChrootOnlyWhereNomadBuildsOne(t *testing.T) {
	h := hostTree(t)
	tm := chrootMount(t, h)
	exec := nomadTask(t, tm, "exec")
	exec2 := nomadTask(t, tm, "exec2")
	raw := nomadTask(t, tm, "raw")
	written := nomadTask(t, tm, "written")
	// A directory made at the allocation's root and given to root, with
	// nothing Nomad makes in a task's: a plain one (pjdfstest does this).
	bare := filepath.Join(tm.dir, "a1", "bare")
	must(t, os.Mkdir(bare, 0o755))
	must(t, os.Chown(bare, 0, 0))
	if got := names(t, bare); len(got) != 0 {
		t.Errorf("a directory without local/ given to root shows %v, want nothing", got)
	}
	layout := []string{"local", "private", "secrets", "tmp"}
	if got := names(t, exec); strings.Join(got, " ") != strings.Join(layout, " ") {
		t.Fatalf("a task directory before the chroot build: %v, want only %v", got, layout)
	}
	must(t, os.WriteFile(filepath.Join(written, "mine"), []byte("x"), 0o644))
	for _, d := range []string{exec, exec2, raw, written} {
		if d != raw {
			must(t, os.Chown(d, 0, 0))
		}
	}
	// Two chroots of one allocation show the same host files, each its
	// own nodes.
	for _, d := range []string{exec, exec2} {
		if got, err := os.ReadFile(filepath.Join(d, "bin/tool")); err != nil || !strings.Contains(string(got), "echo tool") {
			t.Errorf("%s/bin/tool: %q, %v", d, got, err)
		}
		must(t, os.Chown(filepath.Join(d, "etc/ssl"), 4321, 4321))
	}
	if a, b := lstatT(t, filepath.Join(exec, "etc/ssl/certs")), lstatT(t, filepath.Join(exec2, "etc/ssl/certs")); a.Ino == b.Ino {
		t.Errorf("two chroots show etc/ssl/certs with one inode number %#x", a.Ino)
	}
	want := append([]string{"bin", "etc", "lib"}, layout...)
	want = append(want, "run")
	sort.Strings(want)
	if got := names(t, exec); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the chroot's task directory: %v, want %v", got, want)
	}
	for _, d := range []string{raw, written} {
		if _, err := os.Lstat(filepath.Join(d, "bin")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s shows the host's bin/: %v", d, err)
		}
	}
	if got, err := os.ReadFile(filepath.Join(exec, "bin/tool")); err != nil || !strings.Contains(string(got), "echo tool") {
		t.Errorf("bin/tool in the chroot: %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(exec, "run/resolvconf/resolv.conf")); err != nil || string(got) != "nameserver 10.0.0.1\n" {
		t.Errorf("a file entry in the chroot: %q, %v", got, err)
	}
	// A host symbolic link is shown as one; the daemon never follows it.
	if target, err := os.Readlink(filepath.Join(exec, "etc/evil")); err != nil || target != "/root/.ssh/id_rsa" {
		t.Errorf("etc/evil: %q, %v; want the host's link as it is", target, err)
	}
	// An entry that is a link on the host shows what it leads to, as
	// Nomad's own os.Stat of the source sees it.
	if fi, err := os.Lstat(filepath.Join(exec, "lib")); err != nil || !fi.IsDir() {
		t.Errorf("lib (a link to usr/lib on the host): %v, %v; want a directory", fi, err)
	}
	if _, err := os.Lstat(filepath.Join(exec, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an entry the host lacks: %v, want none", err)
	}
	if !mustState(t, tm.store, "a1").IsChroot("exec") {
		t.Errorf("the record does not say exec builds a chroot")
	}

	// An allocation made through the API never shows it.
	if _, err := tm.store.Create("api", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	web := filepath.Join(tm.dir, "api/web")
	must(t, os.Chown(web, 0, 0))
	if _, err := os.Lstat(filepath.Join(web, "bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a task of an API allocation shows the host's bin/: %v", err)
	}

	// A new mount of the same store shows it again.
	must(t, tm.mount.Unmount())
	m, err := NewMount(testLogger(t), tm.store, tm.dir, MountOptions{StableTimeout: tm.mount.opts.StableTimeout, ChrootEnv: tm.mount.opts.ChrootEnv})
	must(t, err)
	t.Cleanup(func() { m.Unmount() })
	if got, err := os.ReadFile(filepath.Join(exec, "etc/ssl/certs/ca.pem")); err != nil || string(got) != "certificate" {
		t.Errorf("the chroot after a new mount: %q, %v", got, err)
	}
}

// TestMountChrootNeverWritesTheHost: every change in a chroot, by a task
// or by Nomad, copies up into the task's layer; the host tree stays as it
// was, byte for byte, mode and owner.
func TestMountChrootNeverWritesTheHost(t *testing.T) {
	h := hostTree(t)
	before := treeSum(t, h)
	tm := chrootMount(t, h)
	exec := nomadTask(t, tm, "exec")
	must(t, os.Chown(exec, 0, 0))
	must(t, os.WriteFile(filepath.Join(exec, "bin/tool"), []byte("replaced"), 0o755))
	must(t, os.Chmod(filepath.Join(exec, "etc/ssl"), 0o700))
	must(t, os.Chown(filepath.Join(exec, "etc/ssl/certs"), 4321, 4321))
	must(t, os.Remove(filepath.Join(exec, "etc/shadow")))
	must(t, os.Rename(filepath.Join(exec, "etc/ssl/certs/ca.pem"), filepath.Join(exec, "etc/ca.pem")))
	must(t, os.WriteFile(filepath.Join(exec, "etc/new"), []byte("new"), 0o644))
	must(t, os.RemoveAll(filepath.Join(exec, "lib")))
	if got, err := os.ReadFile(filepath.Join(exec, "bin/tool")); err != nil || string(got) != "replaced" {
		t.Errorf("bin/tool after a write: %q, %v", got, err)
	}
	if _, err := os.Lstat(filepath.Join(exec, "etc/shadow")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("etc/shadow after its unlink: %v", err)
	}
	if after := treeSum(t, h); after != before {
		t.Errorf("the host tree changed under the chroot's writes")
	}
	if _, err := os.Lstat(filepath.Join(tm.store.LayerPath(mustState(t, tm.store, "a1").Volumes["exec"].Upper), "bin/tool")); err != nil {
		t.Errorf("the write did not land in the task's layer: %v", err)
	}
}

// TestHostEntriesRefuseBadConfigs: a chroot environment that would show
// the host's root, put one entry inside another or replace the task
// directory is refused with the entries named; an entry the host lacks is
// left out, as Nomad leaves it out.
func TestHostEntriesRefuseBadConfigs(t *testing.T) {
	h := hostTree(t)
	for name, env := range map[string]map[string]string{
		"the host's root":         {"/": "/host"},
		"an entry inside another": {filepath.Join(h, "etc"): "/etc", filepath.Join(h, "bin"): "/etc/bin"},
		"the same place twice":    {filepath.Join(h, "etc"): "/etc", filepath.Join(h, "bin"): "/etc"},
		"the task directory":      {filepath.Join(h, "etc"): "/"},
	} {
		tm := newTestMount(t)
		if _, err := NewMount(testLogger(t), tm.store, t.TempDir(), MountOptions{ChrootEnv: env}); !errors.Is(err, layer.ErrChrootEntry) {
			t.Errorf("%s: NewMount: %v, want a refusal of the chroot entry", name, err)
		}
	}
}

// TestMountExecsLowerFiles: a program the mount shows from a layer below
// the volume's own (a chroot's host file, a snapshot migration's lower
// layer) runs; execve's open carries the kernel's FMODE_EXEC, which no
// backing open may pass on.
func TestMountExecsLowerFiles(t *testing.T) {
	h := hostTree(t)
	tm := chrootMount(t, h)
	box := nomadTask(t, tm, "box")
	must(t, os.Chown(box, 0, 0))
	if out, err := execFromDisk(filepath.Join(box, "bin/tool")).CombinedOutput(); err != nil || string(out) != "tool\n" {
		t.Errorf("a host program in a chroot task: %q, %v", out, err)
	}

	prev, next := migrationFixture(t, tm)
	must(t, os.WriteFile(filepath.Join(tm.dir, prev, "alloc/data/run.sh"), []byte("#!/bin/sh\necho migrated\n"), 0o755))
	if n, err := tm.store.Migrate(prev, next, migratedKeys, store.MigrationSnapshot); err != nil || n != 2 {
		t.Fatalf("Seal: %d volumes, %v; want 2", n, err)
	}
	for _, id := range []string{prev, next} {
		if out, err := execFromDisk(filepath.Join(tm.dir, id, "alloc/data/run.sh")).CombinedOutput(); err != nil || string(out) != "migrated\n" {
			t.Errorf("a migrated program in %s's alloc/data: %q, %v", id, out, err)
		}
	}
}

// execFromDisk runs the program at path, a file of this process's own
// mount, through a shell that execs it. Go starts a child with vfork: the
// parent's thread waits, in a raw syscall the runtime counts as running,
// until the child's execve is done; an execve of a file on the mount
// needs the mount's handlers, and a handler that allocates during a
// garbage collection waits for that thread to stop. The shell is on disk,
// so the vfork ends at once and the program's execve is the shell's.
func execFromDisk(path string) *exec.Cmd {
	return exec.Command("/bin/sh", "-c", `exec "$0"`, path)
}

// TestMountRemovalKeepsLinkCounts: removing, one by one, the entries of a
// directory shown from a lower layer (Nomad's os.RemoveAll of a chroot)
// leaves the directory's link count right after every removal: two, and
// one per subdirectory left.
func TestMountRemovalKeepsLinkCounts(t *testing.T) {
	h := hostTree(t)
	for i := range 6 {
		must(t, os.Mkdir(filepath.Join(h, "etc", fmt.Sprintf("d%d", i)), 0o755))
		must(t, os.WriteFile(filepath.Join(h, "etc", fmt.Sprintf("f%d", i)), nil, 0o644))
	}
	tm := chrootMount(t, h)
	box := nomadTask(t, tm, "box")
	must(t, os.Chown(box, 0, 0))
	etc := filepath.Join(box, "etc")
	// A filesystem that counts no subdirectories in a directory's links
	// (btrfs: always 1) has the mount count none either.
	counts := lstatT(t, t.TempDir()).Nlink != 1
	for _, name := range names(t, etc) {
		if name == "ssl" {
			must(t, os.RemoveAll(filepath.Join(etc, name)))
		} else {
			must(t, os.Remove(filepath.Join(etc, name)))
		}
		dirs := 0
		for _, e := range names(t, etc) {
			if fi, err := os.Lstat(filepath.Join(etc, e)); err == nil && fi.IsDir() {
				dirs++
			}
		}
		var st unix.Stat_t
		must(t, unix.Lstat(etc, &st))
		want := 2 + dirs
		if !counts {
			want = 1
		}
		if int(st.Nlink) != want {
			t.Errorf("etc/ after removing %s: nlink %d, want %d", name, st.Nlink, want)
		}
	}
	must(t, os.Remove(etc))
}

// TestReadSideShowsTheChroot: the API's read side (List, Stat, ReadAt)
// shows a chroot task's host files below its own, as the mount does, and
// a task directory without a chroot shows none; a link in the host tree
// that leads out of the allocation is not followed.
func TestReadSideShowsTheChroot(t *testing.T) {
	h := hostTree(t)
	tm := chrootMount(t, h)
	box := nomadTask(t, tm, "box")
	must(t, os.Chown(box, 0, 0))
	nomadTask(t, tm, "raw")
	must(t, os.WriteFile(filepath.Join(box, "etc/mine"), []byte("the task's"), 0o644))
	ad := NewAllocDir(tm.mount.logger, tm.store, tm.mount, tm.dir, "a1")
	list := func(p string) []string {
		t.Helper()
		infos, err := ad.List(p)
		must(t, err)
		var out []string
		for _, fi := range infos {
			out = append(out, fi.Name)
		}
		sort.Strings(out)
		return out
	}
	if got, want := list("box/etc"), names(t, filepath.Join(box, "etc")); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("List(box/etc): %v; the mount shows %v", got, want)
	}
	for _, p := range []string{"box/bin", "box/etc/ssl/certs/ca.pem", "box/run/resolvconf/resolv.conf"} {
		if _, err := ad.Stat(p); err != nil {
			t.Errorf("Stat(%s): %v", p, err)
		}
	}
	for p, want := range map[string]string{"box/etc/ssl/certs/ca.pem": "certificate", "box/etc/mine": "the task's", "box/bin/tool": "#!/bin/sh\necho tool\n"} {
		r, err := ad.ReadAt(p, 0)
		if err != nil {
			t.Errorf("ReadAt(%s): %v", p, err)
			continue
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if string(b) != want {
			t.Errorf("ReadAt(%s): %q, want %q", p, b, want)
		}
	}
	if r, err := ad.ReadAt("box/etc/evil", 0); err == nil {
		b, _ := io.ReadAll(r)
		r.Close()
		t.Errorf("ReadAt of a host link leading out of the allocation: %q, want a refusal", b)
	}
	for _, name := range list("raw") {
		if name == "bin" || name == "etc" {
			t.Errorf("a task directory without a chroot lists %s", name)
		}
	}
}

// TestMountChrootTornDownByNomadsGC: Nomad's Destroy removes a chroot
// task's secrets/ and private/, then os.RemoveAll's the allocation. Once
// both are gone, the task directory shows its own layer alone, so the
// walk removes no host entry (the layer gets no whiteout for one), and
// the allocation and every layer of it go.
func TestMountChrootTornDownByNomadsGC(t *testing.T) {
	h := hostTree(t)
	tm := chrootMount(t, h)
	exec := nomadTask(t, tm, "exec")
	must(t, os.Chown(exec, 0, 0))
	must(t, os.WriteFile(filepath.Join(exec, "executor.out"), []byte("log"), 0o644))
	must(t, os.Mkdir(filepath.Join(exec, "dev"), 0o755))
	if _, err := os.Lstat(filepath.Join(exec, "bin/tool")); err != nil {
		t.Fatalf("the chroot before Nomad's GC: %v", err)
	}
	// Nomad's build chowns what it re-creates: etc/ssl/certs, and the
	// directories above it, are the task's own from then on.
	must(t, os.Chown(filepath.Join(exec, "etc/ssl/certs"), 4321, 4321))
	st := mustState(t, tm.store, "a1")
	must(t, os.Remove(filepath.Join(exec, "secrets")))
	if !mustState(t, tm.store, "a1").IsChroot("exec") {
		t.Errorf("the task is no chroot any more once its secrets/ alone went")
	}
	must(t, os.Remove(filepath.Join(exec, "private")))
	if mustState(t, tm.store, "a1").IsChroot("exec") {
		t.Errorf("the task is still a chroot after Nomad removed its secrets/ and private/")
	}
	want := []string{"dev", "etc", "executor.out", "local", "tmp"}
	if got := names(t, exec); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the task directory Nomad tears down: %v, want its own entries %v", got, want)
	}
	if got := names(t, filepath.Join(exec, "etc/ssl")); strings.Join(got, " ") != "certs" {
		t.Errorf("etc/ssl of the task directory Nomad tears down: %v, want its own certs/ alone", got)
	}
	before := tm.mount.RequestCounts()["UNLINK"]
	must(t, os.RemoveAll(filepath.Join(tm.dir, "a1")))
	// executor.out is the one file left to unlink.
	if n := tm.mount.RequestCounts()["UNLINK"] - before; n != 1 {
		t.Errorf("os.RemoveAll of the allocation unlinked %d entries, want 1: the task's own file alone", n)
	}
	if _, err := tm.store.Get("a1"); err == nil {
		t.Errorf("a1 is still in the store after os.RemoveAll")
	}
	for l := range st.LayerIDs() {
		if _, err := os.Lstat(tm.store.LayerPath(l)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("layer %s is still there: %v", l, err)
		}
	}
}

// TestMountChrootRemovalLeavesNoWhiteouts: Nomad's GC of a chroot
// (os.RemoveAll, one unlink at a time) removes each host entry with a
// record in its task layer's removal log, not a whiteout: every entry is
// gone once unlinked, from the mount and the read side alike, each
// directory emptied so is removed, the task's layer holds no whiteout
// and no directory copied up for one, a new mount of the store shows the
// same, a name made again shows the task's own entry alone, an fsync of
// the directory succeeds, and the allocation's removal takes the log with
// it.
func TestMountChrootRemovalLeavesNoWhiteouts(t *testing.T) {
	h := hostTree(t)
	for i := range 20 {
		must(t, os.MkdirAll(filepath.Join(h, "etc", fmt.Sprintf("d%d", i), "sub"), 0o755))
		must(t, os.WriteFile(filepath.Join(h, "etc", fmt.Sprintf("d%d", i), "sub", "f"), nil, 0o644))
		must(t, os.WriteFile(filepath.Join(h, "etc", fmt.Sprintf("f%d", i)), nil, 0o644))
	}
	before := treeSum(t, h)
	tm := chrootMount(t, h)
	box := nomadTask(t, tm, "box")
	must(t, os.Chown(box, 0, 0))
	etc := filepath.Join(box, "etc")
	// etc/ merges the task's file with the host's; bin/ is the host's.
	must(t, os.WriteFile(filepath.Join(etc, "mine"), []byte("the task's"), 0o644))

	must(t, os.Remove(filepath.Join(etc, "f0")))
	if _, err := os.Lstat(filepath.Join(etc, "f0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("etc/f0 after its unlink: %v", err)
	}
	must(t, os.RemoveAll(filepath.Join(etc, "d0")))
	must(t, os.RemoveAll(filepath.Join(box, "bin")))
	for _, name := range names(t, etc) {
		if name == "f0" || name == "d0" {
			t.Errorf("etc/ lists %s after its removal", name)
		}
	}
	if slices.Contains(names(t, box), "bin") {
		t.Error("the task directory lists bin/ after its removal")
	}
	d, err := os.Open(etc)
	must(t, err)
	must(t, d.Sync())
	must(t, d.Close())

	st, err := tm.store.View("a1")
	must(t, err)
	upper := tm.store.LayerPath(st.Volumes["box"].Upper)
	must(t, filepath.WalkDir(upper, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type()&fs.ModeCharDevice != 0 {
			t.Errorf("the task's layer holds a whiteout: %s", p)
		}
		if rel, _ := filepath.Rel(upper, p); rel == "bin" || strings.HasPrefix(rel, "etc/d0") {
			t.Errorf("the task's layer holds %s, copied up for a removal", rel)
		}
		return nil
	}))

	ad := NewAllocDir(tm.mount.logger, tm.store, tm.mount, tm.dir, "a1")
	for _, p := range []string{"box/bin", "box/bin/tool", "box/etc/f0", "box/etc/d0/sub/f"} {
		if _, err := ad.Stat(p); err == nil {
			t.Errorf("the read side shows %s after its removal", p)
		}
	}
	infos, err := ad.List("box/etc")
	must(t, err)
	var listed []string
	for _, fi := range infos {
		listed = append(listed, fi.Name)
	}
	sort.Strings(listed)
	if want := names(t, etc); strings.Join(listed, " ") != strings.Join(want, " ") {
		t.Errorf("the read side lists box/etc as %v; the mount as %v", listed, want)
	}

	// A new mount of the store reads the removals back.
	shown := names(t, etc)
	must(t, tm.mount.Unmount())
	m, err := NewMount(testLogger(t), tm.store, tm.dir, MountOptions{StableTimeout: tm.mount.opts.StableTimeout, ChrootEnv: tm.mount.opts.ChrootEnv})
	must(t, err)
	t.Cleanup(func() { m.Unmount() })
	if got := names(t, etc); strings.Join(got, " ") != strings.Join(shown, " ") {
		t.Errorf("etc/ after a new mount: %v, before it %v", got, shown)
	}
	if _, err := os.Lstat(filepath.Join(box, "bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("bin/ after a new mount: %v", err)
	}

	// Made again, a name shows the task's entry alone.
	must(t, os.Mkdir(filepath.Join(box, "bin"), 0o755))
	if got := names(t, filepath.Join(box, "bin")); len(got) != 0 {
		t.Errorf("bin/ made again after its removal lists %v", got)
	}
	must(t, os.WriteFile(filepath.Join(etc, "f0"), []byte("new"), 0o644))
	if got, err := os.ReadFile(filepath.Join(etc, "f0")); err != nil || string(got) != "new" {
		t.Errorf("etc/f0 made again: %q, %v", got, err)
	}

	// Nomad's GC of the allocation.
	must(t, os.RemoveAll(filepath.Join(tm.dir, "a1")))
	if _, err := os.Lstat(filepath.Join(tm.dir, "a1")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the allocation after its removal: %v", err)
	}
	logs, err := os.ReadDir(filepath.Join(tm.store.ChrootDir(), removedDirName))
	must(t, err)
	for _, l := range logs {
		if _, err := os.Lstat(tm.store.LayerPath(l.Name())); errors.Is(err, os.ErrNotExist) {
			t.Errorf("the removal log of layer %s outlived it", l.Name())
		}
	}
	if got := treeSum(t, h); got != before {
		t.Error("the host tree changed")
	}
}

// TestChrootNodesResolveForATakeover: a daemon taking the mount over
// finds, from the node IDs the kernel holds, the host files a chroot
// task directory shows: below a directory entry, and a file entry itself
// (a lone binary as /bin/sh: the exe of the task's shell, executed again
// for every applet it runs).
func TestChrootNodesResolveForATakeover(t *testing.T) {
	h := hostTree(t)
	tm := chrootMount(t, h)
	box := nomadTask(t, tm, "box")
	must(t, os.Chown(box, 0, 0))
	rels := []string{"run/resolvconf/resolv.conf"}
	// An entry below a directory of the chroot_env is opened by a handle
	// made of its inode number, which is the handle of ext4 and xfs
	// alone (btrfs's carries its subvolume and generation).
	var fs unix.Statfs_t
	must(t, unix.Statfs(h, &fs))
	if fs.Type == unix.EXT4_SUPER_MAGIC || fs.Type == unix.XFS_SUPER_MAGIC {
		rels = append(rels, "bin/tool")
	} else {
		t.Logf("the host tree is on a filesystem of type %#x: only the file entry's node is resolved", fs.Type)
	}
	for _, rel := range rels {
		var st unix.Stat_t
		must(t, unix.Stat(filepath.Join(box, rel), &st))
		paths, errno := tm.mount.pathsOfNode(st.Ino)
		want := strings.Join(append([]string{"a1", "box"}, strings.Split(rel, "/")...), "/")
		found := false
		for _, p := range paths {
			found = found || strings.Join(p, "/") == want
		}
		if errno != 0 || !found {
			t.Errorf("the node of box/%s (%#x): %v, %v; want %s among them", rel, st.Ino, paths, errno, want)
		}
	}
}
