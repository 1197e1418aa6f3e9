package transport

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING, and the fuse
// module's enable_uring parameter). After INIT, the daemon hands the
// kernel ring entries, each a pair of buffers, through IORING_OP_URING_CMD
// submissions on /dev/fuse: REGISTER gives an entry to the queue of one
// CPU, and the command completes when the kernel has written a request
// into it. The daemon answers in the same buffers and submits
// COMMIT_AND_FETCH, which delivers the reply and gives the entry back:
// one system call answers a request and waits for the next. A request
// goes to the queue of the CPU its caller runs on; the kernel uses the
// rings once every CPU's queue has an entry, and holds every request
// until then. FORGET, INTERRUPT and notifications stay on /dev/fuse.
//
// An entry's header buffer, struct fuse_uring_req_header:
//
//	  0  in_out   128 B  fuse_in_header of the request; fuse_out_header
//	                     of the reply
//	128  op_in    128 B  the opcode's fixed input struct (fuse_open_in...)
//	256  ring_ent_in_out fuse_uring_ent_in_out: flags, commit_id (the
//	                     request's unique), payload_sz (bytes used in
//	                     the payload buffer, either way), padding, reserved
//
// and its payload buffer holds the request's variable part (names, write
// data) and the reply's struct and data.
const (
	uringCmdRegister     = 1
	uringCmdCommitFetch  = 2
	uringHdrInOut        = 0
	uringHdrOpIn         = 128
	uringHdrOpInSize     = 128
	uringHdrEntInOut     = 256
	uringEntOffCommitID  = uringHdrEntInOut + 8
	uringEntOffPayloadSz = uringHdrEntInOut + 16
	uringHdrSize         = uringHdrEntInOut + 32
	uringCmdOffCommitID  = sqeOffCmd + 8
	uringCmdOffQid       = sqeOffCmd + 16
)

// How the rings are served. Each ring thread is a goroutine locked to its
// OS thread, with a ring of its own holding one entry, pinned to the CPU
// of its queue: a caller on CPU n waits while its request is handled on
// CPU n, by a thread that answers and waits for the next request in one
// system call. That is what makes the rings pay (docs/benchmarks.md,
// "FUSE over io_uring"); unpinned they are no faster than /dev/fuse.
//
// Locked, because io_uring runs a command's completion work on the thread
// that submitted it (with SINGLE_ISSUER and DEFER_TASKRUN, only while
// that thread waits on its ring): a thread of this process that could
// wait on the mount (a test, the poll probe) must never be that thread.
// One entry per thread, because a thread serves its entry inline: a
// handler that blocks holds its thread and entry only, and the kernel
// gives the CPU's next request to another free entry of the queue. A
// queue whose last free entry is taken gets another thread first (grow),
// up to ringMaxThreads, so that one always waits.
const (
	// ringThreads is the threads (and entries) of each CPU's queue to
	// begin with.
	ringThreads = 2
	// ringMaxThreads bounds a queue's threads: the requests of one CPU
	// in the daemon at once.
	ringMaxThreads = 16
)

// failRingSetup makes the setup of queue 0's rings fail, for the tests of
// the fall-back to /dev/fuse.
var failRingSetup atomic.Bool

// ringEnt is one ring entry: its buffers live in memory mapped outside
// Go's heap, as the kernel writes them between system calls.
type ringEnt struct {
	hdr, payload []byte
	iov          *[2]unix.Iovec
	// replied is set once the handler wrote its reply into the buffers;
	// oversized when that reply did not fit, and EIO went instead.
	replied, oversized bool
}

// ringQueue is the daemon's side of one CPU's queue.
type ringQueue struct {
	qid int
	// own: the queue has threads of its own (its CPU is online), which
	// grow in number; otherwise one thread serves the entries of every
	// offline CPU's queue. pinned: those threads run on the queue's CPU
	// (which is in this process's affinity mask).
	own, pinned bool
	// threads is the queue's ring threads; busy is how many are in a
	// handler.
	threads, busy atomic.Int32
}

