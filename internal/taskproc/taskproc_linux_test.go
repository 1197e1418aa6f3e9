//go:build linux

package taskproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/internal/mountinfo"
)

// TestReadOwnCgroup: the cgroup v2 path is the "0::" line, on a unified
// or a hybrid host; a v1-only host, or a cgroup outside the reader's
// namespace, is refused.
func TestReadOwnCgroup(t *testing.T) {
	cases := []struct {
		name, file, want string
		ok               bool
	}{
		{"unified", "0::/system.slice/nomad.service\n", "/system.slice/nomad.service", true},
		{"hybrid", "4:memory:/process_api/98b2\n1:cpu:/\n0::/\n", "/", true},
		{"v1 only", "9:name=systemd:/user.slice\n4:memory:/user.slice\n", "", false},
		{"outside the namespace", "0::/../../other\n", "", false},
		{"removed", "0::/gone (deleted)\n", "", false},
		{"empty", "", "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "cgroup")
			if err := os.WriteFile(file, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := readOwnCgroup(file)
			if (err == nil) != c.ok || got != c.want {
				t.Errorf("got %q, %v; want %q (ok %v)", got, err, c.want, c.ok)
			}
		})
	}
	if _, err := readOwnCgroup(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Errorf("a missing file: got no error")
	}
}

// TestCgroupDir: own cgroup is found below the cgroup2 mount that holds
// it: /sys/fs/cgroup on a unified host, the "unified" mount of a hybrid
// one, a container's own subtree mounted at its root; v1 mounts are
// ignored, and a cgroup that no mount reaches is refused.
func TestCgroupDir(t *testing.T) {
	root := t.TempDir()
	mkcg := func(dirs ...string) {
		for _, d := range dirs {
			if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, d, "cgroup.procs"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	mkcg("unified", "unified/user.slice", "v1mem/user.slice", "container", "container/job")
	mount := func(fsType, root_, at string) mountinfo.Entry {
		return mountinfo.Entry{Root: root_, MountPoint: filepath.Join(root, at), FSType: fsType}
	}
	hybrid := []mountinfo.Entry{
		mount("tmpfs", "/", ""),
		mount("cgroup", "/", "v1mem"),
		mount("cgroup2", "/", "unified"),
	}
	container := []mountinfo.Entry{mount("cgroup2", "/kubepods/pod1", "container")}
	cases := []struct {
		name   string
		mounts []mountinfo.Entry
		own    string
		want   string // below root; "" for an error
	}{
		{"hybrid root", hybrid, "/", "unified"},
		{"hybrid nested", hybrid, "/user.slice", "unified/user.slice"},
		{"container root", container, "/kubepods/pod1", "container"},
		{"container nested", container, "/kubepods/pod1/job", "container/job"},
		{"a sibling of the container's root", container, "/kubepods/pod10", ""},
		{"not a cgroup directory", hybrid, "/system.slice", ""},
		{"v1 only", hybrid[:2], "/user.slice", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := cgroupDir(c.mounts, c.own)
			switch {
			case c.want == "" && err == nil:
				t.Errorf("got %q, want an error", got)
			case c.want != "" && (err != nil || got != filepath.Join(root, c.want)):
				t.Errorf("got %q, %v; want %q", got, err, filepath.Join(root, c.want))
			}
		})
	}
}

// TestProcStat: the parent and state are read after the command name,
// whatever the name holds: a task may name itself to look like other
// fields.
func TestProcStat(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		fstest.Lacks(t, "sleep (coreutils) is missing")
	}
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	// comm keeps 15 bytes: ") Z 1 (x" fits and fakes a zombie of init.
	fake := filepath.Join(t.TempDir(), ") Z 1 (x")
	if err := os.WriteFile(fake, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(fake, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	ppid, state, err := procStat(cmd.Process.Pid)
	if err != nil || ppid != os.Getpid() || state == 'Z' {
		t.Errorf("got ppid %d, state %c, %v; want ppid %d and a live state", ppid, state, err, os.Getpid())
	}
	if _, _, err := procStat(1 << 30); err == nil {
		t.Errorf("a pid that cannot exist: got no error")
	}
}

// TestDescendants: the scan finds a child's children, including one that
// started a session of its own, and nothing that is not below.
func TestDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", `sleep 60 & echo $!; setsid sleep 61 & echo $!; exec sleep 62`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var want []int
	buf := make([]byte, 64)
	var got string
	for strings.Count(got, "\n") < 2 {
		n, err := out.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got += string(buf[:n])
	}
	for _, f := range strings.Fields(got) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, pid)
		defer func() { // by pid: they are the test's grandchildren
			if p, _, err := procStat(pid); err == nil && p == cmd.Process.Pid {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}()
	}
	found := make(map[int]int)
	for _, pr := range descendants(os.Getpid()) {
		found[pr.pid] = pr.ppid
	}
	if found[cmd.Process.Pid] != os.Getpid() {
		t.Errorf("the child %d is not among the descendants %v", cmd.Process.Pid, found)
	}
	for _, pid := range want {
		if found[pid] != cmd.Process.Pid {
			t.Errorf("the grandchild %d is not among the descendants %v", pid, found)
		}
	}
	if _, ok := found[1]; ok {
		t.Errorf("init is among the descendants")
	}
}
