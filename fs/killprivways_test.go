package fs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"golang.org/x/sys/unix"
)

// killprivWriterEnv runs TestKillprivWriter as the writer of
// TestKillprivEveryWay: "<uid>:<gid>", with one "<way> <path> <source>"
// per line on its standard input.
const killprivWriterEnv = "ALLOCFS_KILLPRIV_WRITER"

// killprivWays are the ways data reaches a file, as the writer process
// runs them: each opens path itself.
var killprivWays = map[string]func(path, src string) error{
	"write": func(p, _ string) error {
		return withFd(p, unix.O_WRONLY, func(fd int) error { _, err := unix.Write(fd, []byte("x")); return err })
	},
	"pwrite": func(p, _ string) error {
		return withFd(p, unix.O_WRONLY, func(fd int) error { _, err := unix.Pwrite(fd, []byte("x"), 8192); return err })
	},
	"append": func(p, _ string) error {
		return withFd(p, unix.O_WRONLY|unix.O_APPEND, func(fd int) error { _, err := unix.Write(fd, []byte("x")); return err })
	},
	// A shared mapping, written and flushed by msync, by fsync, or by
	// nothing but munmap and close.
	"mmap+msync":  func(p, _ string) error { return mapWrite(p, "msync") },
	"mmap+fsync":  func(p, _ string) error { return mapWrite(p, "fsync") },
	"mmap+munmap": func(p, _ string) error { return mapWrite(p, "") },
	"truncate":    func(p, _ string) error { return unix.Truncate(p, 1) },
	"ftruncate": func(p, _ string) error {
		return withFd(p, unix.O_WRONLY, func(fd int) error { return unix.Ftruncate(fd, 1) })
	},
	"o_trunc": func(p, _ string) error { return withFd(p, unix.O_WRONLY|unix.O_TRUNC, func(int) error { return nil }) },
	"fallocate": func(p, _ string) error {
		return withFd(p, unix.O_WRONLY, func(fd int) error { return unix.Fallocate(fd, 0, 0, 16384) })
	},
	"copy_file_range": func(p, src string) error {
		in, err := unix.Open(src, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(in)
		return withFd(p, unix.O_WRONLY, func(fd int) error {
			var off int64
			_, err := unix.CopyFileRange(in, nil, fd, &off, 100, 0)
			return err
		})
	},
}

func withFd(p string, flags int, fn func(fd int) error) error {
	fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	if err := fn(fd); err != nil {
		unix.Close(fd)
		return err
	}
	return unix.Close(fd)
}

func mapWrite(p, flush string) error {
	return withFd(p, unix.O_RDWR, func(fd int) error {
		m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return err
		}
		copy(m, "mapped")
		switch flush {
		case "msync":
			err = unix.Msync(m, unix.MS_SYNC)
		case "fsync":
			err = unix.Fsync(fd)
		}
		if uerr := unix.Munmap(m); err == nil {
			err = uerr
		}
		return err
	})
}

// TestKillprivWriter is the writer of TestKillprivEveryWay: a helper
// process, skipped when run directly.
func TestKillprivWriter(t *testing.T) {
	spec := os.Getenv(killprivWriterEnv)
	if spec == "" {
		t.Skip("helper process of TestKillprivEveryWay")
	}
	var uid, gid int
	if _, err := fmt.Sscanf(spec, "%d:%d", &uid, &gid); err != nil {
		t.Fatalf("%s=%q: %v", killprivWriterEnv, spec, err)
	}
	// The binary may lie where only root can reach it: it drops to the
	// writer's identity once started, as TestDifferentialChild does.
	if uid != 0 {
		must(t, syscall.Setgroups(nil))
		must(t, syscall.Setresgid(gid, gid, gid))
		must(t, syscall.Setresuid(uid, uid, uid))
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if err := killprivWays[f[0]](f[1], f[2]); err != nil {
			t.Errorf("%s of %s as uid %d: %v", f[0], f[1], os.Getuid(), err)
		}
	}
	must(t, sc.Err())
}