// ringThread serves the entries of its ring (one each for the queues in
// qs) on one locked goroutine.
type ringThread struct {
	c  *Conn
	qs []*ringQueue
	r  *uring
	// mem maps the entries' buffers and in, where a request is rebuilt.
	mem, in []byte
	ents    []ringEnt
}

// IOUringUsable says why this kernel and process cannot take FUSE
// requests over io_uring, or nil: the fuse module must allow it, and
// io_uring itself must be allowed (kernel.io_uring_disabled, seccomp).
func IOUringUsable() error {
	b, err := os.ReadFile("/sys/module/fuse/parameters/enable_uring")
	if err != nil {
		return fmt.Errorf("this kernel's FUSE has no io_uring: %w", err)
	}
	if strings.TrimSpace(string(b)) != "Y" {
		return errors.New("FUSE over io_uring is off (/sys/module/fuse/parameters/enable_uring is N)")
	}
	r, err := newUring(1, 0)
	if err != nil {
		return fmt.Errorf("io_uring cannot be used: %w", err)
	}
	return r.close()
}

// cpuList parses a CPU list of /sys/devices/system/cpu ("0-3,6").
func cpuList(name string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join("/sys/devices/system/cpu", name))
	if err != nil {
		return nil, fmt.Errorf("reading the %s CPUs: %w", name, err)
	}
	var cpus []int
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		z := a
		if err == nil && isRange {
			z, err = strconv.Atoi(hi)
		}
		if err != nil || z < a {
			return nil, fmt.Errorf("parsing the %s CPUs %q", name, b)
		}
		for n := a; n <= z; n++ {
			cpus = append(cpus, n)
		}
	}
	return cpus, nil
}

