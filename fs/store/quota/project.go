package quota

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/internal/projquota"
)

// projQuota counts allocations with project quotas (xfs pquota or
// prjquota, ext4 with the project feature mounted prjquota). xfs answers
// a write past a project's limit with ENOSPC (a project is a directory
// tree's disk, and it reports it full), ext4 with EDQUOT. Every
// allocation with a limit is a project, whose ID is its group, and the
// upper layers of its volumes carry it, PROJINHERIT on their
// directories, so that what a task makes there is counted. A snapshot
// migration's new upper is the new allocation's project, so a copy-up
// lands there; an adopt gives the moved layers the new allocation's
// project (a walk of each, under the store's write lock); layers keep
// their inode numbers, so nothing else changes.
type projQuota struct {
	dir string // the layers dir
	fs  string // "xfs", "ext4"
	// step is btrfsQuota's.
	step func(op, path string) error
}

// detectProject returns a projQuota where the filesystem of dir enforces
// project quotas and enable is set, or says what would.
func detectProject(dir, fsName string, enable bool, step func(op, path string) error) (Mechanism, string, error) {
	on, err := projquota.Enforced(dir)
	if err != nil {
		on = false
	}
	how := "put the data dir on btrfs (mkfs.btrfs), or on xfs mounted with -o prjquota, or on ext4 made with -O quota,project and mounted with -o prjquota, and start serve with --enable-quotas"
	switch {
	case !on && (fsName == "xfs" || fsName == "ext4"):
		return nil, fmt.Sprintf("the data dir is on %s, which enforces no project quotas here (%v); allocfs enforces disk limits with btrfs qgroups or project quotas: %s", fsName, quotaState(err), how), nil
	case !on:
		return nil, fmt.Sprintf("the data dir is on %s; allocfs enforces disk limits with btrfs qgroups or project quotas: %s", fsName, how), nil
	case !enable:
		return nil, fmt.Sprintf("the data dir is on %s with project quotas, and disk limits are off: start serve with --enable-quotas", fsName), nil
	case fsName == "ext4" && HasCapSysResource():
		return nil, "ext4 lets a process with CAP_SYS_RESOURCE write past project quotas, and this daemon has it (its own writes and passthrough's would not be held): run serve without it (deploy/allocfs.service drops it; by hand: setpriv --bounding-set=-sys_resource --inh-caps=-sys_resource allocfs serve ...) with --enable-quotas", nil
	}
	return &projQuota{dir: dir, fs: fsName, step: step}, "", nil
}

// quotaState says why quotas are off, for the advice.
func quotaState(err error) string {
	if err != nil {
		return err.Error()
	}
	return "not mounted with them"
}

// HasCapSysResource reports whether this process's effective
// capabilities hold CAP_SYS_RESOURCE, with which ext4 lets it write past
// project quotas.
func HasCapSysResource() bool {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<24) != 0
		}
	}
	return false
}

func (q *projQuota) Name() string       { return ProjectQuotas }
func (q *projQuota) Subvolumes() bool   { return false }
func (q *projQuota) CountsInodes() bool { return true }
func (q *projQuota) Rescan() error      { return nil }
func (q *projQuota) MakeLayer(string) error {
	return errors.New("project quotas make layers as plain directories")
}

func (q *projQuota) before(op string, what any) error {
	if q.step == nil {
		return nil
	}
	return q.step(op, fmt.Sprint(what))
}

