package fs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/fs/difftest"
	"golang.org/x/sys/unix"
)

// diffExecutor runs one op on both sides.
type diffExecutor interface {
	exec(op difftest.Op) (vol, ref difftest.Result, err error)
	// reset closes the fds of the current sides and starts new ones on
	// the two root directories.
	reset(vol, ref *os.File) error
	close() error
}

type localExecutor struct{ vol, ref *difftest.Side }

func (l *localExecutor) exec(op difftest.Op) (difftest.Result, difftest.Result, error) {
	return l.vol.Exec(op), l.ref.Exec(op), nil
}

func (l *localExecutor) reset(vol, ref *os.File) error {
	l.close()
	l.vol, l.ref = difftest.NewSide(int(vol.Fd()), false), difftest.NewSide(int(ref.Fd()), true)
	return nil
}

func (l *localExecutor) close() error {
	if l.vol != nil {
		l.vol.Close()
		l.ref.Close()
	}
	return nil
}

// childExecutor runs ops in a child process with an unprivileged uid.
//
// The child is this test binary run again (TestDifferentialChild), as
// root, handed the two root directories as open fds; its first act is to
// drop to diffUID:diffGID with setgroups, setresgid and setresuid, and it
// checks that its effective capabilities are then empty before it runs
// anything. Dropping in a fresh process, rather than in this one, keeps
// the FUSE server (which must stay root) out of it, and Go's syscall
// package applies set*id calls to every thread of the process (they go
// through AllThreadsSyscall since Go 1.16), so no runtime thread is left
// privileged. Starting the child with SysProcAttr.Credential would drop
// before exec instead, but then the new uid must be able to execute the
// test binary, which go test keeps in a 0700 directory. The fds make the
// paths to the roots (under 0700 temp dirs) irrelevant: every operation
// is relative to them, as in the root run.
//
// After a divergence the sides start again on new directories: the
// child gets their fds over a unix socket (SCM_RIGHTS), so that one
// child serves the whole run.
type childExecutor struct {
	cmd    *exec.Cmd
	enc    *json.Encoder
	dec    *json.Decoder
	cmdW   *os.File
	resR   *os.File
	ctl    *os.File // our end of the socket that passes root fds
	stderr *bytes.Buffer
}

// diffResetKind is the op that makes the child take new root fds.
const diffResetKind = "reset"

func startDiffChild(vol, ref *os.File) (*childExecutor, error) {
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		return nil, errors.Join(err, cmdR.Close(), cmdW.Close())
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, errors.Join(err, cmdR.Close(), cmdW.Close(), resR.Close(), resW.Close())
	}
	ctl, childCtl := os.NewFile(uintptr(pair[0]), "ctl"), os.NewFile(uintptr(pair[1]), "child ctl")
	c := &childExecutor{cmdW: cmdW, resR: resR, ctl: ctl, stderr: &bytes.Buffer{}}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestDifferentialChild$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d:%d", diffChildEnv, diffUID, diffGID))
	c.cmd.ExtraFiles = []*os.File{vol, ref, cmdR, resW, childCtl} // fds 3 to 7
	c.cmd.Stdout = c.stderr
	c.cmd.Stderr = c.stderr
	err = c.cmd.Start()
	// The child holds its own copies now.
	err = errors.Join(err, cmdR.Close(), resW.Close(), childCtl.Close())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("failed to start the unprivileged child: %w", err), cmdW.Close(), resR.Close(), ctl.Close())
	}
	c.enc = json.NewEncoder(cmdW)
	c.dec = json.NewDecoder(bufio.NewReader(resR))
	return c, nil
}

func (c *childExecutor) exec(op difftest.Op) (difftest.Result, difftest.Result, error) {
	var res [2]difftest.Result
	if err := c.enc.Encode(op); err != nil {
		return res[0], res[1], fmt.Errorf("send op to the child: %w (child output: %s)", err, c.stderr)
	}
	if err := c.dec.Decode(&res); err != nil {
		return res[0], res[1], fmt.Errorf("read the child's result: %w (child output: %s)", err, c.stderr)
	}
	return res[0], res[1], nil
}

func (c *childExecutor) reset(vol, ref *os.File) error {
	if err := c.enc.Encode(difftest.Op{Kind: diffResetKind}); err != nil {
		return fmt.Errorf("send reset to the child: %w (child output: %s)", err, c.stderr)
	}
	rights := unix.UnixRights(int(vol.Fd()), int(ref.Fd()))
	if err := unix.Sendmsg(int(c.ctl.Fd()), []byte{0}, rights, nil, 0); err != nil {
		return fmt.Errorf("pass the new roots to the child: %w", err)
	}
	var res [2]difftest.Result
	if err := c.dec.Decode(&res); err != nil {
		return fmt.Errorf("read the child's reset: %w (child output: %s)", err, c.stderr)
	}
	return nil
}

func (c *childExecutor) close() error {
	err := c.cmdW.Close()
	if werr := c.cmd.Wait(); werr != nil {
		err = errors.Join(err, fmt.Errorf("unprivileged child: %w (output: %s)", werr, c.stderr))
	}
	return errors.Join(err, c.resR.Close(), c.ctl.Close())
}

// receiveRoots takes the two root fds the parent passes on the socket
// at fd ctl.
func receiveRoots(ctl int) (int, int, error) {
	oob := make([]byte, unix.CmsgSpace(2*4))
	_, oobn, _, _, err := unix.Recvmsg(ctl, make([]byte, 1), oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return -1, -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, -1, fmt.Errorf("control messages %v: %w", msgs, err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 2 {
		return -1, -1, fmt.Errorf("rights %v: %w", fds, err)
	}
	return fds[0], fds[1], nil
}

// TestDifferentialChild is the unprivileged side of TestDifferential: a
// helper process, skipped when run directly.
func TestDifferentialChild(t *testing.T) {
	ids := os.Getenv(diffChildEnv)
	if ids == "" {
		t.Skip("helper process of TestDifferential")
	}
	var uid, gid int
	if _, err := fmt.Sscanf(ids, "%d:%d", &uid, &gid); err != nil {
		t.Fatalf("%s=%q: %v", diffChildEnv, ids, err)
	}
	if err := syscall.Setgroups(nil); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nCapEff:\t0000000000000000\n") {
		t.Fatalf("capabilities left after dropping to %d:%d:\n%s", uid, gid, status)
	}
	unix.Umask(0o022)
	volRoot, refRoot := 3, 4
	vol := difftest.NewSide(volRoot, false)
	ref := difftest.NewSide(refRoot, true)
	defer func() {
		vol.Close()
		ref.Close()
	}()
	dec := json.NewDecoder(bufio.NewReader(os.NewFile(5, "ops")))
	out := os.NewFile(6, "results")
	enc := json.NewEncoder(out)
	for {
		var op difftest.Op
		if err := dec.Decode(&op); err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			t.Fatal(err)
		}
		if op.Kind == diffResetKind {
			vol.Close()
			ref.Close()
			unix.Close(volRoot)
			unix.Close(refRoot)
			if volRoot, refRoot, err = receiveRoots(7); err != nil {
				t.Fatal(err)
			}
			vol, ref = difftest.NewSide(volRoot, false), difftest.NewSide(refRoot, true)
			if err := enc.Encode([2]difftest.Result{}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := enc.Encode([2]difftest.Result{vol.Exec(op), ref.Exec(op)}); err != nil {
			t.Fatal(err)
		}
	}
}