// startRings registers an entry on every possible CPU's queue (the
// kernel uses the rings only once each has one) and starts serving them.
// Online CPUs get ringThreads threads each, pinned to the CPU where this
// process may run there (a cpuset may keep it off CPUs its callers use);
// offline CPUs' queues share one thread. It returns once every entry is registered, or with the errors;
// a failed REGISTER makes the kernel fall back to /dev/fuse.
func (c *Conn) startRings() error {
	possible, err := cpuList("possible")
	if err != nil {
		return err
	}
	online, err := cpuList("online")
	if err != nil {
		return err
	}
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		return fmt.Errorf("reading this process's CPU affinity: %w", err)
	}
	isOnline := make(map[int]bool, len(online))
	for _, n := range online {
		isOnline[n] = true
	}
	var spare []*ringQueue
	results := make(chan error, len(possible)*ringThreads+1)
	started := 0
	for _, n := range possible {
		q := &ringQueue{qid: n, own: isOnline[n], pinned: isOnline[n] && allowed.IsSet(n)}
		if !q.own {
			spare = append(spare, q)
			continue
		}
		for range ringThreads {
			c.startRingThread([]*ringQueue{q}, results, true)
			started++
		}
	}
	if len(spare) > 0 {
		c.startRingThread(spare, results, true)
		started++
	}
	var errs []error
	for range started {
		if err := <-results; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// startRingThread starts a ring thread with an entry for each of qs,
// counted in their threads unless the caller did; it sends the
// registration's outcome to registered.
func (c *Conn) startRingThread(qs []*ringQueue, registered chan<- error, count bool) {
	for _, q := range qs {
		if count {
			q.threads.Add(1)
		}
	}
	c.readers.Add(1)
	go func() {
		defer c.readers.Done()
		// The thread ends with the goroutine (no UnlockOSThread): it was
		// pinned to a CPU, and io_uring may still name it.
		runtime.LockOSThread()
		if qs[0].pinned {
			var set unix.CPUSet
			set.Set(qs[0].qid)
			if err := unix.SchedSetaffinity(0, &set); err != nil {
				c.log.Warn("a FUSE ring thread could not be pinned to its CPU; it runs unpinned", "cpu", qs[0].qid, "error", err)
			}
		}
		t, err := c.newRingThread(qs)
		registered <- err
		if err != nil {
			return
		}
		t.serve()
	}()
}

// newRingThread sets up a ring and registers one entry for each of qs. It
// runs on the thread that serves them.
func (c *Conn) newRingThread(qs []*ringQueue) (*ringThread, error) {
	if failRingSetup.Load() && qs[0].qid == 0 {
		return nil, errors.New("ring setup failed on purpose (a test)")
	}
	r, err := newUring(uint32(len(qs)), ioringSetupSingleIssuer|ioringSetupDeferTaskrun)
	if err != nil {
		return nil, fmt.Errorf("CPU %d's queue: %w", qs[0].qid, err)
	}
	t := &ringThread{c: c, qs: qs, r: r, ents: make([]ringEnt, len(qs))}
	iovSize := int(unsafe.Sizeof([2]unix.Iovec{}))
	slot := roundUp(uringHdrSize+iovSize, 64)
	payload := c.ringPayload()
	payloads := roundUp(len(qs)*slot, os.Getpagesize())
	// After the payloads, room to rebuild one request (header, struct,
	// up to max_write of data): off Go's heap too, where a megabyte per
	// thread would raise the collector's heap goal by as much, and the
	// daemon's peak memory with it. Untouched pages cost nothing.
	in := roundUp(c.maxWrite+4096, os.Getpagesize())
	t.mem, err = unix.Mmap(-1, 0, payloads+len(qs)*payload+in, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("CPU %d's queue: mapping entry buffers: %w", qs[0].qid, err), r.close())
	}
	t.in = t.mem[payloads+len(qs)*payload:]
	for i := range t.ents {
		e := &t.ents[i]
		base := i * slot
		e.hdr = t.mem[base : base+uringHdrSize : base+uringHdrSize]
		e.iov = (*[2]unix.Iovec)(unsafe.Pointer(&t.mem[base+uringHdrSize]))
		p := payloads + i*payload
		e.payload = t.mem[p : p+payload : p+payload]
		e.iov[0].Base = &e.hdr[0]
		e.iov[0].SetLen(len(e.hdr))
		e.iov[1].Base = &e.payload[0]
		e.iov[1].SetLen(len(e.payload))
		sqe := r.next()
		ringCommand(sqe, c.fd, i, qs[i].qid, uringCmdRegister, 0)
		put64(sqe, sqeOffAddr, uint64(uintptr(unsafe.Pointer(e.iov))))
		put32(sqe, sqeOffLen, 2)
	}
	if err := r.enter(0); err != nil {
		return nil, errors.Join(fmt.Errorf("CPU %d's queue: registering: %w", qs[0].qid, err), t.close())
	}
	// A refused registration completes at once; a taken one stays
	// pending until a request arrives.
	for {
		done, ok := r.pop()
		if !ok {
			return t, nil
		}
		if done.res < 0 {
			return nil, errors.Join(fmt.Errorf("CPU %d's queue: FUSE_IO_URING_CMD_REGISTER: %w", qs[done.userData].qid, syscall.Errno(-done.res)), t.close())
		}
	}
}

func roundUp(n, to int) int { return (n + to - 1) / to * to }

// ringPayload is the size of an entry's payload buffer: the kernel's
// bound on a request's or reply's arguments, which it checks at REGISTER
// (max_write, a request of max_pages pages, and at least 8 KiB). Without
// MAX_PAGES the kernel keeps its default of 32 pages.
func (c *Conn) ringPayload() int {
	page := os.Getpagesize()
	pages := 32
	if c.flags&fuse.CAP_MAX_PAGES != 0 {
		pages = c.maxPages
	}
	return roundUp(max(8192, c.maxWrite, pages*page), page)
}

