package fs

import (
	"context"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// memHandle is the handle of an open memory file: reads and writes go to
// the node, but go-fuse tells the node of a release only when the open
// returned a handle, and the last release frees an unlinked file.
type memHandle struct {
	// flushed is set by the FLUSH a close() sends and cleared by a read
	// or write after it: a handle flushed and idle is, but for a dup'd
	// descriptor or a mapping, one whose RELEASE is on its way.
	flushed atomic.Bool
	// waitedFor is set, under the node's lock, once an unlink has waited
	// for this handle's release in vain: it is not waited for again.
	waitedFor bool
}

var _ = (gofs.FileFlusher)((*memHandle)(nil))

func (h *memHandle) Flush(ctx context.Context) syscall.Errno {
	h.flushed.Store(true)
	return 0
}

// used records that the handle serves a descriptor still open.
func used(fh gofs.FileHandle) {
	if h, ok := fh.(*memHandle); ok {
		h.flushed.Store(false)
	}
}

// releaseWait bounds how long an unlink waits for the releases of
// handles that are flushed and idle. The kernel sends a RELEASE after
// close() has returned, as a background request, so it can reach the
// daemon after the caller's next requests; tmpfs frees an unlinked file
// at its last close, and a statfs or a create just after "close, unlink"
// must see what tmpfs would. A release on its way arrives in
// microseconds, or a few milliseconds on a loaded machine; the bound is
// what a handle kept by a dup'd descriptor or a mapping costs, once.
const releaseWait = 250 * time.Millisecond

// memFile is a regular file held in memory, in pages allocated on first
// write; each page counts against the volume's byte cap.
type memFile struct {
	memNode
	pages    map[int64][]byte // page index to memPageSize bytes
	fileSize int64
	// handles are the open handles, as many as memNode.opens.
	handles map[*memHandle]struct{}
	// released is closed, and replaced, at each release.
	released chan struct{}
}

var _ = (memContent)((*memFile)(nil))

func (f *memFile) clear() (bytes, entry int64) {
	bytes, entry = f.memNode.clear()
	f.mu.Lock()
	defer f.mu.Unlock()
	bytes += int64(len(f.pages)) * memPageSize
	f.pages, f.fileSize = nil, 0
	return bytes, entry
}

var _ = (gofs.NodeOpener)((*memFile)(nil))

// Open returns a handle only so that go-fuse reports its release: reads
// and writes go to the node. Direct I/O keeps the kernel from caching
// secrets in the page cache of the mount.
func (f *memFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 {
		f.truncate(0, true)
	}
	return f.openLocked(), fuse.FOPEN_DIRECT_IO, 0
}

// openLocked makes a handle of f; f.mu is held.
func (f *memFile) openLocked() *memHandle {
	h := &memHandle{}
	if f.handles == nil {
		f.handles = make(map[*memHandle]struct{})
		f.released = make(chan struct{})
	}
	f.handles[h] = struct{}{}
	f.opens++
	return h
}

var _ = (gofs.NodeReleaser)((*memFile)(nil))

// Release frees a file unlinked while open at its last close.
func (f *memFile) Release(ctx context.Context, fh gofs.FileHandle) syscall.Errno {
	f.mu.Lock()
	f.opens--
	if h, ok := fh.(*memHandle); ok {
		delete(f.handles, h)
	}
	close(f.released)
	f.released = make(chan struct{})
	gone := f.takeFree()
	f.mu.Unlock()
	if gone {
		f.v.free(f)
	}
	return 0
}

var _ = (gofs.NodeReader)((*memFile)(nil))

func (f *memFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	used(fh)
	f.mu.Lock()
	defer f.mu.Unlock()
	if off < 0 {
		return nil, syscall.EINVAL
	}
	if off >= f.fileSize {
		return fuse.ReadResultData(nil), 0
	}
	out := make([]byte, min(int64(len(dest)), f.fileSize-off))
	for n := 0; n < len(out); {
		pos := off + int64(n)
		in := pos % memPageSize
		if pg := f.pages[pos/memPageSize]; pg != nil {
			n += copy(out[n:], pg[in:])
		} else {
			n += min(len(out)-n, int(memPageSize-in)) // a hole reads as zeros
		}
	}
	return fuse.ReadResultData(out), 0
}

var _ = (gofs.NodeWriter)((*memFile)(nil))

// Write allocates the pages it touches; when the byte cap runs out midway
// it reports the bytes written so far, and the next write gets ENOSPC, as
// on tmpfs.
func (f *memFile) Write(ctx context.Context, fh gofs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	used(fh)
	f.mu.Lock()
	defer f.mu.Unlock()
	if off < 0 {
		return 0, syscall.EINVAL
	}
	n := 0
	for n < len(data) {
		pos := off + int64(n)
		pg := f.pages[pos/memPageSize]
		if pg == nil {
			if errno := f.v.charge(memPageSize, 0); errno != 0 {
				if n == 0 {
					return 0, errno
				}
				break
			}
			pg = make([]byte, memPageSize)
			if f.pages == nil {
				f.pages = make(map[int64][]byte)
			}
			f.pages[pos/memPageSize] = pg
		}
		n += copy(pg[pos%memPageSize:], data[n:])
	}
	f.fileSize = max(f.fileSize, off+int64(n))
	now := time.Now()
	f.attr.mtime, f.attr.ctime = now, now
	// The mount handles killpriv (HANDLE_KILLPRIV_V2), so the daemon
	// drops the set-id bits on a write whose writer lacks CAP_FSETID,
	// as the kernel flags it (killpriv.go), as tmpfs does; never on
	// the writeback of a shared mapping.
	if writeKills(ctx) {
		f.attr.killSetid()
	}
	return uint32(n), 0
}

// truncate sets the file's size; f.mu is held. Growing allocates nothing
// (the new range is a hole); shrinking frees the pages past the end and
// zeroes the tail of the last one, so that growing again reads zeros. As
// on tmpfs, times change only when the size does, unless an open with
// O_TRUNC asks (always).
func (f *memFile) truncate(size int64, always bool) {
	if size == f.fileSize && !always {
		return
	}
	if size < f.fileSize {
		keep := (size + memPageSize - 1) / memPageSize
		freed := int64(0)
		for i := range f.pages {
			if i >= keep {
				delete(f.pages, i)
				freed++
			}
		}
		if pg := f.pages[size/memPageSize]; pg != nil {
			clear(pg[size%memPageSize:])
		}
		f.v.release(freed*memPageSize, 0)
	}
	f.fileSize = size
	now := time.Now()
	f.attr.mtime, f.attr.ctime = now, now
}

func (f *memFile) fillAttr(out *fuse.Attr) {
	f.attr.fill(out, f.StableAttr().Ino, uint64(f.fileSize), f.nlink)
	out.Blocks = uint64(len(f.pages)) * (memPageSize / 512)
}

var _ = (gofs.NodeGetattrer)((*memFile)(nil))

func (f *memFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fillAttr(&out.Attr)
	return 0
}

var _ = (gofs.NodeSetattrer)((*memFile)(nil))

func (f *memFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	if size, ok := in.GetSize(); ok {
		f.truncate(int64(size), false)
	}
	f.attr.setattr(in)
	f.fillAttr(&out.Attr)
	return 0
}

var _ = (gofs.NodeAllocater)((*memFile)(nil))

// Allocate is fallocate as tmpfs has it: allocating a range charges all
// of its missing pages or, when they do not fit, none (ENOSPC, nothing
// changed); punching a hole frees the pages it covers whole and zeroes
// the rest. The kernel has already refused a punch without KEEP_SIZE.
func (f *memFile) Allocate(ctx context.Context, fh gofs.FileHandle, off, size uint64, mode uint32) syscall.Errno {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := int64(off + size)
	switch mode {
	case 0, fallocKeepSize:
		first, last := int64(off)/memPageSize, (end-1)/memPageSize
		missing := int64(0)
		for i := first; i <= last; i++ {
			if f.pages[i] == nil {
				missing++
			}
		}
		if errno := f.v.charge(missing*memPageSize, 0); errno != 0 {
			return errno
		}
		if f.pages == nil {
			f.pages = make(map[int64][]byte)
		}
		for i := first; i <= last; i++ {
			if f.pages[i] == nil {
				f.pages[i] = make([]byte, memPageSize)
			}
		}
		if mode == 0 && end > f.fileSize {
			f.fileSize = end
		}
	case fallocPunchHole | fallocKeepSize:
		end = min(end, f.fileSize)
		freed := int64(0)
		for pos := int64(off); pos < end; {
			i, in := pos/memPageSize, pos%memPageSize
			n := min(memPageSize-in, end-pos)
			if pg := f.pages[i]; pg != nil {
				if n == memPageSize {
					delete(f.pages, i)
					freed++
				} else {
					clear(pg[in : in+n])
				}
			}
			pos += n
		}
		f.v.release(freed*memPageSize, 0)
	default:
		return syscall.EOPNOTSUPP
	}
	now := time.Now()
	f.attr.mtime, f.attr.ctime = now, now
	return 0
}

var _ = (gofs.NodeFsyncer)((*memFile)(nil))

// Fsync has nothing to flush: memory is the only copy, by design.
func (f *memFile) Fsync(ctx context.Context, fh gofs.FileHandle, flags uint32) syscall.Errno {
	return 0
}

// memLink is a symbolic link in a memory tree.
type memLink struct {
	memNode
	target []byte
}

var _ = (memContent)((*memLink)(nil))

func (l *memLink) clear() (bytes, entry int64) {
	bytes, entry = l.memNode.clear()
	l.mu.Lock()
	defer l.mu.Unlock()
	bytes += int64(len(l.target))
	l.target = nil
	return bytes, entry
}

// readlink returns the link's target.
func (l *memLink) readlink() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.target
}

