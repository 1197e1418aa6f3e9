package quota

import (
	"fmt"

	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/internal/btrfs"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"golang.org/x/sys/unix"
)

// Names of the mechanisms, as Report.Mechanism gives them.
const (
	BtrfsQgroups  = "btrfs qgroups"
	ProjectQuotas = "project quotas"
)

// DefaultGroups is the range of quota group IDs the store takes for its
// allocations unless told otherwise (the store's Options.Groups): far
// above what btrfs-progs or an operator numbers by hand.
var DefaultGroups = [2]uint64{2000000, 2999999}

// Report says what the data dir can enforce, for the daemon to say once
// at start, and for health and metrics.
type Report struct {
	// Filesystem is the data dir's filesystem type: "btrfs", "ext4".
	Filesystem string
	// Mechanism is what enforces limits (BtrfsQgroups, ProjectQuotas),
	// empty where nothing does.
	Mechanism string
	// Why says, where nothing enforces limits, what would.
	Why string
}

// Enforced reports whether the store can enforce limits.
func (r Report) Enforced() bool { return r.Mechanism != "" }

// Mechanism is one way of enforcing allocations' disk limits: btrfs
// qgroups (btrfs.go) or project quotas (project.go).
type Mechanism interface {
	// Name names it for people: BtrfsQgroups, ProjectQuotas.
	Name() string
	// Subvolumes reports whether layers are btrfs subvolumes, which
	// number their inodes alike (tags), cannot be merged by link(2)
	// (no flatten), and are counted only when made as such (a received
	// tree becomes the lower of a fresh one).
	Subvolumes() bool
	// CountsInodes reports whether it can limit inodes.
	CountsInodes() bool
	// MakeLayer makes a layer's root at p where Subvolumes is set.
	MakeLayer(p string) error
	// Settle makes the kernel agree with records, the store's every
	// record by ID (see btrfsQuota's); before holds the affected
	// allocations' records before the change (nil: a settle at open),
	// and groups is the range of group IDs the store owns. It reports
	// whether the counters need a recount, which Rescan does.
	Settle(records, before map[string]*record.State, affected map[string]bool, groups [2]uint64) (bool, error)
	Rescan() error
	// Usage reads what group g holds.
	Usage(g uint64) (bytes, inodes uint64, err error)
	// GroupFree reports whether nothing of the host's uses group g.
	GroupFree(g uint64) bool
}

// Detect finds what the filesystem of dir, the store's layers dir, can
// enforce and, with enable, turns it on there. step, when set, is told of
// every change the mechanism makes in the kernel before it is made, and
// fails it by returning an error: the store's crash tests stop there, as
// they do at its disk's steps. Where nothing can enforce limits, the
// Mechanism is nil and the Report says what would.
func Detect(dir string, enable bool, step func(op, path string) error) (Mechanism, Report, error) {
	var r Report
	isBtrfs, err := btrfs.Is(dir)
	if err != nil {
		return nil, r, err
	}
	r.Filesystem = "btrfs"
	if !isBtrfs {
		r.Filesystem = FSType(dir)
		q, why, err := detectProject(dir, r.Filesystem, enable, step)
		if err != nil || q == nil {
			r.Why = why
			return nil, r, err
		}
		r.Mechanism = q.Name()
		return q, r, nil
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
	r.Mechanism = BtrfsQgroups
	return &btrfsQuota{dir: dir, fsid: fsid, step: step}, r, nil
}

// FSType names the filesystem of dir as the mount table does: the entry
// of its device (a btrfs subvolume's anonymous device has none: Detect
// tells btrfs by statfs).
func FSType(dir string) string {
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
