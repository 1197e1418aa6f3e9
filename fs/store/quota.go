package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"

	"github.com/allocfs/allocfs/internal/btrfs"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Errors of the store's disk limits.
var (
	// ErrNoQuota: a limit was asked of a store whose data dir cannot
	// enforce one. Creating the allocation without it would promise
	// what the kernel does not keep, so the store refuses.
	ErrNoQuota = errors.New("the data dir cannot enforce disk limits")
	// ErrBadLimit: a limit that is negative, or of a kind the
	// mechanism does not count (inodes on btrfs).
	ErrBadLimit = errors.New("invalid disk limit")
)

// Limit is an allocation's disk limit; zero fields are unlimited.
type Limit struct {
	Bytes  int64 `json:"bytes,omitempty"`
	Inodes int64 `json:"inodes,omitempty"`
}

// IsZero reports whether l limits nothing.
func (l Limit) IsZero() bool { return l.Bytes == 0 && l.Inodes == 0 }

// DiskQuota is an allocation's limit as its record keeps it, in
// state/<id>.json:
//
//	"disk": {"bytes": 104857600, "group": 2000001}
//
// Group names the quota group that counts the allocation: on btrfs the
// qgroup 1/<group>, whose members are the level-0 qgroups of the upper
// layers of the allocation's volumes.
type DiskQuota struct {
	Limit
	Group uint64 `json:"group"`
	// From says who set the limit: "request" (the API or the allocdir
	// contract), "default" (Options.DefaultLimit), "nomad" (the
	// allocation's ephemeral_disk.size, read from Nomad's API).
	From string `json:"from,omitempty"`
}

// Where a limit came from (DiskQuota.From).
const (
	FromRequest = "request"
	FromDefault = "default"
	FromNomad   = "nomad"
)

// DefaultGroups is the range of quota group IDs the store takes for its
// allocations unless told otherwise (Options.Groups): far above what
// btrfs-progs or an operator numbers by hand.
var DefaultGroups = [2]uint64{2000000, 2999999}

// QuotaReport says what the data dir can enforce, for the daemon to say
// once at start, and for health and metrics.
type QuotaReport struct {
	// Filesystem is the data dir's filesystem type: "btrfs", "ext4".
	Filesystem string
	// Mechanism is what enforces limits ("btrfs qgroups"), empty where
	// nothing does.
	Mechanism string
	// Why says, where nothing enforces limits, what would.
	Why string
}

// Enforced reports whether the store can enforce limits.
func (r QuotaReport) Enforced() bool { return r.Mechanism != "" }

// btrfsQuota counts allocations with btrfs qgroups: every layer a
// subvolume, every allocation with a limit a level-1 qgroup over the
// level-0 qgroups of its volumes' upper layers. An allocation pays for
// what it can write: a snapshot migration's lowers stay with the
// allocation that wrote them, the extents a copy-up clones are
// referenced by the new upper and so counted there, and an adopt
// migration moves the upper layers, with their usage, to the new
// allocation.
type btrfsQuota struct {
	dir  string // the layers dir
	fsid string
	// step, when set, is told of every change the quota makes in the
	// kernel before it is made, and fails it by returning an error: the
	// crash tests stop the store there, as they do at its disk's steps.
	step func(op, path string) error
}

// before takes one step named op, or fails it (step).
func (q *btrfsQuota) before(op string, what any) error {
	if q.step == nil {
		return nil
	}
	return q.step(op, fmt.Sprint(what))
}

const mechanismBtrfs = "btrfs qgroups"