// TestKillprivEveryWay: for every way data reaches a file (write,
// pwrite, append, a shared mapping flushed by msync, fsync or munmap,
// truncate, ftruncate, O_TRUNC, fallocate, copy_file_range), written by
// root (who has CAP_FSETID), by the file's unprivileged owner and by
// another uid with write access, the set-id bits a file keeps are the
// ones ext4 keeps, through the mount and in the layer; in a plain volume
// and for a file in the lower layer of a snapshot-migrated one, whose
// write copies it up first. The writer is a process of its own with the
// identity given, and the reference is a directory of the backing ext4.
func TestKillprivEveryWay(t *testing.T) {
	nobody := allocdir.Nobody()
	if nobody == nil {
		fstest.Lacks(t, "no user nobody to own the files")
	}
	tm, vol, native := setidSides(t)
	// copy_file_range copies from a file beside the target: one in
	// another filesystem is EXDEV on a FUSE mount.
	source := func(dir string) {
		must(t, os.WriteFile(filepath.Join(dir, "source"), bytes.Repeat([]byte("s"), 100), 0o644))
	}
	source(vol)
	source(native)
	writers := []struct {
		name     string
		uid, gid int
		modes    []uint32
	}{
		{"root", 0, 0, []uint32{0o4755, 0o2755, 0o6755, 0o6777}},
		{"owner", nobody.UID, nobody.GID, []uint32{0o4755, 0o2755, 0o6755, 0o2745, 0o6644, 0o6777}},
		{"other", 4321, 4321, []uint32{0o6777, 0o4777, 0o2777, 0o2767, 0o6766}},
	}
	type kase struct {
		way, writer, name string
		mode              uint32
	}
	var cases []kase
	// The lower layer: the same files, made in allocation "old", whose
	// volume a snapshot migration stacks under "new".
	lower := snapshotVolume(t, tm, func(old string) {
		source(old)
		for way := range killprivWays {
			for _, w := range writers {
				for _, mode := range w.modes {
					name := fmt.Sprintf("%s-%s-%04o", way, w.name, mode)
					makeSetidFile(t, filepath.Join(old, name), nobody, mode)
				}
			}
		}
	})
	for way := range killprivWays {
		for _, w := range writers {
			for _, mode := range w.modes {
				name := fmt.Sprintf("%s-%s-%04o", way, w.name, mode)
				for _, dir := range []string{vol, native} {
					makeSetidFile(t, filepath.Join(dir, name), nobody, mode)
				}
				cases = append(cases, kase{way, w.name, name, mode})
			}
		}
	}
	ids := map[string]string{}
	for _, w := range writers {
		ids[w.name] = fmt.Sprintf("%d:%d", w.uid, w.gid)
	}
	// One writer process per identity, for every case and side: a
	// process per write would take a second each under the race
	// detector.
	jobs := map[string]*strings.Builder{}
	for _, c := range cases {
		if jobs[c.writer] == nil {
			jobs[c.writer] = &strings.Builder{}
		}
		for _, dir := range []string{native, vol, lower} {
			fmt.Fprintf(jobs[c.writer], "%s %s %s\n", c.way, filepath.Join(dir, c.name), filepath.Join(dir, "source"))
		}
	}
	for writer, job := range jobs {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestKillprivWriter$", "-test.count", "1")
		cmd.Env = append(os.Environ(), killprivWriterEnv+"="+ids[writer])
		cmd.Stdin = strings.NewReader(job.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the writes as %s: %v\n%s", writer, err, out)
		}
	}
	st, err := tm.store.Get("a")
	must(t, err)
	upper := tm.store.LayerPath(st.Volumes["alloc/data"].Upper)
	newSt, err := tm.store.Get("new")
	must(t, err)
	newUpper := tm.store.LayerPath(newSt.Volumes["alloc/data"].Upper)
	killed := 0
	for _, c := range cases {
		want := modeOf(t, filepath.Join(native, c.name))
		for _, side := range []struct{ what, shown, backing string }{
			{"a plain volume", filepath.Join(vol, c.name), filepath.Join(upper, c.name)},
			{"a lower layer", filepath.Join(lower, c.name), filepath.Join(newUpper, c.name)},
		} {
			if got := modeOf(t, side.shown); got != want {
				t.Errorf("%s of %s by %s in %s: %s through the mount, %s on ext4", c.way, c.name, c.writer, side.what, got, want)
			}
			if got := modeOf(t, side.backing); got != want {
				t.Errorf("%s of %s by %s in %s: the layer holds %s, ext4 %s", c.way, c.name, c.writer, side.what, got, want)
			}
			if got, want := readAll(t, side.shown), readAll(t, filepath.Join(native, c.name)); !bytes.Equal(got, want) {
				t.Errorf("%s of %s by %s in %s: the data differs from ext4's", c.way, c.name, c.writer, side.what)
			}
		}
		if !strings.HasSuffix(want, fmt.Sprintf("mode %04o", c.mode)) {
			killed++
		}
	}
	// The rule is the kernel's: the reference must have cleared bits in
	// some cases and kept them in others, or the comparison says nothing.
	if killed == 0 || killed == len(cases) {
		t.Fatalf("ext4 cleared set-id bits in %d of %d cases: the test's premise is wrong", killed, len(cases))
	}
}

// makeSetidFile makes p, 4 KiB owned by nobody, with mode.
func makeSetidFile(t *testing.T, p string, nobody *allocdir.Owner, mode uint32) {
	t.Helper()
	must(t, os.WriteFile(p, append([]byte("#!/bin/sh\n"), make([]byte, 4086)...), 0o600))
	must(t, os.Lchown(p, nobody.UID, nobody.GID))
	must(t, unix.Chmod(p, mode))
}

func readAll(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
