package transport

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// A FUSE connection lives as long as some process holds its /dev/fuse
// file: a daemon that dies or exits while another process (a holder, a
// successor, systemd's file-descriptor store) keeps a descriptor of that
// same open file leaves the mount alive, its callers waiting. A new
// daemon takes the connection over with Adopt: the kernel sends no second
// INIT, so the new daemon must be told what the first one negotiated
// (Session), and the requests the old one had read but not answered are
// still queued on that open file as "being processed", which the kernel
// gives out again when asked (Resend, FUSE_NOTIFY_RESEND, Linux 6.9+).
//
// It must be the same open file, passed with SCM_RIGHTS or inherited,
// never a clone (FUSE_DEV_IOC_CLONE): the kernel fails the requests a
// clone was processing when the clone is closed, as it is when its
// process dies.

// sessionVersion is the version of Session's meaning: a daemon refuses a
// session of another version, so that an upgrade across a change of it
// fails before it takes anything over.
const sessionVersion = 1

// Session is what a connection negotiated at INIT: what a daemon that
// takes the connection over must know.
type Session struct {
	// Version is sessionVersion of the daemon that wrote it.
	Version int
	// Dir is the mount point.
	Dir string
	// Kernel is the kernel's INIT request.
	Kernel fuse.InitIn
	// Flags are the negotiated capabilities (fuse.CAP_*).
	Flags uint64
	// MaxWrite and MaxPages are the negotiated sizes.
	MaxWrite, MaxPages int
}

// Session returns what c negotiated.
func (c *Conn) Session() Session {
	return Session{Version: sessionVersion, Dir: c.dir, Kernel: c.kernel, Flags: c.flags, MaxWrite: c.maxWrite, MaxPages: c.maxPages}
}

// Fd returns the connection's /dev/fuse descriptor, for a holder or a
// successor to keep a copy of. It stays c's: the caller must not close it.
func (c *Conn) Fd() int { return c.fd }

// Adopt makes a connection of fd, a /dev/fuse descriptor whose INIT s
// describes, and which some other daemon served. Serve then asks the
// kernel to resend what that daemon had not answered, and serves it, over
// io_uring again when the session has it (the rings were the old
// process's, and went with it). Adopt takes fd: Wait closes it. The old
// daemon must be gone: requests it still reads are not resent.
// opts gives the logger and the reader cap; the sizes are the session's.
func Adopt(fd int, s Session, opts Options) (*Conn, error) {
	if err := CheckSession(s); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("the FUSE descriptor %d: %w", fd, err)
	}
	// /dev/fuse is the character device 10:229.
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 10 || unix.Minor(st.Rdev) != 229 {
		return nil, fmt.Errorf("descriptor %d is not /dev/fuse (mode %o, device %d:%d)", fd, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	if opts.Logger == nil {
		opts.Logger = hclog.NewNullLogger()
	}
	if opts.MaxReaders <= 0 {
		opts.MaxReaders = 16
	}
	c := &Conn{fd: fd, dir: s.Dir, log: opts.Logger, kernel: s.Kernel, flags: s.Flags, maxWrite: s.MaxWrite, maxPages: s.MaxPages, maxReaders: int32(max(opts.MaxReaders, 2)), adopted: true}
	c.observe(opts.Observer)
	c.bufs.New = func() any { return newBuffers(c.maxWrite) }
	return c, nil
}

// CheckSession tells whether Adopt can take a connection of session s.
func CheckSession(s Session) error {
	if s.Version != sessionVersion {
		return fmt.Errorf("the FUSE session is of version %d; this allocfs takes over version %d only", s.Version, sessionVersion)
	}
	if !filepath.IsAbs(s.Dir) || s.MaxWrite <= 0 || s.MaxWrite > 1<<20 || s.MaxPages <= 0 {
		return fmt.Errorf("the FUSE session is malformed (mount point %q, max write %d, max pages %d)", s.Dir, s.MaxWrite, s.MaxPages)
	}
	if s.Kernel.Major != kernelMajor || s.Kernel.Minor < minMinor {
		return fmt.Errorf("the FUSE session speaks %d.%d; allocfs needs %d.%d or later", s.Kernel.Major, s.Kernel.Minor, kernelMajor, minMinor)
	}
	return nil
}

// notifyResend is FUSE_NOTIFY_RESEND's code.
const notifyResend = 7

// Resend asks the kernel to send again every request this connection's
// open file had given out and not seen answered: those of a daemon that
// died or handed over with them in hand. They come back with the top bit
// of their unique set (FUSE_UNIQUE_RESEND), which the replies echo. A
// kernel older than 6.9 refuses (EINVAL): those requests then wait until
// the connection ends. Requests a dead daemon's FUSE rings held are not
// resent (Linux 6.18: TestAdoptAfterKillResendsRingRequests).
func (c *Conn) Resend() error {
	hdr := fuse.OutHeader{Status: notifyResend, Length: uint32(outHeaderSize)}
	if _, err := unix.Write(c.fd, unsafe.Slice((*byte)(unsafe.Pointer(&hdr)), outHeaderSize)); err != nil {
		return fmt.Errorf("FUSE_NOTIFY_RESEND: %w", err)
	}
	return nil
}

// Park stops serving, for a hand-over: requests read from now on are left
// unanswered (the next daemon has them resent), and Park returns once no
// handler runs any more, or fails after timeout. The process must exit
// after it, without unmounting: its readers never end. A connection
// served over io_uring cannot be parked, since the kernel resends nothing
// a ring entry held (Resend).
func (c *Conn) Park(timeout time.Duration) error {
	if c.rings.Load() {
		return errors.New("a FUSE connection served over io_uring cannot be handed over: the kernel would not resend what its rings hold")
	}
	c.parked.Store(true)
	deadline := time.Now().Add(timeout)
	for c.active.Load() > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d FUSE requests still being handled after %v", c.active.Load(), timeout)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}
