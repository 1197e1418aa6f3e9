package transport_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/transport"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// holdingRoot answers a lookup of "held" with a file, unless hold is
// set: then the lookup tells entered and never returns.
type holdingRoot struct {
	gofs.Inode
	hold    bool
	entered func()
}

var _ = (gofs.NodeLookuper)((*holdingRoot)(nil))

func (r *holdingRoot) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if name != "held" {
		return nil, syscall.ENOENT
	}
	if r.hold {
		r.entered()
		select {}
	}
	out.Attr.Mode = syscall.S_IFREG | 0o644
	out.Attr.Size = 42
	return r.NewInode(ctx, &sizedFile{}, gofs.StableAttr{Mode: syscall.S_IFREG}), 0
}

// sizedFile is a file of 42 bytes.
type sizedFile struct{ gofs.Inode }

var _ = (gofs.NodeGetattrer)((*sizedFile)(nil))

func (f *sizedFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFREG | 0o644
	out.Size = 42
	return 0
}

// helperEnv names the mount point of a helper daemon (TestHelperDaemon).
const helperEnv = "ALLOCFS_TRANSPORT_HELPER_MOUNT"

// TestHelperDaemon is not a test: run by a test as a child process, it
// mounts a filesystem whose lookup of "held" never returns, sends its
// /dev/fuse descriptor and session over the unix socket it has as fd 3,
// writes "H" there when the lookup has come in, and waits to be killed.
func TestHelperDaemon(t *testing.T) {
	mnt := os.Getenv(helperEnv)
	if mnt == "" {
		t.Skip("run as a child process by the takeover tests")
	}
	sock := 3
	ring, _ := strconv.ParseBool(os.Getenv("ALLOCFS_TRANSPORT_HELPER_RING"))
	conn, err := transport.Mount(mnt, transport.Options{FsName: "takeover-test", Subtype: "takeovertest", IOUring: ring})
	if err != nil {
		t.Fatal(err)
	}
	park, _ := strconv.ParseBool(os.Getenv("ALLOCFS_TRANSPORT_HELPER_PARK"))
	root := &holdingRoot{hold: !park, entered: func() { unix.Write(sock, []byte("H")) }}
	if err := conn.Serve(gofs.NewNodeFS(root, &gofs.Options{ServerCallbacks: conn})); err != nil {
		t.Fatal(err)
	}
	session, err := json.Marshal(conn.Session())
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Sendmsg(sock, session, unix.UnixRights(conn.Fd()), nil, 0); err != nil {
		t.Fatal(err)
	}
	if park {
		// Park when told to, and say so.
		if _, err := unix.Read(sock, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if err := conn.Park(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		unix.Write(sock, []byte("p"))
	}
	select {}
}

// startHelperDaemon starts TestHelperDaemon on mnt and returns it, the
// connection's descriptor and session it sent, and the socket on which
// it says "H".
func startHelperDaemon(t *testing.T, mnt string, ring bool, env ...string) (*exec.Cmd, int, transport.Session, int) {
	t.Helper()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	child := os.NewFile(uintptr(pair[1]), "helper socket")
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperDaemon$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+mnt, "ALLOCFS_TRANSPORT_HELPER_RING="+strconv.FormatBool(ring)), env...)
	cmd.ExtraFiles = []*os.File{child}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child.Close()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		unix.Close(pair[0])
	})
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := unix.Recvmsg(pair[0], buf, oob, 0)
	if err != nil {
		t.Fatalf("receiving the helper's session: %v", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		t.Fatalf("the helper's message carries no descriptor (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		t.Fatalf("the helper's message carries no descriptor (%v)", err)
	}
	var s transport.Session
	if err := json.Unmarshal(buf[:n], &s); err != nil {
		t.Fatal(err)
	}
	return cmd, fds[0], s, pair[0]
}

// TestAdoptAfterKill: a daemon is killed with SIGKILL while a lookup is
// in its handler; a new one adopts the connection from a descriptor a
// third process (here, the test) kept, asks the kernel to resend, and
// the caller of the lookup gets its answer, none the wiser.
func TestAdoptAfterKill(t *testing.T) {
	adoptAfterKill(t, false)
}

// TestAdoptAfterKillResendsRingRequests is TestAdoptAfterKill over
// io_uring. Linux 6.18 does not resend a request a ring entry of the
// dead daemon held: FUSE_NOTIFY_RESEND requeues what the /dev/fuse files
// were processing, and each ring queue keeps its own. The lookup's
// caller then waits, unkillable, until the connection ends. That is why
// a daemon whose connection outlives it serves over /dev/fuse
// (docs/live-restart.md); this test runs where ALLOCFS_PROBE_RING_RESEND
// is set, to find the kernel that does.
func TestAdoptAfterKillResendsRingRequests(t *testing.T) {
	if os.Getenv("ALLOCFS_PROBE_RING_RESEND") == "" {
		t.Skip("probes whether the kernel resends requests held in FUSE rings (Linux 6.18 does not); set ALLOCFS_PROBE_RING_RESEND=1 to run")
	}
	adoptAfterKill(t, true)
}

func adoptAfterKill(t *testing.T, ring bool) {
	fstest.RequireFUSE(t)
	if ring {
		requireFUSEOverIOUring(t)
	}
	mnt := t.TempDir()
	cmd, fd, session, sock := startHelperDaemon(t, mnt, ring)
	stat := make(chan error, 1)
	var st unix.Stat_t
	go func() { stat <- unix.Stat(filepath.Join(mnt, "held"), &st) }()
	if _, err := unix.Read(sock, make([]byte, 1)); err != nil {
		t.Fatalf("waiting for the lookup to reach the helper: %v", err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	conn := adopt(t, fd, session, ring)
	select {
	case err := <-stat:
		if err != nil || st.Size != 42 {
			t.Errorf("the lookup in flight at the kill: %v, size %d; want the file of 42 bytes", err, st.Size)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the lookup in flight at the kill is still waiting 5 s after the resend")
		// It ends with the connection.
		transport.Abort(conn)
		<-stat
	}
}

// adopt adopts fd as the connection session describes, serves it with a
// root whose "held" answers, and unmounts it when the test ends.
func adopt(t *testing.T, fd int, session transport.Session, ring bool) *transport.Conn {
	t.Helper()
	conn, err := transport.Adopt(fd, session, transport.Options{IOUring: ring})
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	t.Cleanup(func() {
		if err := conn.Unmount(); err != nil {
			t.Errorf("Unmount: %v", err)
			transport.Abort(conn)
			unix.Unmount(session.Dir, unix.MNT_DETACH)
		}
		conn.Wait()
	})
	if err := conn.Serve(gofs.NewNodeFS(&holdingRoot{}, &gofs.Options{ServerCallbacks: conn})); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if conn.IOUring() != ring {
		t.Errorf("the adopted connection serves over io_uring: %v, want %v", conn.IOUring(), ring)
	}
	return conn
}

// TestAdoptSetsUpRingsAgain: the rings of a daemon that died went with
// it; the daemon that adopts its connection registers its own, and the
// kernel sends new requests there.
func TestAdoptSetsUpRingsAgain(t *testing.T) {
	fstest.RequireFUSE(t)
	requireFUSEOverIOUring(t)
	mnt := t.TempDir()
	cmd, fd, session, _ := startHelperDaemon(t, mnt, true)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	conn := adopt(t, fd, session, true)
	before := conn.RingRequests()
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(mnt, "held"), &st); err != nil || st.Size != 42 {
		t.Fatalf("stat through the adopted connection: %v, size %d", err, st.Size)
	}
	if conn.RingRequests() == before {
		t.Errorf("the stat came over /dev/fuse, not the new rings")
	}
}

// TestAdoptRefusesWhatItCannotServe: a session of another version, a
// malformed one, and a descriptor that is not /dev/fuse are refused, and
// the descriptor is left to the caller.
func TestAdoptRefusesWhatItCannotServe(t *testing.T) {
	good := transport.Session{Version: 1, Dir: "/mnt", MaxWrite: 128 << 10, MaxPages: 32}
	good.Kernel.Major, good.Kernel.Minor = 7, 41
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(null)
	for _, c := range []struct {
		name   string
		change func(*transport.Session)
		want   string
	}{
		{"another version", func(s *transport.Session) { s.Version = 2 }, "takes over version 1 only"},
		{"relative mount point", func(s *transport.Session) { s.Dir = "mnt" }, "malformed"},
		{"max write over 1 MiB", func(s *transport.Session) { s.MaxWrite = 2 << 20 }, "malformed"},
		{"no max pages", func(s *transport.Session) { s.MaxPages = 0 }, "malformed"},
		{"old kernel", func(s *transport.Session) { s.Kernel.Minor = 20 }, "speaks 7.20"},
		{"not /dev/fuse", func(s *transport.Session) {}, "is not /dev/fuse"},
	} {
		s := good
		c.change(&s)
		if _, err := transport.Adopt(null, s, transport.Options{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	if _, err := unix.FcntlInt(uintptr(null), unix.F_GETFD, 0); err != nil {
		t.Errorf("the refused descriptor was closed: %v", err)
	}
}

// TestParkLeavesRequestsToTheNextDaemon: a parked daemon answers
// nothing it reads any more; the daemon that adopts the connection after
// it exits has the kernel resend what it left, and the caller gets its
// answer.
func TestParkLeavesRequestsToTheNextDaemon(t *testing.T) {
	fstest.RequireFUSE(t)
	mnt := t.TempDir()
	cmd, fd, session, sock := startHelperDaemon(t, mnt, false, "ALLOCFS_TRANSPORT_HELPER_PARK=1")
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(mnt, "held"), &st); err != nil || st.Size != 42 {
		t.Fatalf("stat before the park: %v, size %d", err, st.Size)
	}
	unix.Write(sock, []byte("P"))
	if _, err := unix.Read(sock, make([]byte, 1)); err != nil {
		t.Fatalf("waiting for the helper to park: %v", err)
	}
	stat := make(chan error, 1)
	var st2 unix.Stat_t
	go func() { stat <- unix.Stat(filepath.Join(mnt, "other"), &st2) }()
	select {
	case err := <-stat:
		t.Fatalf("a parked daemon answered a lookup: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	conn := adopt(t, fd, session, false)
	select {
	case err := <-stat:
		if !errors.Is(err, unix.ENOENT) {
			t.Errorf("the lookup the parked daemon left: %v, want ENOENT from the new daemon", err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the lookup the parked daemon left is not answered 5 s after the resend")
		transport.Abort(conn)
		<-stat
	}
}
