package layer

import (
	"os"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/internal/tmpfs"
	"golang.org/x/sys/unix"
)

// TestDetachedTmpfsLayer: a layer may be a detached tmpfs, named by the
// path its descriptor gives this process: every fd-relative operation of
// a stack works in it as in a directory of the data dir.
func TestDetachedTmpfsLayer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a tmpfs needs root")
	}
	f, err := tmpfs.New(tmpfs.Options{Bytes: 1 << 20, Inodes: 64, Mode: 0o755})
	if err != nil {
		t.Skipf("no detached tmpfs here: %v", err)
	}
	defer f.Close()
	s := &Stack{Roots: []string{f.Path()}}
	l, err := s.Loc(0, "token")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := l.Open(unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o600)
	l.Close()
	if err != nil {
		t.Fatalf("create in the tmpfs layer: %v", err)
	}
	unix.Write(fd, []byte("s3cr3t"))
	unix.Close(fd)
	d, err := s.Loc(0, "dir")
	must(t, err)
	must(t, d.Mkdir(0o700))
	d.Close()
	var st syscall.Stat_t
	must(t, s.Lstat(0, "token", &st))
	if st.Size != 6 {
		t.Errorf("size %d, want 6", st.Size)
	}
	rfd, err := s.Open(0, "token", unix.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, _ := unix.Read(rfd, buf)
	unix.Close(rfd)
	if string(buf[:n]) != "s3cr3t" {
		t.Errorf("read %q", buf[:n])
	}
	entries, err := s.List("", []int{0})
	if err != nil || len(entries) != 2 {
		t.Errorf("list: %v, %v", entries, err)
	}
}