// ringCommand fills sqe with FUSE ring command cmd for entry i of queue
// qid, on the connection's fd.
func ringCommand(sqe []byte, fd, i, qid int, cmd uint32, commitID uint64) {
	sqe[sqeOffOpcode] = ioringOpURingCmd
	put32(sqe, sqeOffFd, uint32(fd))
	put32(sqe, sqeOffCmdOp, cmd)
	put64(sqe, sqeOffUserData, uint64(i))
	put64(sqe, uringCmdOffCommitID, commitID)
	*(*uint16)(unsafe.Pointer(&sqe[uringCmdOffQid])) = uint16(qid)
}

// serve answers the thread's requests until the connection ends: each
// completion is a request in an entry; it is handled on this goroutine,
// and its COMMIT_AND_FETCH goes with the next wait.
func (t *ringThread) serve() {
	defer func() {
		if err := t.close(); err != nil {
			t.c.log.Warn("closing a FUSE ring", "queue", t.qs[0].qid, "error", err)
		}
	}()
	// The reply's payload (read data, a listing, an xattr value) is built
	// in the entry's own payload buffer (handle), and the request is
	// rebuilt in the thread's mapped buffer.
	b := &buffers{in: t.in, out: make([]byte, outHeaderSize+maxOutStructSize)}
	live := len(t.ents)
	for live > 0 {
		if err := t.r.enter(1); err != nil {
			if !t.c.closed.Load() {
				t.c.log.Error("waiting on a FUSE ring failed; its thread stops, and requests its entries hold wait for the unmount", "cpu", t.qs[0].qid, "error", err)
			}
			for _, q := range t.qs {
				q.threads.Add(-1)
			}
			return
		}
		for {
			done, ok := t.r.pop()
			if !ok {
				break
			}
			i := int(done.userData)
			if i >= len(t.ents) {
				t.c.log.Error("a FUSE ring completion names no entry", "entry", i, "result", done.res)
				continue
			}
			if done.res < 0 {
				// The connection ended (ENOTCONN, or ECONNABORTED after
				// an abort), or the entry was refused; either way the
				// kernel gave it back.
				if errno := syscall.Errno(-done.res); !connectionGone(errno) && !t.c.closed.Load() {
					t.c.log.Error("a FUSE ring entry failed", "cpu", t.qs[i].qid, "error", errno)
				}
				t.qs[i].threads.Add(-1)
				live--
				continue
			}
			q := t.qs[i]
			if q.busy.Add(1) >= q.threads.Load() && q.own {
				t.c.grow(q)
			}
			t.handle(b, &t.ents[i])
			q.busy.Add(-1)
			ringCommand(t.r.next(), t.c.fd, i, q.qid, uringCmdCommitFetch, *(*uint64)(unsafe.Pointer(&t.ents[i].hdr[uringEntOffCommitID])))
		}
	}
}

// grow gives q one more thread, unless it has ringMaxThreads, and waits
// until its entry is registered. The kernel queues a request that finds
// no free entry until one of the queue's entries is committed, and a
// newly registered entry does not take it: so a queue grows when its
// last free entry is taken, before that request is handled.
func (c *Conn) grow(q *ringQueue) {
	for {
		n := q.threads.Load()
		if n >= ringMaxThreads || c.closed.Load() {
			return
		}
		if q.threads.CompareAndSwap(n, n+1) {
			break
		}
	}
	registered := make(chan error, 1)
	c.startRingThread([]*ringQueue{q}, registered, false)
	if err := <-registered; err != nil {
		q.threads.Add(-1)
		var errno syscall.Errno
		if !c.closed.Load() && !(errors.As(err, &errno) && connectionGone(errno)) {
			c.log.Warn("adding a FUSE ring thread failed", "cpu", q.qid, "error", err)
		}
	}
}

// connectionGone reports whether a ring command failed because the
// connection ended (an unmount, the daemon's exit, an abort).
func connectionGone(errno syscall.Errno) bool {
	return errno == unix.ENOTCONN || errno == unix.ECONNABORTED || errno == unix.ECANCELED
}