var _ = (gofs.NodeReadlinker)((*memLink)(nil))

func (l *memLink) Readlink(ctx context.Context) ([]byte, syscall.Errno) { return l.readlink(), 0 }

// awaitClosing waits, up to releaseWait, for the releases of f's handles
// when every one left is flushed and idle, and reports whether f is then
// unreachable and still to be freed, as takeFree does. It is called once
// f has lost its last link, with no lock held.
func (f *memFile) awaitClosing() bool {
	deadline := time.NewTimer(releaseWait)
	defer deadline.Stop()
	f.mu.Lock()
	defer f.mu.Unlock()
	for f.nlink == 0 && f.opens > 0 && f.allClosingLocked() {
		released := f.released
		f.mu.Unlock()
		select {
		case <-released:
			f.mu.Lock()
		case <-deadline.C:
			f.mu.Lock()
			for h := range f.handles {
				h.waitedFor = true
			}
			return f.takeFree()
		}
	}
	return f.takeFree()
}

// allClosingLocked reports whether f's every open handle is flushed and
// idle and has not been waited for before; f.mu is held.
func (f *memFile) allClosingLocked() bool {
	for h := range f.handles {
		if !h.flushed.Load() || h.waitedFor {
			return false
		}
	}
	return len(f.handles) == f.opens
}
