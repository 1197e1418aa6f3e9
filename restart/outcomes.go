package restart

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Requests answered once. A daemon that dies after a handler ran and
// before its reply reached the kernel leaves the request "in flight";
// the next daemon has it resent (FUSE_NOTIFY_RESEND, takeover.go) and
// would run it again. For most requests that is harmless; for those
// that change the namespace it is not: a second mkdir finds the first
// one's directory (EEXIST), a second unlink finds nothing (ENOENT), and
// the caller sees an error for what succeeded. So every daemon records
// the outcome of each such request, keyed by its unique, before the
// reply goes, in <data-dir>/fuse/outcomes; a resent request (the top bit
// of its unique set) whose outcome is recorded is answered from the
// record: its status, and for a request that made an entry, a lookup of
// that entry. The window left is between a handler's return and its
// record: two stores to a shared mapping.
//
// The file is a table of outcomeSlots slots of 16 bytes, at slot
// (unique/2) % outcomeSlots (the kernel steps uniques by 2):
//
//	unique  uint64  the request's unique (0: none)
//	result  uint64  opcode << 32 | uint32(status)
//
// It is a shared mapping of a file in the page cache: a record survives
// the daemon's death (the kernel writes it back), and a crash of the
// machine ends the connection and the need for it alike.
const (
	outcomeSlots      = 1 << 16
	outcomeRecordSize = 16
	// uniqueResend marks a request the kernel sends again
	// (FUSE_UNIQUE_RESEND).
	uniqueResend = uint64(1) << 63
)

// Opcodes of the requests whose outcome is recorded.
const (
	outMknod   = 8
	outMkdir   = 9
	outUnlink  = 10
	outRmdir   = 11
	outRename  = 12
	outLink    = 13
	outCreate  = 35
	outSymlink = 6
)

// Outcomes records the outcomes of the namespace requests it passes on,
// and answers resent ones it has a record of.
type Outcomes struct {
	fuse.RawFileSystem
	mem []byte
}

// OpenOutcomes maps the record in dataDir: an empty one for a fresh
// connection, the earlier daemons' when adopting.
func OpenOutcomes(next fuse.RawFileSystem, dataDir string, adopting bool) (*Outcomes, error) {
	path := StateFile(dataDir, "outcomes")
	flags := os.O_RDWR | os.O_CREATE
	if !adopting {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open the record of request outcomes: %w", err)
	}
	defer f.Close()
	size := outcomeSlots * outcomeRecordSize
	if err := f.Truncate(int64(size)); err != nil {
		return nil, fmt.Errorf("failed to size the record of request outcomes: %w", err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("failed to map the record of request outcomes: %w", err)
	}
	return &Outcomes{RawFileSystem: next, mem: mem}, nil
}

// close unmaps the record.
// Close unmaps the record.
func (o *Outcomes) Close() error { return unix.Munmap(o.mem) }

func (o *Outcomes) slot(unique uint64) (*uint64, *uint64) {
	p := unsafe.Pointer(&o.mem[(unique>>1)%outcomeSlots*outcomeRecordSize])
	return (*uint64)(p), (*uint64)(unsafe.Add(p, 8))
}

// record notes that request unique, of opcode op, ended with st. The
// result goes first: a record whose unique is there is whole.
func (o *Outcomes) record(h *fuse.InHeader, op uint32, st fuse.Status) {
	key := h.Unique &^ uniqueResend
	u, r := o.slot(key)
	atomic.StoreUint64(u, 0)
	atomic.StoreUint64(r, uint64(op)<<32|uint64(uint32(int32(st))))
	atomic.StoreUint64(u, key)
}

// recorded returns the outcome of a resent request, if an earlier daemon
// recorded one.
func (o *Outcomes) recorded(h *fuse.InHeader, op uint32) (fuse.Status, bool) {
	if h.Unique&uniqueResend == 0 {
		return 0, false
	}
	want := h.Unique &^ uniqueResend
	u, r := o.slot(want)
	res := atomic.LoadUint64(r)
	if atomic.LoadUint64(u) != want || uint32(res>>32) != op {
		return 0, false
	}
	return fuse.Status(int32(uint32(res))), true
}

// entry answers a resent request that made name in its parent, from the
// record: the status, or a lookup of what it made.
func (o *Outcomes) entry(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut, st fuse.Status) fuse.Status {
	if st != fuse.OK {
		return st
	}
	return o.RawFileSystem.Lookup(cancel, h, name, out)
}

func (o *Outcomes) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	if st, ok := o.recorded(&in.InHeader, outMknod); ok {
		return o.entry(cancel, &in.InHeader, name, out, st)
	}
	st := o.RawFileSystem.Mknod(cancel, in, name, out)
	o.record(&in.InHeader, outMknod, st)
	return st
}

func (o *Outcomes) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	if st, ok := o.recorded(&in.InHeader, outMkdir); ok {
		return o.entry(cancel, &in.InHeader, name, out, st)
	}
	st := o.RawFileSystem.Mkdir(cancel, in, name, out)
	o.record(&in.InHeader, outMkdir, st)
	return st
}

func (o *Outcomes) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	if st, ok := o.recorded(h, outSymlink); ok {
		return o.entry(cancel, h, name, out, st)
	}
	st := o.RawFileSystem.Symlink(cancel, h, target, name, out)
	o.record(h, outSymlink, st)
	return st
}

func (o *Outcomes) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	if st, ok := o.recorded(&in.InHeader, outLink); ok {
		return o.entry(cancel, &in.InHeader, name, out, st)
	}
	st := o.RawFileSystem.Link(cancel, in, name, out)
	o.record(&in.InHeader, outLink, st)
	return st
}

func (o *Outcomes) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if st, ok := o.recorded(h, outUnlink); ok {
		return st
	}
	st := o.RawFileSystem.Unlink(cancel, h, name)
	o.record(h, outUnlink, st)
	return st
}

func (o *Outcomes) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if st, ok := o.recorded(h, outRmdir); ok {
		return st
	}
	st := o.RawFileSystem.Rmdir(cancel, h, name)
	o.record(h, outRmdir, st)
	return st
}

// Rename covers RENAME and RENAME2, which go-fuse's bridge takes alike.
func (o *Outcomes) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if st, ok := o.recorded(&in.InHeader, outRename); ok {
		return st
	}
	st := o.RawFileSystem.Rename(cancel, in, oldName, newName)
	o.record(&in.InHeader, outRename, st)
	return st
}

// Create of a resent request that made its file opens it again: the
// handle the dead daemon opened went with it.
func (o *Outcomes) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if st, ok := o.recorded(&in.InHeader, outCreate); ok {
		if st := o.entry(cancel, &in.InHeader, name, &out.EntryOut, st); st != fuse.OK {
			return st
		}
		open := &fuse.OpenIn{InHeader: in.InHeader, Flags: in.Flags &^ (syscall.O_CREAT | syscall.O_EXCL | syscall.O_TRUNC)}
		open.NodeId = out.NodeId
		return o.RawFileSystem.Open(cancel, open, &out.OpenOut)
	}
	st := o.RawFileSystem.Create(cancel, in, name, out)
	o.record(&in.InHeader, outCreate, st)
	return st
}
