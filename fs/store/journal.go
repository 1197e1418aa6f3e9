package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/allocfs/allocfs/fs/store/frame"
	"github.com/allocfs/allocfs/fs/store/record"
)

// The journal is the store's write-ahead log (state/journal). Every change
// of the records, of one allocation or of several at once (a migration
// changes two, a flatten every allocation stacking the merged pair), is
// one intent: the records as the change leaves them. The intent is
// appended and synced, which is the one fsync a change costs and the
// instant it happens; the state files are then rewritten without a sync.
// A crash at any step leaves either no intent (the change did not happen)
// or a whole one, which the next Open applies again (replay): a
// restart shows the state before or the state after, never a mix.
//
// A checkpoint makes the state files durable (an fsync of each file
// changed since the last one, and of state/) and only then empties the
// journal, so an intent is retired only once what it changed is durable.
// It runs at open, at close, and once the journal outgrows journalLimit.
//
// Each intent is framed, as JSON, with its length and checksum (package
// frame), so that a torn append (a crash inside write(2)) is recognised
// and dropped: it was never synced, so no change rests on it.
const (
	journalName  = "journal"
	journalLimit = 1 << 20
)

// errClosed is what a change of a closed store gets.
var errClosed = errors.New("the store is closed")

// intent is one change of the store as the journal records it.
type intent struct {
	// Seq numbers changes since the store was created.
	Seq uint64 `json:"seq"`
	// Op names the change for an operator reading the journal: create,
	// update, remap, seal, import, flatten, destroy.
	Op string `json:"op"`
	// Records are the allocation records as the change leaves them; a
	// null record means the allocation is gone.
	Records map[string]*record.State `json:"records"`
	// Fresh are the layers the change created empty (or holding only a
	// MIGRATED-TO note). They were made before the intent was written,
	// unsynced; a replay makes again any that a power cut lost.
	Fresh []freshLayer `json:"fresh,omitempty"`
	// quiet keeps the change from the OnChange hooks: it changes nothing
	// the mount shows (a disk limit), and it may be made while a FUSE
	// request that needs the store waits in the kernel with a directory
	// locked, where the mount's invalidations would wait for that lock.
	quiet bool
}

// freshLayer describes a layer created empty, so that it can be made again
// exactly: its root's mode and owner, and the note it holds, if any.
type freshLayer struct {
	ID   string      `json:"id"`
	Mode os.FileMode `json:"mode"`
	// UID and GID own the root; -1 leaves the daemon's.
	UID int `json:"uid"`
	GID int `json:"gid"`
	// Note is the content of the MIGRATED-TO file of a placeholder.
	Note string `json:"note,omitempty"`
}

func (s *Store) journalPath() string { return filepath.Join(s.stateDir(), journalName) }

// encodeIntent frames an intent for the journal.
func encodeIntent(in *intent) ([]byte, error) {
	payload, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("failed to encode intent: %w", err)
	}
	if len(payload) > frame.Max {
		return nil, fmt.Errorf("intent of %d bytes is over the %d-byte limit", len(payload), frame.Max)
	}
	return frame.Encode(payload), nil
}

// decodeJournal returns the whole intents at the start of data, in order,
// and how many bytes they take; what follows them is a torn append.
func decodeJournal(data []byte) ([]*intent, int, error) {
	var out []*intent
	off := 0
	for {
		payload, n, ok := frame.Next(data[off:])
		if !ok {
			break
		}
		var in intent
		dec := json.NewDecoder(bytes.NewReader(payload))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			// The checksum matched: this is an intent some other
			// version wrote, not a torn one. Refuse rather than guess.
			return nil, 0, fmt.Errorf("intent at offset %d: %w", off, err)
		}
		out = append(out, &in)
		off += n
	}
	return out, off, nil
}

