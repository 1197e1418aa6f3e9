package layer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"strings"
	"sync"
	"syscall"
)

// Removals are the paths of a host layer that a task removed: Nomad's GC
// unlinks every entry of a chroot one by one, and a whiteout for each (an
// inode made, and removed again with its directory) cost more than the
// whole GC takes on ext4. A host layer's entry is no layer's file, and
// overlayfs could never show it, so hiding it needs no mark in overlayfs's
// format: one record appended to a log beside the layer does, one write(2)
// into the page cache, as durable as the unlink ext4 makes without an
// fsync (a crash of the daemon keeps it; Sync makes it survive a power
// cut).
//
// A record hides the host layer's entry at its path and everything below
// it, never what the upper layer holds there: a name made again after its
// removal shows the upper entry alone, as an opaque directory would. So a
// directory's record makes its children's redundant, and they are dropped:
// once a removal took a whole tree, its log holds its top.
//
// The log is a sequence of records, each the path's length (4 bytes,
// little-endian), the CRC-32C of the path (4 bytes), and the path,
// relative to the volume root. A record cut short or damaged (a crash in
// the middle of a write, or a power cut before the data reached the disk)
// ends the log: everything after it is truncated at load, so that the
// next append starts where the good records end. When the log grows to
// several times what it holds, it is written anew beside itself and
// renamed over itself, so that a crash leaves the old log or the new one.
type Removals struct {
	path string

	mu   sync.Mutex
	root removedNode
	// f is the log, open for appending once the first record is
	// written; size is its length, live the length its records would
	// take written anew.
	f          *os.File
	size, live int64
	// durable says whether a Sync covered the log, so that writing it
	// anew must make the new one durable before it replaces it.
	durable bool
}

type removedNode struct {
	removed bool
	kids    map[string]*removedNode
	// changes counts the removals recorded in the directory (Changes).
	changes uint64
}

// recordHeader is the length and checksum in front of each path.
const recordHeader = 8

// compactMin is the log size below which it is never written anew.
const compactMin = 1 << 20

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// OpenRemovals reads the log at path (none there: no removals), dropping
// a damaged tail.
func OpenRemovals(path string) (*Removals, error) {
	r := &Removals{path: path}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("failed to read the removals of a host layer: %w", err)
	}
	off := 0
	for off+recordHeader <= len(data) {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		end := off + recordHeader + n
		if n == 0 || end > len(data) || crc32.Checksum(data[off+recordHeader:end], castagnoli) != sum {
			break
		}
		r.add(string(data[off+recordHeader : end]))
		off = end
	}
	if off < len(data) {
		if err := os.Truncate(path, int64(off)); err != nil {
			return nil, fmt.Errorf("failed to drop the damaged tail of the removals of a host layer: %w", err)
		}
	}
	r.size = int64(off)
	return r, nil
}

// Path is where the log lives.
func (r *Removals) Path() string { return r.path }

// Hides reports whether the host layer's entry at rel, or a directory
// above it, was removed.
func (r *Removals) Hides(rel string) bool {
	if r == nil {
		return false
	}
	rel = cleanRel(rel)
	r.mu.Lock()
	defer r.mu.Unlock()
	n := &r.root
	for rel != "" {
		var name string
		name, rel, _ = strings.Cut(rel, "/")
		if n = n.kids[name]; n == nil {
			return false
		}
		if n.removed {
			return true
		}
	}
	return false
}

// Changes counts the removals recorded in the host layer's directory rel
// so far: a count of its entries taken at one number holds while it is
// the same.
func (r *Removals) Changes(rel string) uint64 {
	if r == nil {
		return 0
	}
	rel = cleanRel(rel)
	r.mu.Lock()
	defer r.mu.Unlock()
	n := &r.root
	for rel != "" && n != nil {
		var name string
		name, rel, _ = strings.Cut(rel, "/")
		n = n.kids[name]
	}
	if n == nil {
		return 0
	}
	return n.changes
}