// handle rebuilds the request in b as /dev/fuse would have delivered it
// (header, fixed struct, variable part), serves it, and leaves the reply
// in the entry.
func (t *ringThread) handle(b *buffers, e *ringEnt) {
	h := (*fuse.InHeader)(unsafe.Pointer(&e.hdr[uringHdrInOut]))
	size := int(*(*uint32)(unsafe.Pointer(&e.hdr[uringEntOffPayloadSz])))
	fixed := int(h.Length) - inHeaderSize - size
	e.replied, e.oversized = false, false
	b.ent, b.payload = e, e.payload
	defer func() { b.ent, b.payload = nil, nil }()
	if fixed < 0 || fixed > uringHdrOpInSize || size > len(e.payload) || int(h.Length) > len(b.in) {
		t.c.log.Error("a FUSE ring request does not add up", "opcode", h.Opcode, "length", h.Length, "payload", size)
		t.c.reply(b, h.Unique, syscall.EIO, 0)
		return
	}
	raw := b.in[:h.Length]
	copy(raw, e.hdr[:inHeaderSize])
	copy(raw[inHeaderSize:], e.hdr[uringHdrOpIn:uringHdrOpIn+fixed])
	copy(raw[inHeaderSize+fixed:], e.payload[:size])
	// The kernel orders requests that depend on each other (a RELEASEDIR
	// comes after the READDIR's reply), and io_uring_enter(2) is a full
	// barrier; but the race detector does not see through system calls.
	// The load and the add, on one counter of the connection, show it
	// that a handler runs after every handler that returned before its
	// request was read (the readers of /dev/fuse get the same from their
	// counters).
	t.c.ringRequests.Load()
	t.c.handle(b, raw)
	t.c.ringRequests.Add(1)
	if e.oversized {
		t.c.log.Error("a reply larger than a ring entry's payload was answered EIO", "opcode", h.Opcode, "payload", len(e.payload))
	}
	if !e.replied {
		// Every ring request must be committed; one the dispatcher
		// takes no reply to (a FORGET, which the kernel never sends
		// here) gets one anyway.
		t.c.reply(b, h.Unique, syscall.ENOSYS, 0)
	}
}

// put writes a reply into the entry: the out header into in_out, the
// struct and data into the payload.
func (e *ringEnt) put(parts ...[]byte) syscall.Errno {
	copy(e.hdr[uringHdrInOut:], parts[0])
	n := 0
	for _, p := range parts[1:] {
		if n+len(p) > len(e.payload) {
			// Larger than the kernel's own bound on a reply: answer
			// EIO rather than a truncated reply.
			h := (*fuse.OutHeader)(unsafe.Pointer(&e.hdr[uringHdrInOut]))
			h.Length, h.Status = uint32(outHeaderSize), -int32(syscall.EIO)
			n = 0
			e.oversized = true
			break
		}
		n += copy(e.payload[n:], p)
	}
	*(*uint32)(unsafe.Pointer(&e.hdr[uringEntOffPayloadSz])) = uint32(n)
	e.replied = true
	return 0
}

func (t *ringThread) close() error {
	var errs []error
	if t.mem != nil {
		errs = append(errs, unix.Munmap(t.mem))
	}
	errs = append(errs, t.r.close())
	return errors.Join(errs...)
}

// refuseRings makes the kernel give up on the rings after some queue
// could not be registered: until every queue has an entry it holds every
// request, and only a failed registration makes it serve /dev/fuse
// instead. A queue ID no CPU has is refused. When even that fails, the
// caller must abort the connection.
func (c *Conn) refuseRings() error {
	r, err := newUring(1, 0)
	if err != nil {
		return err
	}
	defer r.close()
	// The kernel checks the queue ID before it reads the buffers.
	ringCommand(r.next(), c.fd, 0, 1<<16-1, uringCmdRegister, 0)
	if err := r.enter(1); err != nil {
		return fmt.Errorf("submitting the refused registration: %w", err)
	}
	done, ok := r.pop()
	if !ok || done.res >= 0 {
		return fmt.Errorf("the kernel took a FUSE ring registration meant to be refused (completed: %v, result %d)", ok, done.res)
	}
	return nil
}
