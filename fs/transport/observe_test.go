package transport_test

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/transport"
	"golang.org/x/sys/unix"
)

// recorder is an Observer that keeps what it was told, by opcode name.
type recorder struct {
	mu     sync.Mutex
	counts map[string]int
	errnos map[string][]syscall.Errno
	// slowest is the longest duration it was told of.
	slowest time.Duration
}

func newRecorder() *recorder {
	return &recorder{counts: make(map[string]int), errnos: make(map[string][]syscall.Errno)}
}

func (r *recorder) Request(op uint32, d time.Duration, errno syscall.Errno) {
	r.mu.Lock()
	defer r.mu.Unlock()
	name := transport.OpName(op)
	r.counts[name]++
	if errno != 0 {
		r.errnos[name] = append(r.errnos[name], errno)
	}
	r.slowest = max(r.slowest, d)
}

func (r *recorder) count(op string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[op]
}

func (r *recorder) sawErrno(op string, want syscall.Errno) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.errnos[op] {
		if e == want {
			return true
		}
	}
	return false
}

// eventually polls cond for up to five seconds: the observer is told of a
// request after its reply is written, so after the caller may have its
// answer.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// TestConnTellsTheObserver: every request the loop handles reaches the
// Observer with its opcode and its reply's errno, over /dev/fuse and
// over io_uring alike, a panic's EIO included.
func TestConnTellsTheObserver(t *testing.T) {
	overBoth(t, func(t *testing.T, ring bool) {
		rec := newRecorder()
		mnt, _ := serveObserved(t, &panicky{}, ring, rec)
		before := rec.count("LOOKUP")
		for _, name := range []string{"a", "b", "c"} {
			if _, err := os.Lstat(filepath.Join(mnt, name)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("lstat %s: %v, want not-exist", name, err)
			}
		}
		if !eventually(func() bool { return rec.count("LOOKUP")-before == 3 }) {
			t.Errorf("the observer saw %d LOOKUPs for 3 lstats of missing names, want 3", rec.count("LOOKUP")-before)
		}
		if !rec.sawErrno("LOOKUP", syscall.ENOENT) {
			t.Errorf("the observer saw no LOOKUP answered ENOENT")
		}
		if _, err := os.Lstat(filepath.Join(mnt, "boom")); !errors.Is(err, unix.EIO) {
			t.Fatalf("lookup that panics: %v, want EIO", err)
		}
		if !eventually(func() bool { return rec.sawErrno("LOOKUP", syscall.EIO) }) {
			t.Errorf("the observer was not told of the EIO a panic was answered with")
		}
		rec.mu.Lock()
		slowest := rec.slowest
		rec.mu.Unlock()
		if slowest <= 0 {
			t.Errorf("every request took no time at all: the observer is given no duration")
		}
	})
}

// TestOpName: the names are the protocol's, and an opcode past the table
// has none.
func TestOpName(t *testing.T) {
	for op, want := range map[uint32]string{1: "LOOKUP", 3: "GETATTR", 15: "READ", 44: "READDIRPLUS", 52: "STATX", 0: "", 4096: ""} {
		if got := transport.OpName(op); got != want {
			t.Errorf("OpName(%d) = %q, want %q", op, got, want)
		}
	}
	if transport.OpName(uint32(transport.NumOpcodes)) != "" {
		t.Errorf("OpName(NumOpcodes) has a name: NumOpcodes does not bound the table")
	}
}
