package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
)

// ErrNoQuota: a limit was asked of a store whose data dir cannot
// enforce one. Creating the allocation without it would promise what
// the kernel does not keep, so the store refuses.
var ErrNoQuota = errors.New("the data dir cannot enforce disk limits")

// openQuota finds what the data dir can enforce and, with enable, turns
// it on: Options.Quotas.
func (s *Store) openQuota(enable bool) error {
	q, r, err := quota.Detect(s.layersDir(), enable, s.quotaStep)
	if err != nil {
		return fmt.Errorf("failed to set up disk limits: %w", err)
	}
	s.quota, s.quotaReport = q, r
	return nil
}

// Quota says what the store's data dir enforces.
func (s *Store) Quota() quota.Report { return s.quotaReport }

// settleQuota makes the kernel's groups agree with the records after a
// change, or at open, and rescans the counters when a relation change
// left them inconsistent. A failure is logged and tried again after the
// next change: the records hold, and the limits of the allocations
// concerned lag until then. The caller holds writeMu.
func (s *Store) settleQuota(affected map[string]bool, before map[string]*record.State) {
	if s.quota == nil || !s.unsettled {
		return
	}
	s.mu.RLock()
	records := make(map[string]*record.State, len(s.allocs))
	for id, st := range s.allocs {
		records[id] = st
	}
	s.mu.RUnlock()
	inconsistent, err := s.quota.Settle(records, before, affected, s.groups)
	if err != nil {
		s.logger.Warn("disk limits do not match the records yet; the next change tries again", "error", err)
		s.settleErr.Store(&err)
		return
	}
	s.unsettled = false
	s.settleErr.Store(nil)
	if inconsistent {
		s.logger.Info("recounting btrfs qgroups: a layer that moved between allocations shares extents")
		if err := s.quota.Rescan(); err != nil {
			s.logger.Warn("qgroup rescan failed", "error", err)
		}
	}
}

// tagLayers gives every layer a record of in stacks or retains a tag
// unique in that record, keeping the tags it has. A tag is never given
// twice in a record (record.State.TagTop): a layer new to it takes the tag it had
// in the record it came from where that tag was never used here (its
// files keep their numbers, and the origins its copy-ups recorded keep
// naming the right layers), else the next one. Past 255 the least recent
// free tags are taken again. The caller holds writeMu.
func (s *Store) tagLayers(in *intent) error {
	for id, st := range in.Records {
		if st == nil {
			continue
		}
		layers := st.AllLayerIDs()
		tags := make(map[string]uint8, len(layers))
		used := make(map[uint8]bool)
		top := st.TagTop
		for l, t := range st.Tags {
			if _, ok := layers[l]; ok && !used[t] {
				tags[l] = t
				used[t] = true
				top = max(top, t)
			}
		}
		var untagged []string
		for l := range layers {
			if _, ok := tags[l]; !ok {
				untagged = append(untagged, l)
			}
		}
		sort.Strings(untagged)
		for _, l := range untagged {
			if t := s.tagElsewhere(l, id, in); t > st.TagTop && !used[t] {
				tags[l] = t
				used[t] = true
			}
		}
		for t := range used {
			top = max(top, t)
		}
		for _, l := range untagged {
			if tags[l] != 0 {
				continue
			}
			t := top + 1
			if top == 255 {
				for t = 1; used[t] && t < 255; t++ {
				}
				if used[t] {
					return fmt.Errorf("allocation %s stacks more than 255 layers", id)
				}
			} else {
				top = t
			}
			tags[l] = t
			used[t] = true
		}
		st.Tags, st.TagTop = tags, top
	}
	return nil
}

