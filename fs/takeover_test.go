package fs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/restart"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// takeoverHelperEnv holds "<data-dir> <mount point>" for TestTakeoverHelper.
const takeoverHelperEnv = "ALLOCFS_TAKEOVER_HELPER"

// holdLookups holds every LOOKUP of the name "held": it writes "H" to fd
// and never returns, as a handler busy at the instant of a crash.
type holdLookups struct {
	fuse.RawFileSystem
	fd int
}

func (h *holdLookups) Lookup(cancel <-chan struct{}, header *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if name == "held" {
		unix.Write(h.fd, []byte("H"))
		select {}
	}
	return h.RawFileSystem.Lookup(cancel, header, name, out)
}

// Mkdir of the name "made" makes the directory and then holds the
// reply: it writes "M" to fd and never returns, as a daemon killed
// between a handler's work and its reply.
func (h *holdLookups) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	st := h.RawFileSystem.Mkdir(cancel, in, name, out)
	if name == "made" {
		unix.Write(h.fd, []byte("M"))
		select {}
	}
	return st
}

// sockKeeper keeps memory volumes as the holder does, in another
// process: each Keep sends the key with a copy of the descriptor over a
// unix socket, and Drop sends "drop <key>".
type sockKeeper int

func (k sockKeeper) Keep(key string, fd int) error {
	return unix.Sendmsg(int(k), []byte(key), unix.UnixRights(fd), nil, 0)
}

func (k sockKeeper) Drop(key string) error {
	return unix.Sendmsg(int(k), []byte("drop "+key), nil, nil, 0)
}

// receiveKept reads what a sockKeeper sent on sock without waiting:
// the descriptors it keeps, by key.
func receiveKept(t *testing.T, sock int) map[string]int {
	t.Helper()
	kept := make(map[string]int)
	for {
		buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			return kept
		}
		if err != nil {
			t.Fatalf("receiving kept memory volumes: %v", err)
		}
		key := string(buf[:n])
		if k, ok := strings.CutPrefix(key, "drop "); ok {
			if fd, ok := kept[k]; ok {
				unix.Close(fd)
				delete(kept, k)
			}
			continue
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			t.Fatalf("a kept memory volume %q came without its descriptor: %v", key, err)
		}
		fds, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			t.Fatalf("a kept memory volume %q came without its descriptor: %v", key, err)
		}
		kept[key] = fds[0]
	}
}

