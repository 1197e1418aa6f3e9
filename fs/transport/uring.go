package transport

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// An io_uring instance, driven with raw system calls (golang.org/x/sys has
// the syscall numbers, not the ring's layout). The layout constants below
// are include/uapi/linux/io_uring.h's.
const (
	ioringSetupSQE128       = 1 << 10
	ioringSetupCoopTaskrun  = 1 << 8
	ioringSetupSingleIssuer = 1 << 12
	ioringSetupDeferTaskrun = 1 << 13
	ioringFeatSingleMmap    = 1 << 0
	ioringEnterGetevents    = 1 << 0
	ioringOffSQRing         = 0
	ioringOffSQEs           = 0x10000000
	ioringOpURingCmd        = 46
	sqe128Size              = 128
	cqeSize                 = 16
	sqeOffOpcode            = 0
	sqeOffFd                = 4
	sqeOffCmdOp             = 8
	sqeOffAddr              = 16
	sqeOffLen               = 24
	sqeOffUserData          = 32
	sqeOffCmd               = 48
	ioUringParamsSize       = 120
)

// ioUringParams is struct io_uring_params: what io_uring_setup(2) is asked
// for and answers (the sizes it chose and where each field of the rings
// lies in their mapping).
type ioUringParams struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	_                                                                      [3]uint32
	SQOff                                                                  sqRingOffsets
	CQOff                                                                  cqRingOffsets
}

type sqRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, _ uint32
	UserAddr                                                    uint64
}

type cqRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, _ uint32
	UserAddr                                                    uint64
}

var _ [ioUringParamsSize - unsafe.Sizeof(ioUringParams{})]byte
var _ [unsafe.Sizeof(ioUringParams{}) - ioUringParamsSize]byte

// uring is one io_uring with 128-byte submission entries (the size
// IORING_OP_URING_CMD needs for FUSE's command). It is used by one
// goroutine at a time: no locks.
type uring struct {
	fd int
	// rings is the shared mapping of both rings; sqes the entries'.
	rings, sqes []byte

	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        unsafe.Pointer
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           unsafe.Pointer
	// tail is the next submission slot: ahead of *sqTail by the entries
	// prepared since the last enter.
	tail uint32
}

// newUring sets up a ring of at least entries submission slots (and
// twice as many completion slots). flags are IORING_SETUP_* beyond
// SQE128.
func newUring(entries, flags uint32) (*uring, error) {
	p := ioUringParams{Flags: ioringSetupSQE128 | flags}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &uring{fd: int(fd)}
	if p.Features&ioringFeatSingleMmap == 0 {
		r.close()
		return nil, fmt.Errorf("io_uring without IORING_FEAT_SINGLE_MMAP (Linux < 5.4)")
	}
	size := max(int(p.SQOff.Array)+int(p.SQEntries)*4, int(p.CQOff.CQEs)+int(p.CQEntries)*cqeSize)
	var err error
	r.rings, err = unix.Mmap(r.fd, ioringOffSQRing, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("mmap of the io_uring rings: %w", err)
	}
	r.sqes, err = unix.Mmap(r.fd, ioringOffSQEs, int(p.SQEntries)*sqe128Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		r.close()
		return nil, fmt.Errorf("mmap of the io_uring submission entries: %w", err)
	}
	at := func(off uint32) unsafe.Pointer { return unsafe.Pointer(&r.rings[off]) }
	r.sqHead = (*uint32)(at(p.SQOff.Head))
	r.sqTail = (*uint32)(at(p.SQOff.Tail))
	r.sqMask = *(*uint32)(at(p.SQOff.RingMask))
	r.sqArray = at(p.SQOff.Array)
	r.cqHead = (*uint32)(at(p.CQOff.Head))
	r.cqTail = (*uint32)(at(p.CQOff.Tail))
	r.cqMask = *(*uint32)(at(p.CQOff.RingMask))
	r.cqes = at(p.CQOff.CQEs)
	r.tail = atomic.LoadUint32(r.sqTail)
	return r, nil
}

// next returns the next free submission entry, zeroed, or nil when every
// slot waits for the kernel.
func (r *uring) next() []byte {
	if r.tail-atomic.LoadUint32(r.sqHead) > r.sqMask {
		return nil
	}
	i := r.tail & r.sqMask
	*(*uint32)(unsafe.Add(r.sqArray, 4*i)) = i
	r.tail++
	sqe := r.sqes[int(i)*sqe128Size : int(i+1)*sqe128Size]
	clear(sqe)
	return sqe
}

// enter publishes the prepared entries, submits them, and waits for at
// least wait completions.
func (r *uring) enter(wait uint32) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	submit := r.tail - atomic.LoadUint32(r.sqHead)
	var flags uintptr
	if wait > 0 {
		flags = ioringEnterGetevents
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(submit), uintptr(wait), flags, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			submit = r.tail - atomic.LoadUint32(r.sqHead)
			continue
		}
		return fmt.Errorf("io_uring_enter: %w", errno)
	}
}

// completion is one completion entry.
type completion struct {
	userData uint64
	res      int32
}

// pop takes the oldest completion, if there is one.
func (r *uring) pop() (completion, bool) {
	head := atomic.LoadUint32(r.cqHead)
	if head == atomic.LoadUint32(r.cqTail) {
		return completion{}, false
	}
	e := unsafe.Add(r.cqes, uintptr(head&r.cqMask)*cqeSize)
	c := completion{userData: *(*uint64)(e), res: *(*int32)(unsafe.Add(e, 8))}
	atomic.StoreUint32(r.cqHead, head+1)
	return c, true
}

func (r *uring) close() error {
	var errs []error
	if r.sqes != nil {
		errs = append(errs, unix.Munmap(r.sqes))
	}
	if r.rings != nil {
		errs = append(errs, unix.Munmap(r.rings))
	}
	errs = append(errs, unix.Close(r.fd))
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("closing an io_uring: %w", err)
		}
	}
	return nil
}

func put32(b []byte, off int, v uint32) { *(*uint32)(unsafe.Pointer(&b[off])) = v }
func put64(b []byte, off int, v uint64) { *(*uint64)(unsafe.Pointer(&b[off])) = v }
