package restart

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/allocfs/allocfs/fs/transport"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// Passthrough backing files belong to the connection, not the daemon: a
// file opened for passthrough keeps reading and writing while no daemon
// runs. But the kernel binds one backing file to a FUSE inode, and
// refuses a passthrough open of an inode that is open with another
// (EBUSY, which the opener sees as EIO): a daemon that took the
// connection over must open such an inode with the backing ID the
// earlier daemon registered. So every registration is recorded in
// <data-dir>/fuse/backing, by the backing file's device and inode
// number, and a daemon that takes over reuses the IDs it finds there.
//
// The record is a table of backingSlots slots of backingRecordSize bytes,
// at slot id % backingSlots:
//
//	id     uint32  the kernel's backing ID (0: the slot is free)
//	_      uint32
//	dev    uint64  st_dev of the backing file
//	ino    uint64  st_ino of the backing file
//	_      uint64
//
// The file is a shared mapping, as the record of outcomes is (outcomes.go):
// a registration or a release is three stores to memory, no system call,
// and what was stored survives the daemon's death in the page cache. A
// record's ID is stored last and cleared first, so a record whose ID is
// there is whole. The kernel hands IDs out cyclically, so
// the IDs live at once share a slot only past a million of them; the
// later one then wins, and an open of the other's inode after a takeover
// gets EIO, which the takeover logs.
const (
	backingSlots      = 1 << 20
	backingRecordSize = 32
)

// backingFile identifies a backing file.
type backingFile struct{ dev, ino uint64 }

// BackingIDs is go-fuse's fs.ServerCallbacks over a connection, which
// records the backing files it registers and, after a takeover, reuses
// the IDs of the ones an earlier daemon registered.
type BackingIDs struct {
	*transport.Conn

	// mapMu guards mem against Close: a release that comes after it
	// finds nil, and records nothing.
	mapMu sync.RWMutex
	mem   []byte

	mu sync.Mutex
	// inherited are the earlier daemons' registrations. They stay for
	// the connection's life: files those daemons opened may still use
	// them, and the kernel refuses an open of the same inode with any
	// other. Each holds its file, so its inode number is not reused.
	inherited map[backingFile]int32
	// pinned are the IDs of inherited, never unregistered.
	pinned map[int32]bool
}

// OpenBackingIDs opens the record in dataDir: a fresh one for a fresh
// connection, the earlier daemon's when adopting.
func OpenBackingIDs(conn *transport.Conn, dataDir string, adopting bool) (*BackingIDs, error) {
	b := &BackingIDs{Conn: conn, inherited: make(map[backingFile]int32), pinned: make(map[int32]bool)}
	path := StateFile(dataDir, "backing")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	flags := os.O_RDWR | os.O_CREATE
	if !adopting {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("failed to open the record of backing files: %w", err)
	}
	defer f.Close()
	size := backingSlots * backingRecordSize
	// A record an earlier daemon wrote with pwrite(2) ends at its last
	// slot; the rest reads as free slots.
	if err := f.Truncate(int64(size)); err != nil {
		return nil, fmt.Errorf("failed to size the record of backing files: %w", err)
	}
	if adopting {
		if err := b.load(f); err != nil {
			return nil, err
		}
	}
	if b.mem, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("failed to map the record of backing files: %w", err)
	}
	// Slots are touched one at a time, far apart: without this, a fault
	// may bring in a large folio of the file, megabytes of the daemon's
	// memory for a 32-byte record.
	if err := unix.Madvise(b.mem, unix.MADV_RANDOM); err != nil {
		unix.Munmap(b.mem)
		return nil, fmt.Errorf("failed to advise the kernel on the record of backing files: %w", err)
	}
	return b, nil
}

// load reads the earlier daemons' registrations from f. Reading the file
// skips its holes, where a walk of the mapping would fault in every page.
func (b *BackingIDs) load(f *os.File) error {
	buf := make([]byte, 1<<16)
	for off := int64(0); ; {
		n, err := f.ReadAt(buf, off)
		for i := 0; i+backingRecordSize <= n; i += backingRecordSize {
			r := buf[i : i+backingRecordSize]
			if id := int32(binary.LittleEndian.Uint32(r)); id > 0 {
				b.inherited[backingFile{binary.LittleEndian.Uint64(r[8:]), binary.LittleEndian.Uint64(r[16:])}] = id
				b.pinned[id] = true
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) || n == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("failed to read the record of backing files: %w", err)
		}
	}
}

// slot returns id's record's fields, or nil once the record is closed;
// the caller holds mapMu for reading.
func (b *BackingIDs) slot(id int32) (rid *uint32, dev, ino *uint64) {
	if b.mem == nil {
		return nil, nil, nil
	}
	p := unsafe.Pointer(&b.mem[int64(uint32(id)%backingSlots)*backingRecordSize])
	return (*uint32)(p), (*uint64)(unsafe.Add(p, 8)), (*uint64)(unsafe.Add(p, 16))
}

// write puts the record of id (bf) in id's slot, its ID last.
func (b *BackingIDs) write(id int32, bf backingFile) {
	b.mapMu.RLock()
	defer b.mapMu.RUnlock()
	rid, dev, ino := b.slot(id)
	if rid == nil {
		return
	}
	atomic.StoreUint32(rid, 0)
	atomic.StoreUint64(dev, bf.dev)
	atomic.StoreUint64(ino, bf.ino)
	atomic.StoreUint32(rid, uint32(id))
}

// free clears id's slot if it holds id's record.
func (b *BackingIDs) free(id int32) {
	b.mapMu.RLock()
	defer b.mapMu.RUnlock()
	if rid, _, _ := b.slot(id); rid != nil {
		atomic.CompareAndSwapUint32(rid, uint32(id), 0)
	}
}

// Close unmaps the record; it stays on disk for a daemon that takes the
// connection over.
func (b *BackingIDs) Close() error {
	b.mapMu.Lock()
	defer b.mapMu.Unlock()
	if b.mem == nil {
		return nil
	}
	err := unix.Munmap(b.mem)
	b.mem = nil
	if err != nil {
		return fmt.Errorf("failed to unmap the record of backing files: %w", err)
	}
	return nil
}

// RegisterBackingFd registers m.Fd, or returns the ID an earlier daemon
// registered for the same file, every time.
func (b *BackingIDs) RegisterBackingFd(m *fuse.BackingMap) (int32, syscall.Errno) {
	var st unix.Stat_t
	if err := unix.Fstat(int(m.Fd), &st); err != nil {
		return 0, err.(syscall.Errno)
	}
	bf := backingFile{st.Dev, st.Ino}
	b.mu.Lock()
	id, ok := b.inherited[bf]
	b.mu.Unlock()
	if ok {
		return id, 0
	}
	id, errno := b.Conn.RegisterBackingFd(m)
	if errno == 0 {
		b.write(id, bf)
	}
	return id, errno
}

// UnregisterBackingFd drops a registration and its record; an
// inherited one stays.
func (b *BackingIDs) UnregisterBackingFd(id int32) syscall.Errno {
	b.mu.Lock()
	pinned := b.pinned[id]
	b.mu.Unlock()
	if pinned {
		return 0
	}
	// The record goes first: one that outlived its ID would have a later
	// daemon refuse every passthrough open of the file.
	b.free(id)
	return b.Conn.UnregisterBackingFd(id)
}