// HiddenIn returns what tells whether a name of the host layer's
// directory rel was removed; nil when none was. Each answer is a map
// lookup, so that listing a directory of n entries, between removals of
// each, costs n, never n squared.
func (r *Removals) HiddenIn(rel string) func(name string) bool {
	if r == nil {
		return nil
	}
	rel = cleanRel(rel)
	r.mu.Lock()
	defer r.mu.Unlock()
	n := &r.root
	for rel != "" && n != nil {
		var name string
		name, rel, _ = strings.Cut(rel, "/")
		n = n.kids[name]
	}
	if n == nil || n.removed || n.changes == 0 {
		return nil
	}
	return func(name string) bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		// The directory's own removal, recorded since (an OPENDIR is
		// served beside the RMDIR of its directory), dropped its
		// children's records: it hides them all.
		k := n.kids[name]
		return n.removed || (k != nil && k.removed)
	}
}

// Remove records that the host layer's entry at rel is gone, with all
// that lies below it. The record is written before it is taken into
// account, so that what a task was told is gone stays gone.
func (r *Removals) Remove(rel string) error {
	rel = cleanRel(rel)
	if rel == "" {
		return fmt.Errorf("failed to record a removal from a host layer: %w", syscall.EINVAL)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.open(); err != nil {
		return err
	}
	rec := record(rel)
	if _, err := r.f.Write(rec); err != nil {
		// A short write leaves a damaged record, which the next load
		// drops; the appends after it would follow it, and be lost
		// with it.
		return errors.Join(fmt.Errorf("failed to record the removal of %q from a host layer: %w", rel, err), r.truncateLocked())
	}
	r.size += int64(len(rec))
	r.add(rel)
	if r.size > compactMin && r.size > 4*r.live {
		return r.compactLocked()
	}
	return nil
}

// Sync makes the records written so far durable.
func (r *Removals) Sync() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	if err := r.f.Sync(); err != nil {
		return fmt.Errorf("failed to sync the removals of a host layer: %w", err)
	}
	r.durable = true
	return nil
}

// Close closes the log; a later Remove opens it again.
func (r *Removals) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
	return err
}

func (r *Removals) open() error {
	if r.f != nil {
		return nil
	}
	f, err := os.OpenFile(r.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("failed to open the removals of a host layer: %w", err)
	}
	r.f = f
	return nil
}

// truncateLocked cuts the log back to its good records.
func (r *Removals) truncateLocked() error {
	if err := r.f.Truncate(r.size); err != nil {
		return fmt.Errorf("failed to drop a damaged record of the removals of a host layer: %w", err)
	}
	return nil
}

// add takes the removal of rel into account: its node is marked, and
// what lay below it is dropped.
func (r *Removals) add(rel string) {
	n := &r.root
	names := strings.Split(rel, "/")
	for i, name := range names {
		if n.removed {
			return
		}
		if i == len(names)-1 {
			n.changes++
		}
		k := n.kids[name]
		if k == nil {
			if n.kids == nil {
				n.kids = make(map[string]*removedNode)
			}
			k = &removedNode{}
			n.kids[name] = k
		}
		n = k
	}
	if !n.removed {
		r.live += int64(recordHeader + len(rel) - r.walk(rel, n, nil))
		n.removed = true
		n.kids = nil
	}
}

// walk calls fn (when set) for every removed path below n, at rel, and
// returns the length of their records.
func (r *Removals) walk(rel string, n *removedNode, fn func(string)) int {
	if n.removed {
		if fn != nil {
			fn(rel)
		}
		return recordHeader + len(rel)
	}
	total := 0
	for name, k := range n.kids {
		p := name
		if rel != "" {
			p = rel + "/" + name
		}
		total += r.walk(p, k, fn)
	}
	return total
}

// compactLocked writes the log anew with the records it holds, beside
// itself, and renames it over itself.
func (r *Removals) compactLocked() error {
	tmp := r.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("failed to write the removals of a host layer anew: %w", err)
	}
	var buf []byte
	r.walk("", &r.root, func(rel string) { buf = append(buf, record(rel)...) })
	_, err = f.Write(buf)
	if err == nil && r.durable {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, r.path)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("failed to write the removals of a host layer anew: %w", errors.Join(err, os.Remove(tmp)))
	}
	old := r.f
	r.f, r.size = f, int64(len(buf))
	return old.Close()
}

// record is the log's record of rel.
func record(rel string) []byte {
	b := make([]byte, recordHeader+len(rel))
	binary.LittleEndian.PutUint32(b, uint32(len(rel)))
	binary.LittleEndian.PutUint32(b[4:], crc32.Checksum([]byte(rel), castagnoli))
	copy(b[recordHeader:], rel)
	return b
}
