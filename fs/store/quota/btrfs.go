package quota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/internal/btrfs"
)

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

// MakeLayer makes the root of a layer: a subvolume, so that its usage is
// counted apart.
func (q *btrfsQuota) MakeLayer(p string) error {
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

// Settle makes the kernel's groups agree with records: every allocation
// with a limit has its group, its limit and exactly the uppers of its
// volumes as members; groups of gone allocations (in groups, the range
// the store owns) are emptied and removed. Only the allocations in
// affected are looked at (nil: all), and the groups no record names. It
// reports whether the counters went inconsistent, which a rescan puts
// right.
func (q *btrfsQuota) Settle(records, _ map[string]*record.State, affected map[string]bool, groups [2]uint64) (bool, error) {
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
	// changed is set once a relation was asked to change.
	inconsistent, changed := false, false
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
		for _, key := range st.VolumeKeys() {
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
			inconsistent, changed = inconsistent || inc, true
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
			inconsistent, changed = inconsistent || inc, true
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	if changed && !inconsistent {
		// One read for the batch: the flag stays set until a rescan.
		inc, err := btrfs.Inconsistent(q.dir)
		inconsistent = inc
		errs = append(errs, err)
	}
	return inconsistent, errors.Join(errs...)
}

// groupNamed reports whether a record names group g.
func groupNamed(records map[string]*record.State, g uint64) bool {
	for _, st := range records {
		if st.Disk != nil && st.Disk.Group == g {
			return true
		}
	}
	return false
}

// Usage reads what group g holds; btrfs counts no inodes.
func (q *btrfsQuota) Usage(g uint64) (uint64, uint64, error) {
	u, err := btrfs.ReadUsage(q.fsid, btrfs.Qgroup(1, g))
	return u.Bytes(), 0, err
}

func (q *btrfsQuota) Name() string       { return BtrfsQgroups }
func (q *btrfsQuota) Subvolumes() bool   { return true }
func (q *btrfsQuota) CountsInodes() bool { return false }
func (q *btrfsQuota) Rescan() error      { return btrfs.Rescan(q.dir) }

// GroupFree reports whether the kernel knows no qgroup 1/g: one the
// host made itself is never taken over.
func (q *btrfsQuota) GroupFree(g uint64) bool {
	_, err := os.Lstat(fmt.Sprintf("/sys/fs/btrfs/%s/qgroups/1_%d", q.fsid, g))
	return errors.Is(err, os.ErrNotExist)
}