// change makes one crash-atomic change: it journals in (one fsync), then
// rewrites the state files, then makes the records current in memory and
// tells the OnChange hooks. Once the intent is synced the change has
// happened, whatever follows: a state file that cannot be written is
// written again from memory by the next checkpoint, and the replay of the
// journal covers a crash before that. If the intent cannot be journaled,
// nothing changed and the error says why; the caller removes the layers
// it made for the change. The caller holds writeMu.
func (s *Store) change(in *intent) error {
	if errors.Is(s.broken, errClosed) {
		return errClosed
	}
	if s.broken != nil {
		return fmt.Errorf("the store stopped taking changes after a journal failure; restart the daemon: %w", s.broken)
	}
	for id, st := range in.Records {
		if st == nil {
			continue
		}
		if st.ID != id {
			return fmt.Errorf("record of %s carries ID %q", id, st.ID)
		}
		st.Normalize()
		if err := st.Validate(); err != nil {
			return err
		}
	}
	if s.quota != nil && s.quota.Subvolumes() {
		if err := s.tagLayers(in); err != nil {
			return err
		}
	}
	in.Seq = s.seq + 1
	framed, err := encodeIntent(in)
	if err != nil {
		return err
	}
	if err := s.journalAppend(framed); err != nil {
		return err
	}
	s.seq = in.Seq
	var before map[string]*record.State
	if s.quota != nil {
		before = make(map[string]*record.State, len(in.Records))
		s.mu.RLock()
		for id := range in.Records {
			before[id] = s.allocs[id]
		}
		s.mu.RUnlock()
	}
	s.applyIntent(in)
	if s.quota != nil {
		// A settle that failed before leaves every allocation to look
		// at again.
		var affected map[string]bool
		if !s.unsettled {
			affected = make(map[string]bool, len(in.Records))
			for id := range in.Records {
				affected[id] = true
			}
		}
		s.unsettled = true
		s.settleQuota(affected, before)
	}
	if s.journalSize > journalLimit {
		if err := s.checkpoint(); err != nil {
			s.logger.Warn("checkpoint failed; the journal keeps the changes", "error", err)
		}
	}
	return nil
}

// journalAppend appends a frame and syncs it. A failure undoes the append
// (the frame may have reached the disk in part or whole, and a later
// replay must not find it); if even that fails, the store cannot know
// what a restart would replay, so it takes no more changes.
func (s *Store) journalAppend(frame []byte) error {
	p := s.journalPath()
	err := s.disk.AppendFile(p, frame)
	if err == nil {
		err = s.disk.Fsync(p)
	}
	if err == nil {
		s.journalSize += int64(len(frame))
		return nil
	}
	err = fmt.Errorf("failed to journal the change: %w", err)
	terr := s.disk.Truncate(p, s.journalSize)
	if terr == nil {
		terr = s.disk.Fsync(p)
	}
	if terr != nil && !(s.journalSize == 0 && errors.Is(terr, iofs.ErrNotExist)) {
		s.broken = errors.Join(err, terr)
	}
	if s.broken != nil {
		s.logger.Error("journal left in an unknown state: no more changes until a restart", "error", s.broken)
	}
	return err
}

// applyIntent carries out a journaled intent on the state files and in
// memory. It never fails: what it cannot write stays in the journal and
// is written again by the next checkpoint.
func (s *Store) applyIntent(in *intent) {
	ids := make([]string, 0, len(in.Records))
	for id := range in.Records {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := s.writeRecord(id, in.Records[id], false); err != nil {
			s.logger.Warn("state file not rewritten; the journal holds the change", "alloc_id", id, "error", err)
		}
		s.dirty[id] = struct{}{}
	}
	s.freshSince = append(s.freshSince, in.Fresh...)
	s.mu.Lock()
	for _, id := range ids {
		if st := in.Records[id]; st != nil {
			s.allocs[id] = st
			delete(s.destroyed, id)
		} else {
			delete(s.allocs, id)
			s.destroyed[id] = struct{}{}
		}
	}
	s.mu.Unlock()
	if !in.quiet {
		s.writeMu.pending = append(s.writeMu.pending, ids...)
	}
}

// writeRecord replaces the state file of id with st, or removes it when st
// is nil; sync makes the new content durable before the rename.
func (s *Store) writeRecord(id string, st *record.State, sync bool) error {
	file := s.statePath(id)
	if st == nil {
		if err := s.disk.Remove(file); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return err
		}
		return nil
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("failed to encode state: %w", err)
	}
	tmp := file + ".tmp"
	if err := s.disk.Remove(tmp); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	if err := s.disk.WriteFile(tmp, append(data, '\n'), 0o600); err != nil {
		return errors.Join(err, s.disk.Remove(tmp))
	}
	if sync {
		if err := s.disk.Fsync(tmp); err != nil {
			return errors.Join(err, s.disk.Remove(tmp))
		}
	}
	return s.disk.Rename(tmp, file, 0)
}

