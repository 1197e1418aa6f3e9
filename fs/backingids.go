package fs

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"

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
// One pwrite per registration and one per release keep it: against a
// FUSE open's round trip, noise. The kernel hands IDs out cyclically, so
// the IDs live at once share a slot only past a million of them; the
// later one then wins, and an open of the other's inode after a takeover
// gets EIO, which the takeover logs.
const (
	backingSlots      = 1 << 20
	backingRecordSize = 32
)

// backingFile identifies a backing file.
type backingFile struct{ dev, ino uint64 }

// backingIDs is go-fuse's fs.ServerCallbacks over a connection, which
// records the backing files it registers and, after a takeover, reuses
// the IDs of the ones an earlier daemon registered.
type backingIDs struct {
	*transport.Conn
	f *os.File

	mu sync.Mutex
	// inherited are the earlier daemons' registrations. They stay for
	// the connection's life: files those daemons opened may still use
	// them, and the kernel refuses an open of the same inode with any
	// other. Each holds its file, so its inode number is not reused.
	inherited map[backingFile]int32
	// pinned are the IDs of inherited, never unregistered.
	pinned map[int32]bool
}

// openBackingIDs opens the record in dataDir: a fresh one for a fresh
// connection, the earlier daemon's when adopting.
func openBackingIDs(conn *transport.Conn, dataDir string, adopting bool) (*backingIDs, error) {
	b := &backingIDs{Conn: conn, inherited: make(map[backingFile]int32), pinned: make(map[int32]bool)}
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
	b.f = f
	if adopting {
		if err := b.load(); err != nil {
			f.Close()
			return nil, err
		}
	}
	return b, nil
}

func (b *backingIDs) load() error {
	buf := make([]byte, 1<<16)
	for off := int64(0); ; {
		n, err := b.f.ReadAt(buf, off)
		for i := 0; i+backingRecordSize <= n; i += backingRecordSize {
			r := buf[i : i+backingRecordSize]
			if id := int32(binary.LittleEndian.Uint32(r)); id > 0 {
				b.inherited[backingFile{binary.LittleEndian.Uint64(r[8:]), binary.LittleEndian.Uint64(r[16:])}] = id
				b.pinned[id] = true
			}
		}
		off += int64(n)
		if err != nil || n == 0 {
			return nil
		}
	}
}

// write puts the record of id (bf; the zero backingFile frees it) in
// id's slot.
func (b *backingIDs) write(id int32, bf backingFile) {
	var r [backingRecordSize]byte
	if bf != (backingFile{}) {
		binary.LittleEndian.PutUint32(r[:], uint32(id))
		binary.LittleEndian.PutUint64(r[8:], bf.dev)
		binary.LittleEndian.PutUint64(r[16:], bf.ino)
	}
	b.f.WriteAt(r[:], int64(id%backingSlots)*backingRecordSize)
}

// Close closes the record; it stays on disk for a daemon that takes the
// connection over.
func (b *backingIDs) Close() error { return b.f.Close() }

// RegisterBackingFd registers m.Fd, or returns the ID an earlier daemon
// registered for the same file, every time.
func (b *backingIDs) RegisterBackingFd(m *fuse.BackingMap) (int32, syscall.Errno) {
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
func (b *backingIDs) UnregisterBackingFd(id int32) syscall.Errno {
	b.mu.Lock()
	pinned := b.pinned[id]
	b.mu.Unlock()
	if pinned {
		return 0
	}
	// The record goes first: one that outlived its ID would have a later
	// daemon refuse every passthrough open of the file.
	var r [backingRecordSize]byte
	if _, err := b.f.ReadAt(r[:], int64(id%backingSlots)*backingRecordSize); err == nil && int32(binary.LittleEndian.Uint32(r[:])) == id {
		b.write(id, backingFile{})
	}
	return b.Conn.UnregisterBackingFd(id)
}