// tagElsewhere returns the tag layer l has in another record, the
// intent's first, or 0.
func (s *Store) tagElsewhere(l, id string, in *intent) uint8 {
	for other, st := range in.Records {
		if other != id && st != nil && st.Tags[l] != 0 {
			return st.Tags[l]
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for other, st := range s.allocs {
		if other != id && st.Tags[l] != 0 {
			return st.Tags[l]
		}
	}
	return 0
}

// sizeNew gives the record of a new allocation its limit: lim, or the
// store's default where lim is zero. The caller holds writeMu.
func (s *Store) sizeNew(st *record.State, lim record.Limit) error {
	from := record.FromRequest
	if lim.IsZero() {
		lim, from = s.defaultLimit, record.FromDefault
	}
	if lim.IsZero() {
		return nil
	}
	if err := s.checkLimit(lim); err != nil {
		return err
	}
	g, err := s.freeGroup()
	if err != nil {
		return err
	}
	st.Disk = &record.DiskQuota{Limit: lim, Group: g, From: from}
	return nil
}

// SetLimit changes allocation id's disk limit to lim (zero: none), set
// by from (record.FromNomad...). Like every change it is journaled, and the
// kernel's groups follow at once. It tells no OnChange hook: nothing the
// mount shows changes, and Nomad's client is often inside a mkdir of the
// allocation when its size arrives, a request the mount's invalidation
// would wait for while it waits for the store. A limit below what the allocation
// holds is set all the same: its data stays, its writes fail until it
// deletes some, and a warning says so.
func (s *Store) SetLimit(id string, lim record.Limit, from string) (*record.State, error) {
	if !lim.IsZero() {
		if err := s.checkLimit(lim); err != nil {
			return nil, fmt.Errorf("failed to limit allocation %q: %w", id, err)
		}
	}
	s.writeMu.Lock()
	st, err := s.Get(id)
	if err == nil {
		switch {
		case lim.IsZero():
			st.Disk = nil
		case st.Disk != nil:
			st.Disk.Limit, st.Disk.From = lim, from
		default:
			var g uint64
			if g, err = s.freeGroup(); err == nil {
				st.Disk = &record.DiskQuota{Limit: lim, Group: g, From: from}
			}
		}
	}
	if err == nil {
		err = s.change(&intent{Op: "limit", Records: map[string]*record.State{id: st}, quiet: true})
	}
	s.writeMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("failed to limit allocation %q: %w", id, err)
	}
	s.logger.Info("set an allocation's disk limit", "alloc_id", id, "bytes", lim.Bytes, "from", from)
	s.warnOverLimit(id)
	return s.Get(id)
}

// checkLimit refuses a limit the store cannot keep.
func (s *Store) checkLimit(lim record.Limit) error {
	if lim.Bytes < 0 || lim.Inodes < 0 {
		return fmt.Errorf("%w: %d bytes, %d inodes", record.ErrBadLimit, lim.Bytes, lim.Inodes)
	}
	if s.quota == nil {
		return fmt.Errorf("%w: %s", ErrNoQuota, s.quotaReport.Why)
	}
	if lim.Inodes != 0 && !s.quota.CountsInodes() {
		return fmt.Errorf("%w: btrfs counts no inodes (its metadata counts against the bytes): ask for bytes only", record.ErrBadLimit)
	}
	return nil
}

// freeGroup returns the lowest group ID of the store's range that no
// record and no qgroup of the host's uses. The caller holds writeMu.
func (s *Store) freeGroup() (uint64, error) {
	s.mu.RLock()
	used := make(map[uint64]bool, len(s.allocs))
	for _, st := range s.allocs {
		if st.Disk != nil {
			used[st.Disk.Group] = true
		}
	}
	s.mu.RUnlock()
	for g := s.groups[0]; g <= s.groups[1]; g++ {
		if !used[g] && s.quota.GroupFree(g) {
			return g, nil
		}
	}
	return 0, fmt.Errorf("every quota group of %d-%d is taken: widen the range (--quota-groups)", s.groups[0], s.groups[1])
}

// Usage is what an allocation holds against its limit.
type Usage struct {
	record.Limit
	// Bytes is what the allocation's upper layers hold, or will once
	// the writes under way commit; Inodes how many files and
	// directories, where the mechanism counts them (0 on btrfs).
	Bytes, Inodes int64
	// Mechanism enforces the limit.
	Mechanism string
}

// Usage reads allocation id's usage from the quota accounting: a read
// of a few sysfs files, whatever the allocation holds. An allocation
// without a limit has none: ok is false.
func (s *Store) Usage(id string) (u Usage, ok bool, err error) {
	st, err := s.View(id)
	if err != nil {
		return u, false, err
	}
	if st.Disk == nil || s.quota == nil {
		return u, false, nil
	}
	bytes, inodes, err := s.quota.Usage(st.Disk.Group)
	if err != nil {
		return u, false, fmt.Errorf("failed to read the disk usage of allocation %s: %w", id, err)
	}
	return Usage{Limit: st.Disk.Limit, Bytes: int64(bytes), Inodes: int64(inodes), Mechanism: s.quotaReport.Mechanism}, true, nil
}

// ErrTooBig: what a migration would bring does not fit the new
// allocation's limit.
var ErrTooBig = errors.New("the data does not fit the allocation's disk limit")

// fitsImport checks that the received trees in dirs fit st's limit, by
// the blocks their files take, before any becomes a layer.
func (s *Store) fitsImport(st *record.State, dirs map[string]string) error {
	if st.Disk == nil || st.Disk.Bytes == 0 {
		return nil
	}
	var total int64
	for _, key := range sortedKeys(keySet(dirs)) {
		err := filepath.WalkDir(dirs[key], func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			if sys, ok := info.Sys().(*syscall.Stat_t); ok {
				total += sys.Blocks * 512
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("failed to measure the received %s: %w", key, err)
		}
	}
	if total > st.Disk.Bytes {
		return fmt.Errorf("%w: %d bytes received, the limit is %d", ErrTooBig, total, st.Disk.Bytes)
	}
	return nil
}

// warnOverLimit logs, after an adopt, an allocation that holds more than
// its limit: it keeps its data, and its writes fail until it deletes.
func (s *Store) warnOverLimit(id string) {
	u, ok, err := s.Usage(id)
	if err != nil || !ok || u.Limit.Bytes == 0 || u.Bytes <= u.Limit.Bytes {
		return
	}
	s.logger.Warn("allocation took over more data than its disk limit: its writes fail with EDQUOT until it deletes some",
		"alloc_id", id, "bytes", u.Bytes, "limit_bytes", u.Limit.Bytes)
}

// DefaultLimit is the limit of a new allocation that asks for none.
func (s *Store) DefaultLimit() record.Limit { return s.defaultLimit }

// QuotaError is the error of the last settle of the kernel's quota
// groups with the records, nil once one succeeded: while it is set,
// some allocations' limits or usage lag their records.
func (s *Store) QuotaError() error {
	if p := s.settleErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Resettle settles the kernel's quota groups with every record again,
// after a settle failed; the collector calls it each pass.
func (s *Store) Resettle() error {
	if s.quota == nil || s.QuotaError() == nil {
		return nil
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.settleQuota(nil, nil)
	return s.QuotaError()
}