// checkpoint makes every change in the journal durable outside it, then
// empties it: each state file changed since the last checkpoint is
// written again from memory with a sync (cheap when the kernel has
// written it back already), removed ones stay removed, the layers made
// empty by those changes are synced, and only then is the journal
// truncated. The caller holds writeMu.
func (s *Store) checkpoint() error {
	if s.broken != nil {
		return s.broken
	}
	if len(s.dirty) == 0 && len(s.freshSince) == 0 && s.journalSize == 0 {
		return nil
	}
	ids := make([]string, 0, len(s.dirty))
	for id := range s.dirty {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	s.mu.RLock()
	records := make(map[string]*record.State, len(ids))
	for _, id := range ids {
		records[id] = s.allocs[id]
	}
	s.mu.RUnlock()
	for _, id := range ids {
		if err := s.writeRecord(id, records[id], true); err != nil {
			return fmt.Errorf("failed to write state of %s: %w", id, err)
		}
	}
	if err := s.disk.Fsync(s.stateDir()); err != nil {
		return err
	}
	if len(s.freshSince) > 0 {
		for _, f := range s.freshSince {
			p := s.LayerPath(f.ID)
			if f.Note != "" {
				if err := s.disk.Fsync(filepath.Join(p, MigratedToName)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
					return err
				}
			}
			if err := s.disk.Fsync(p); err != nil && !errors.Is(err, iofs.ErrNotExist) {
				return err
			}
		}
		if err := s.disk.Fsync(s.layersDir()); err != nil {
			return err
		}
	}
	if s.journalSize > 0 {
		p := s.journalPath()
		if err := s.disk.Truncate(p, 0); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return err
		}
		if err := s.disk.Fsync(p); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return err
		}
	}
	s.journalSize = 0
	s.dirty = make(map[string]struct{})
	s.freshSince = nil
	return nil
}

// replayJournal applies, at open, the intents a crash left in the journal
// over the records loaded from the state files, makes again the fresh
// layers they name that a power cut lost, and checkpoints. A torn append
// at the end is dropped.
func (s *Store) replayJournal() error {
	p := s.journalPath()
	data, err := os.ReadFile(p)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to read the journal: %w", err)
	}
	intents, end, err := decodeJournal(data)
	if err != nil {
		return fmt.Errorf("failed to read the journal %q: %w; it was written by another version of allocfs", p, err)
	}
	if end < len(data) {
		s.logger.Warn("dropping the torn end of the journal", "bytes", len(data)-end)
	}
	s.journalSize = int64(len(data))
	fresh := make(map[string]freshLayer)
	for _, in := range intents {
		for id, st := range in.Records {
			if st != nil {
				if st.ID != id {
					return fmt.Errorf("journal intent %d: record of %s carries ID %q", in.Seq, id, st.ID)
				}
				if err := st.Validate(); err != nil {
					return fmt.Errorf("journal intent %d: %w", in.Seq, err)
				}
				st.Normalize()
				s.allocs[id] = st
			} else {
				delete(s.allocs, id)
			}
			s.dirty[id] = struct{}{}
		}
		for _, f := range in.Fresh {
			fresh[f.ID] = f
		}
		s.seq = max(s.seq, in.Seq)
		s.freshSince = append(s.freshSince, in.Fresh...)
	}
	if len(intents) > 0 {
		s.logger.Info("replayed the journal", "intents", len(intents), "allocations", len(s.dirty))
	}
	for _, id := range sortedKeys(s.referencedAll()) {
		if f, ok := fresh[id]; ok {
			if err := s.remakeFresh(f); err != nil {
				return fmt.Errorf("failed to restore layer %s: %w", id, err)
			}
		}
	}
	return s.checkpoint()
}

// remakeFresh makes a fresh layer again if a power cut lost it, and its
// note if that lost its content; a layer that exists is otherwise left
// alone, since a task may have written into it since.
func (s *Store) remakeFresh(f freshLayer) error {
	p := s.LayerPath(f.ID)
	if _, err := os.Lstat(p); errors.Is(err, iofs.ErrNotExist) {
		s.logger.Warn("making again a layer a crash lost", "layer", f.ID)
		if err := s.makeLayer(p, f); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	if f.Note == "" {
		return nil
	}
	note := filepath.Join(p, MigratedToName)
	if b, err := os.ReadFile(note); err == nil && string(b) == f.Note {
		return nil
	}
	if err := s.disk.Remove(note); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	return s.disk.WriteFile(note, []byte(f.Note), 0o444)
}