// TestTakeoverHelper is not a test: run as a child process by
// TestAdoptMountAfterKill, it serves the data dir at the mount point its
// environment names, sends its /dev/fuse descriptor over the unix socket
// it has as fd 3 and its memory volumes' over fd 4, and holds every
// lookup of "held" until it is killed.
func TestTakeoverHelper(t *testing.T) {
	env := os.Getenv(takeoverHelperEnv)
	if env == "" {
		t.Skip("run as a child process by TestAdoptMountAfterKill")
	}
	dataDir, mnt, _ := strings.Cut(env, " ")
	const sock = 3
	logger := hclog.New(&hclog.LoggerOptions{Name: "helper", Level: hclog.Warn, Output: os.Stderr})
	s, err := openStore(t, logger, dataDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts := DefaultMountOptions()
	opts.IOUring = false
	// A daemon that takes the mount over without it keeps the mount as
	// it was made.
	opts.AllowSuid = true
	opts.interpose = func(h fuse.RawFileSystem) fuse.RawFileSystem { return &holdLookups{RawFileSystem: h, fd: sock} }
	opts.Memory = sockKeeper(sock + 1)
	m, err := NewMount(logger, s, mnt, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(sock, []byte("fd"), unix.UnixRights(m.server.(ownServer).conn.Fd()), nil, 0); err != nil {
		t.Fatal(err)
	}
	select {}
}

// TestAdoptMountAfterKill: a daemon is killed with SIGKILL while one
// lookup is in its handler and a process has files, a directory listing
// and its working directory in the mount; a new daemon takes the
// connection over (AdoptMount), and every one of them carries on: the
// lookup is answered, the open file takes more writes and an fsync, the
// listing goes on, and the shell lists its working directory; the
// memory volumes are kept, and files unlinked while open still answer.
// The mount keeps the options it was made with: the killed daemon's
// AllowSuid, which the new one was not given.
func TestAdoptMountAfterKill(t *testing.T) {
	fstest.RequireFUSE(t)
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dataDir, mnt := filepath.Join(root, "data"), filepath.Join(root, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	// The allocation, and a file only the held lookup will find, are
	// made before any daemon runs.
	s0 := storeAt(t, dataDir)
	st, err := s0.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := s0.LayerPath(st.Volumes["alloc/data"].Upper)
	if err := os.WriteFile(filepath.Join(data, "held"), []byte("found"), 0o644); err != nil {
		t.Fatal(err)
	}
	local := s0.LayerPath(st.Volumes["web/local"].Upper)
	for _, n := range []string{"one", "two", "three"} {
		if err := os.WriteFile(filepath.Join(local, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := s0.Close(); err != nil {
		t.Fatal(err)
	}

	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pair[0])
	memPair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(memPair[0])
	memSock := os.NewFile(uintptr(memPair[1]), "helper's keeper socket")
	childSock := os.NewFile(uintptr(pair[1]), "helper socket")
	helper := exec.Command(os.Args[0], "-test.run=^TestTakeoverHelper$")
	helper.Env = append(os.Environ(), takeoverHelperEnv+"="+dataDir+" "+mnt)
	helper.ExtraFiles = []*os.File{childSock, memSock}
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	childSock.Close()
	memSock.Close()
	t.Cleanup(func() {
		helper.Process.Kill()
		helper.Wait()
	})
	oob := make([]byte, unix.CmsgSpace(4))
	_, oobn, _, _, err := unix.Recvmsg(pair[0], make([]byte, 16), oob, 0)
	if err != nil {
		t.Fatalf("receiving the helper's descriptor: %v", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("no descriptor from the helper: %v", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("no descriptor from the helper: %v", err)
	}

	// What a task holds in the mount the helper serves.
	logPath := filepath.Join(mnt, "a1/alloc/data/log.txt")
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("before\n"); err != nil {
		t.Fatal(err)
	}
	dir, err := os.Open(filepath.Join(mnt, "a1/web/local"))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	first, err := dir.Readdirnames(1)
	if err != nil || len(first) != 1 {
		t.Fatalf("first entry of the listing: %v %v", first, err)
	}
	shell := exec.Command("sh", "-c", "read go; ls; pwd -P")
	shell.Dir = filepath.Join(mnt, "a1/web/local")
	shellIn, err := shell.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var shellOut bytes.Buffer
	shell.Stdout, shell.Stderr = &shellOut, &shellOut
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}
	defer shell.Process.Kill()
	// A task's secret, and a descriptor of another held open.
	secret := filepath.Join(mnt, "a1/web/secrets/token")
	if err := os.WriteFile(secret, []byte("s3cr3t"), 0o600); err != nil {
		t.Fatal(err)
	}
	openSecret, err := os.OpenFile(filepath.Join(mnt, "a1/web/secrets/open"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer openSecret.Close()
	io.WriteString(openSecret, "before\n")
	if err := os.WriteFile(filepath.Join(mnt, "a1/web/private/key"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Files unlinked while open, in a memory volume and on disk.
	var gone []*os.File
	for _, p := range []string{"a1/web/private/gone", "a1/alloc/data/gone"} {
		g, err := os.OpenFile(filepath.Join(mnt, p), os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		io.WriteString(g, "unnamed")
		if err := os.Remove(g.Name()); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, g)
	}
	kept := receiveKept(t, memPair[0])
	if len(kept) != 2 {
		t.Fatalf("the keeper got %v, want web's secrets and private", kept)
	}
	held := make(chan error, 1)
	var heldSt unix.Stat_t
	go func() { held <- unix.Stat(filepath.Join(mnt, "a1/alloc/data/held"), &heldSt) }()
	made := make(chan error, 1)
	go func() { made <- os.Mkdir(filepath.Join(mnt, "a1/alloc/tmp/made"), 0o755) }()
	for range 2 {
		if _, err := unix.Read(pair[0], make([]byte, 1)); err != nil {
			t.Fatalf("waiting for the lookup and the mkdir to reach the helper: %v", err)
		}
	}

	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	helper.Wait()

	s := openTestStore(t, dataDir, store.Options{})
	opts := DefaultMountOptions()
	opts.HeldMemory = kept
	m, err := AdoptMount(testLogger(t), s, fds[0], opts)
	if err != nil {
		t.Fatalf("AdoptMount: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if e := mountEntry(t, mnt); e.HasOption("nosuid") {
		t.Errorf("the mount made with AllowSuid, taken over without it, is %q", e.Options)
	}

	select {
	case err := <-held:
		if err != nil || heldSt.Size != int64(len("found")) {
			t.Errorf("the lookup in flight at the kill: %v, size %d", err, heldSt.Size)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the lookup in flight at the kill is not answered 10 s after the takeover")
	}
	select {
	case err := <-made:
		// The dead daemon made it; the resent request is answered
		// from its record, not run again into EEXIST.
		if err != nil {
			t.Errorf("a mkdir whose reply the kill lost: %v, want success", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the mkdir in flight at the kill is not answered 10 s after the takeover")
	}
	if fi, err := os.Stat(filepath.Join(mnt, "a1/alloc/tmp/made")); err != nil || !fi.IsDir() {
		t.Errorf("the directory the mkdir made: %v, %v", fi, err)
	}
	if _, err := f.WriteString("after\n"); err != nil {
		t.Errorf("a write to a file opened before the kill: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Errorf("fsync of a file opened before the kill: %v", err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != int64(len("before\nafter\n")) {
		t.Errorf("fstat of a file opened before the kill: %v, %v", fi, err)
	}
	rest, err := dir.Readdirnames(-1)
	if err != nil {
		t.Errorf("the rest of a listing begun before the kill: %v", err)
	}
	if got := len(first) + len(rest); got != 3 {
		t.Errorf("the listing begun before the kill has %d entries (%v then %v), want 3", got, first, rest)
	}
	io.WriteString(shellIn, "go\n")
	if err := shell.Wait(); err != nil {
		t.Errorf("a shell whose working directory is in the mount: %v\n%s", err, shellOut.String())
	}
	if want := fmt.Sprintf("one\nthree\ntwo\n%s\n", filepath.Join(mnt, "a1/web/local")); shellOut.String() != want {
		t.Errorf("the shell printed %q, want %q", shellOut.String(), want)
	}
	if b, err := os.ReadFile(logPath); err != nil || string(b) != "before\nafter\n" {
		t.Errorf("the log file: %q, %v", b, err)
	}
	// The kernel forgets what it can and looks the paths up again: the
	// nodes the takeover resolved must be the ones those lookups find.
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0); err != nil {
		t.Logf("cannot drop the kernel's caches: %v", err)
	}
	if b, err := os.ReadFile(logPath); err != nil || string(b) != "before\nafter\n" {
		t.Errorf("the log file after the kernel forgot it: %q, %v", b, err)
	}
	moved := filepath.Join(mnt, "a1/alloc/data/moved.txt")
	if err := os.Rename(logPath, moved); err != nil {
		t.Errorf("rename of the log file after the takeover: %v", err)
	}
	if _, err := f.WriteString("moved\n"); err != nil {
		t.Errorf("a write to the open file after its rename: %v", err)
	}
	if b, err := os.ReadFile(moved); err != nil || string(b) != "before\nafter\nmoved\n" {
		t.Errorf("the renamed log file: %q, %v", b, err)
	}
	// The memory volumes outlived the daemon: the secrets are there, the
	// open descriptor reads and writes.
	if b, err := os.ReadFile(secret); err != nil || string(b) != "s3cr3t" {
		t.Errorf("the secret after the takeover: %q, %v", b, err)
	}
	if _, err := io.WriteString(openSecret, "after\n"); err != nil {
		t.Errorf("a write to a secret opened before the kill: %v", err)
	}
	if b, err := os.ReadFile(openSecret.Name()); err != nil || string(b) != "before\nafter\n" {
		t.Errorf("the open secret after the takeover: %q, %v", b, err)
	}
	if fi, err := openSecret.Stat(); err != nil || fi.Size() != int64(len("before\nafter\n")) {
		t.Errorf("fstat of a secret opened before the kill: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "a1/web/private/key")); err != nil || string(b) != "k" {
		t.Errorf("the private file after the takeover: %q, %v", b, err)
	}
	for _, g := range gone {
		fi, err := g.Stat()
		if err != nil || fi.Size() != int64(len("unnamed")) {
			t.Errorf("fstat of %s, unlinked while open, after the takeover: %v, %v", g.Name(), fi, err)
		}
		if _, err := g.WriteAt([]byte("+more"), 7); err != nil {
			t.Errorf("a write to %s, unlinked while open, after the takeover: %v", g.Name(), err)
		}
		if err := g.Chmod(0o640); err != nil {
			t.Errorf("fchmod of %s, unlinked while open, after the takeover: %v", g.Name(), err)
		}
		b := make([]byte, 32)
		if n, _ := g.ReadAt(b, 0); string(b[:n]) != "unnamed+more" {
			t.Errorf("read of %s, unlinked while open, after the takeover: %q", g.Name(), b[:n])
		}
		again, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", g.Fd()))
		if err != nil {
			t.Errorf("%s, unlinked while open, opened again through /proc after the takeover: %v", g.Name(), err)
		} else {
			n, _ := again.Read(b)
			again.Close()
			if string(b[:n]) != "unnamed+more" {
				t.Errorf("%s opened again through /proc reads %q", g.Name(), b[:n])
			}
		}
		if fi, err := g.Stat(); err != nil || fi.Mode().Perm() != 0o640 {
			t.Errorf("fstat of %s after its fchmod: %v, %v", g.Name(), fi, err)
		}
	}
	if n, _ := m.takeover.Inherited(); n == 0 {
		t.Errorf("no inherited node was resolved")
	}
	if _, n := m.takeover.Inherited(); n != 0 {
		t.Errorf("%d inherited nodes were not found", n)
	}
	f.Close()
	dir.Close()
}

// storeAt opens the store in dataDir, for a test that closes it itself.
func storeAt(t *testing.T, dataDir string) *store.Store {
	t.Helper()
	s, err := openStore(t, testLogger(t), dataDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPathsOfNodePastAStaleUnlinkedRecord: a record of a file unlinked
// while open that a crash left behind, under an inode number another
// file has now, does not hide that file from a takeover: its own path
// follows the record's.
func TestPathsOfNodePastAStaleUnlinkedRecord(t *testing.T) {
	fstest.RequireFUSE(t)
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"), store.Options{})
	rec0, err := s.Create("a1", []allocdir.Task{{Name: "web"}}, store.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Made before the daemon started, as a file the kernel holds from an
	// earlier daemon is.
	if err := os.WriteFile(filepath.Join(s.LayerPath(rec0.Volumes["alloc/data"].Upper), "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	tm := mountTestStore(t, s, nil)
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(tm.dir, "a1/alloc/data/f"), &st); err != nil {
		t.Fatal(err)
	}
	// A handle no file answers any more.
	rec := restart.UnlinkedRecord{Root: "a1/alloc/data", Type: 1, Handle: make([]byte, 8)}
	if err := restart.NewUnlinked(tm.store.DataDir()).Save(st.Ino, rec); err != nil {
		t.Fatal(err)
	}
	paths, errno := tm.mount.pathsOfNode(st.Ino)
	found := false
	for _, q := range paths {
		found = found || strings.Join(q, "/") == "a1/alloc/data/f"
	}
	if errno != 0 || !found {
		t.Errorf("the node of a1/alloc/data/f under a stale record: %v, %v; want its path among them", paths, errno)
	}
}