// Settle gives each affected allocation with a limit its project's
// limits, and its volumes' upper layers its project where their root
// has another (a fresh layer, an adopted one, one a crash left half
// done: SetTree sets the root last). An allocation whose limit went away
// has its project's limits cleared and its uppers back in project 0. At
// open (before nil) every record is looked at.
func (q *projQuota) Settle(records, before map[string]*record.State, affected map[string]bool, groups [2]uint64) (bool, error) {
	var errs []error
	if before == nil && affected == nil {
		// At open: a project of the range whose allocation a crash took
		// before its limits were cleared.
		for id := uint32(groups[0]); uint64(id) <= groups[1]; id++ {
			next, u, ok, err := projquota.Next(q.dir, id)
			if err != nil {
				errs = append(errs, err)
				break
			}
			if !ok || uint64(next) > groups[1] || next < id {
				break
			}
			id = next
			if groupNamed(records, uint64(next)) || u.LimitBytes == 0 && u.LimitInodes == 0 {
				continue
			}
			if err := q.before("project limit", next); err != nil {
				return false, err
			}
			if err := projquota.Limit(q.dir, next, 0, 0); err != nil {
				errs = append(errs, err)
			}
		}
	}
	ids := make([]string, 0, len(before))
	for id := range before {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		old := before[id]
		if old == nil || old.Disk == nil || groupNamed(records, old.Disk.Group) {
			continue
		}
		if err := q.before("project limit", old.Disk.Group); err != nil {
			return false, err
		}
		if err := projquota.Limit(q.dir, uint32(old.Disk.Group), 0, 0); err != nil {
			errs = append(errs, err)
		}
		if st := records[id]; st != nil && st.Disk == nil {
			errs = append(errs, q.retag(st, 0)...)
		}
	}
	ids = ids[:0]
	for id, st := range records {
		if st.Disk != nil && (affected == nil || affected[id]) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	for _, id := range ids {
		st := records[id]
		g := uint32(st.Disk.Group)
		if q.needsRetag(st, g) {
			// Moving an inode into a project is charged there, and
			// refused past its limits (ext4): an adopt onto a smaller
			// limit must still move all of its data. The limits are
			// lifted for the move and set again after it; a crash
			// between leaves them lifted until the settle at open.
			if err := q.before("project limit", g); err != nil {
				return false, err
			}
			if err := projquota.Limit(q.dir, g, 0, 0); err != nil {
				errs = append(errs, fmt.Errorf("allocation %s: %w", id, err))
			}
			errs = append(errs, q.retag(st, g)...)
		}
		if err := q.before("project limit", g); err != nil {
			return false, err
		}
		if err := projquota.Limit(q.dir, g, uint64(st.Disk.Bytes), uint64(st.Disk.Inodes)); err != nil {
			errs = append(errs, fmt.Errorf("allocation %s: %w", id, err))
		}
	}
	return false, errors.Join(errs...)
}

// needsRetag reports whether an upper layer of st's volumes has another
// project than id at its root.
func (q *projQuota) needsRetag(st *record.State, id uint32) bool {
	for _, key := range st.VolumeKeys() {
		cur, err := projquota.ProjectOf(filepath.Join(q.dir, st.Volumes[key].Upper))
		if err != nil || cur != id {
			return true
		}
	}
	return false
}

// retag gives the upper layers of st's volumes project id where their
// root has another.
func (q *projQuota) retag(st *record.State, id uint32) []error {
	var errs []error
	for _, key := range st.VolumeKeys() {
		p := filepath.Join(q.dir, st.Volumes[key].Upper)
		cur, err := projquota.ProjectOf(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("allocation %s: %w", st.ID, err))
			continue
		}
		if cur == id {
			continue
		}
		if err := q.before("project set", p); err != nil {
			return append(errs, err)
		}
		if err := projquota.SetTree(p, id); err != nil {
			errs = append(errs, fmt.Errorf("allocation %s: %w", st.ID, err))
		}
	}
	return errs
}

func (q *projQuota) Usage(g uint64) (uint64, uint64, error) {
	u, err := projquota.Get(q.dir, uint32(g))
	return u.Bytes, u.Inodes, err
}

// GroupFree reports whether project g has neither usage nor limits: one
// the host uses, or an earlier allocation whose files are still being
// removed, is not taken.
func (q *projQuota) GroupFree(g uint64) bool {
	if g > 1<<32-1 {
		return false
	}
	u, err := projquota.Get(q.dir, uint32(g))
	return err == nil && u == (projquota.Usage{})
}