// detectQuota finds what the filesystem of dir can enforce and, with
// enable, turns it on there.
func detectQuota(dir string, enable bool) (*btrfsQuota, QuotaReport, error) {
	var r QuotaReport
	isBtrfs, err := btrfs.Is(dir)
	if err != nil {
		return nil, r, err
	}
	r.Filesystem = fsTypeName(dir)
	if !isBtrfs {
		r.Why = fmt.Sprintf("the data dir is on %s; allocfs enforces disk limits with btrfs qgroups: put the data dir on btrfs (mkfs.btrfs) and start serve with --enable-quotas", r.Filesystem)
		return nil, r, nil
	}
	if !enable {
		r.Why = "the data dir is on btrfs, and disk limits are off: start serve with --enable-quotas (it runs the equivalent of `btrfs quota enable`)"
		return nil, r, nil
	}
	if err := btrfs.EnableQuotas(dir); err != nil {
		return nil, r, err
	}
	fsid, err := btrfs.FSID(dir)
	if err != nil {
		return nil, r, err
	}
	r.Mechanism = mechanismBtrfs
	return &btrfsQuota{dir: dir, fsid: fsid}, r, nil
}

// fsTypeName names the filesystem of dir as the mount table does: the
// entry of its device.
func fsTypeName(dir string) string {
	if ok, _ := btrfs.Is(dir); ok {
		return "btrfs"
	}
	var st unix.Stat_t
	mounts, err := mountinfo.Read("")
	if err != nil || unix.Stat(dir, &st) != nil {
		return "unknown"
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, m := range mounts {
		if m.Device == dev {
			return m.FSType
		}
	}
	return "unknown"
}

// makeLayer makes the root of a layer: a subvolume, so that its usage is
// counted apart.
func (q *btrfsQuota) makeLayer(p string) error {
	if err := q.before("subvolume create", p); err != nil {
		return err
	}
	if err := btrfs.CreateSubvolume(p); err != nil {
		return err
	}
	return os.Chmod(p, 0o700)
}

// subvol returns the subvolume ID of layer l, 0 for a layer that is a
// plain directory (made before limits were on).
func (q *btrfsQuota) subvol(l string) (uint64, error) {
	p := filepath.Join(q.dir, l)
	ok, err := btrfs.IsSubvolume(p)
	if err != nil {
		return 0, err
	}
	var id uint64
	if ok {
		if id, err = btrfs.SubvolumeID(p); err != nil {
			return 0, err
		}
	}
	return id, nil
}

// settle makes the kernel's groups agree with records: every allocation
// with a limit has its group, its limit and exactly the uppers of its
// volumes as members; groups of gone allocations (in groups, the range
// the store owns) are emptied and removed. Only the allocations in
// affected are looked at (nil: all), and the groups no record names. It
// reports whether the counters went inconsistent, which a rescan puts
// right.
func (q *btrfsQuota) settle(records map[string]*State, affected map[string]bool, groups [2]uint64) (bool, error) {
	rel, err := btrfs.Relations(q.dir)
	if err != nil {
		return false, err
	}
	members := make(map[btrfs.QgroupID][]btrfs.QgroupID)
	for child, parents := range rel {
		for _, p := range parents {
			if p.Level() == 1 && p.ID() >= groups[0] && p.ID() <= groups[1] {
				members[p] = append(members[p], child)
			}
		}
	}
	if affected == nil {
		// A group without members has no relation to find it by: a
		// crash between its creation and its first member's, or after
		// its last member left, leaves one.
		groupsNow, err := btrfs.Qgroups(q.fsid, 1)
		if err != nil {
			return false, err
		}
		for _, g := range groupsNow {
			if _, ok := members[g]; !ok && g.ID() >= groups[0] && g.ID() <= groups[1] {
				members[g] = nil
			}
		}
	}
	want := make(map[btrfs.QgroupID][]btrfs.QgroupID)
	ids := make([]string, 0, len(records))
	for id := range records {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var errs []error
	inconsistent := false
	for _, id := range ids {
		st := records[id]
		if st.Disk == nil || affected != nil && !affected[id] {
			continue
		}
		g := btrfs.Qgroup(1, st.Disk.Group)
		if err := q.before("qgroup create", g); err != nil {
			return false, err
		}
		if err := btrfs.CreateQgroup(q.dir, g); err != nil {
			errs = append(errs, fmt.Errorf("allocation %s: %w", id, err))
			continue
		}
		if err := q.before("qgroup limit", g); err != nil {
			return false, err
		}
		if err := btrfs.Limit(q.dir, g, uint64(st.Disk.Bytes)); err != nil {
			errs = append(errs, fmt.Errorf("allocation %s: %w", id, err))
		}
		for _, key := range sortedVolumeKeys(st) {
			sv, err := q.subvol(st.Volumes[key].Upper)
			if err != nil {
				errs = append(errs, fmt.Errorf("allocation %s: %w", id, err))
				continue
			}
			if sv != 0 {
				want[g] = append(want[g], btrfs.Qgroup(0, sv))
			}
		}
		if _, ok := members[g]; !ok {
			members[g] = nil
		}
	}
	// Removals first, so that a layer moving between two allocations is
	// never counted by both.
	for g, have := range members {
		if _, mine := want[g]; !mine && groupNamed(records, g.ID()) {
			continue // an allocation this settle does not look at
		}
		for _, child := range have {
			if slices.Contains(want[g], child) {
				continue
			}
			if err := q.before("qgroup unassign", child); err != nil {
				return false, err
			}
			inc, err := btrfs.Assign(q.dir, child, g, false)
			inconsistent = inconsistent || inc
			if err != nil {
				errs = append(errs, err)
			}
		}
		if _, live := want[g]; !live && !groupNamed(records, g.ID()) {
			if err := q.before("qgroup destroy", g); err != nil {
				return false, err
			}
			if err := btrfs.DestroyQgroup(q.dir, g); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for g, children := range want {
		for _, child := range children {
			if slices.Contains(members[g], child) {
				continue
			}
			if err := q.before("qgroup assign", child); err != nil {
				return false, err
			}
			inc, err := btrfs.Assign(q.dir, child, g, true)
			inconsistent = inconsistent || inc
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return inconsistent, errors.Join(errs...)
}

// groupNamed reports whether a record names group g.
func groupNamed(records map[string]*State, g uint64) bool {
	for _, st := range records {
		if st.Disk != nil && st.Disk.Group == g {
			return true
		}
	}
	return false
}

// usage reads what group g holds and its limit.
func (q *btrfsQuota) usage(g uint64) (btrfs.Usage, error) {
	return btrfs.ReadUsage(q.fsid, btrfs.Qgroup(1, g))
}

// groupFree reports whether the kernel knows no qgroup 1/g: one the
// host made itself is never taken over.
func (q *btrfsQuota) groupFree(g uint64) bool {
	_, err := os.Lstat(fmt.Sprintf("/sys/fs/btrfs/%s/qgroups/1_%d", q.fsid, g))
	return errors.Is(err, os.ErrNotExist)
}

// openQuota finds what the data dir can enforce and, with enable, turns
// it on: Options.Quotas.
func (s *Store) openQuota(enable bool) error {
	q, r, err := detectQuota(s.layersDir(), enable)
	if err != nil {
		return fmt.Errorf("failed to set up disk limits: %w", err)
	}
	s.quota, s.quotaReport = q, r
	if q != nil {
		q.step = s.quotaStep
	}
	return nil
}

// Quota says what the store's data dir enforces.
func (s *Store) Quota() QuotaReport { return s.quotaReport }

// settleQuota makes the kernel's groups agree with the records after a
// change, or at open, and rescans the counters when a relation change
// left them inconsistent. A failure is logged and tried again after the
// next change: the records hold, and the limits of the allocations
// concerned lag until then. The caller holds writeMu.
func (s *Store) settleQuota(affected map[string]bool) {
	if s.quota == nil || !s.unsettled {
		return
	}
	s.mu.RLock()
	records := make(map[string]*State, len(s.allocs))
	for id, st := range s.allocs {
		records[id] = st
	}
	s.mu.RUnlock()
	inconsistent, err := s.quota.settle(records, affected, s.groups)
	if err != nil {
		s.logger.Warn("disk limits do not match the records yet; the next change tries again", "error", err)
		s.settleErr.Store(&err)
		return
	}
	s.unsettled = false
	s.settleErr.Store(nil)
	if inconsistent {
		s.logger.Info("recounting btrfs qgroups: a layer that moved between allocations shares extents")
		if err := btrfs.Rescan(s.quota.dir); err != nil {
			s.logger.Warn("qgroup rescan failed", "error", err)
		}
	}
}

// tagLayers gives every layer a record of in stacks or retains a tag
// unique in that record, keeping the tags it has and, for a layer new
// to the record, the tag the layer had in the record it came from where
// that tag is free: the numbers the mount showed for its files stay the
// same. The caller holds writeMu.
func (s *Store) tagLayers(in *intent) error {
	for id, st := range in.Records {
		if st == nil {
			continue
		}
		layers := st.allLayerIDs()
		tags := make(map[string]uint8, len(layers))
		used := make(map[uint8]bool)
		for l, t := range st.Tags {
			if _, ok := layers[l]; ok && !used[t] {
				tags[l] = t
				used[t] = true
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
			if t := s.tagElsewhere(l, id, in); t != 0 && !used[t] {
				tags[l] = t
				used[t] = true
			}
		}
		for _, l := range untagged {
			if tags[l] != 0 {
				continue
			}
			t := uint8(1)
			for used[t] && t < 255 {
				t++
			}
			if used[t] {
				return fmt.Errorf("allocation %s stacks more than 255 layers", id)
			}
			tags[l] = t
			used[t] = true
		}
		st.Tags = tags
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
func (s *Store) sizeNew(st *State, lim Limit) error {
	from := FromRequest
	if lim.IsZero() {
		lim, from = s.defaultLimit, FromDefault
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
	st.Disk = &DiskQuota{Limit: lim, Group: g, From: from}
	return nil
}

// SetLimit changes allocation id's disk limit to lim (zero: none), set
// by from (FromNomad...). Like every change it is journaled, and the
// kernel's groups follow at once. A limit below what the allocation
// holds is set all the same: its data stays, its writes fail until it
// deletes some, and a warning says so.
func (s *Store) SetLimit(id string, lim Limit, from string) (*State, error) {
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
				st.Disk = &DiskQuota{Limit: lim, Group: g, From: from}
			}
		}
	}
	if err == nil {
		err = s.commit("limit", st)
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
func (s *Store) checkLimit(lim Limit) error {
	if lim.Bytes < 0 || lim.Inodes < 0 {
		return fmt.Errorf("%w: %d bytes, %d inodes", ErrBadLimit, lim.Bytes, lim.Inodes)
	}
	if s.quota == nil {
		return fmt.Errorf("%w: %s", ErrNoQuota, s.quotaReport.Why)
	}
	if lim.Inodes != 0 {
		return fmt.Errorf("%w: btrfs counts no inodes (its metadata counts against the bytes): ask for bytes only", ErrBadLimit)
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
		if !used[g] && s.quota.groupFree(g) {
			return g, nil
		}
	}
	return 0, fmt.Errorf("every quota group of %d-%d is taken: widen the range (--quota-groups)", s.groups[0], s.groups[1])
}

// Usage is what an allocation holds against its limit.
type Usage struct {
	Limit
	// Bytes is what the allocation's upper layers hold, or will once
	// the writes under way commit.
	Bytes int64
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
	qu, err := s.quota.usage(st.Disk.Group)
	if err != nil {
		return u, false, fmt.Errorf("failed to read the disk usage of allocation %s: %w", id, err)
	}
	return Usage{Limit: st.Disk.Limit, Bytes: int64(qu.Bytes()), Mechanism: s.quotaReport.Mechanism}, true, nil
}

// ErrTooBig: what a migration would bring does not fit the new
// allocation's limit.
var ErrTooBig = errors.New("the data does not fit the allocation's disk limit")

// fitsImport checks that the received trees in dirs fit st's limit, by
// the blocks their files take, before any becomes a layer.
func (s *Store) fitsImport(st *State, dirs map[string]string) error {
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
func (s *Store) DefaultLimit() Limit { return s.defaultLimit }

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
	s.settleQuota(nil)
	return s.QuotaError()
}
