// Package quota holds the mechanisms that enforce allocations' disk
// limits in the kernel: btrfs qgroups (btrfs.go) and the project quotas
// of xfs and ext4 (project.go). Detect finds which one the data dir's
// filesystem has and turns it on; the store then asks its Mechanism to
// make layers (subvolumes, on btrfs) and, after every change of the
// records, to Settle: to make the kernel's groups agree with what the
// records say.
//
// # The shape on disk and in the kernel
//
// A record with a limit names its group (record.DiskQuota):
//
//	"disk": {"bytes": 104857600, "group": 2000001, "from": "request"}
//
// On btrfs every layer is a subvolume with its level-0 qgroup, and the
// allocation is the level-1 qgroup 1/<group> whose members are the
// qgroups of the upper layers of its volumes, limited to its bytes
// (btrfs counts no inodes). On xfs or ext4 the allocation is the project
// <group>: its upper layers' trees carry that project ID, inherited by
// what a task makes there, and the project's limits are its bytes and
// inodes. Either way an allocation pays for what it can write: the lower
// layers a snapshot migration froze stay with the allocation that wrote
// them, and an adopt migration moves the upper layers, and their usage,
// to the new allocation. Groups are taken from a range the store owns
// (DefaultGroups), far from what the host numbers by hand; a group of
// the range that no record names is emptied and removed (btrfs), or has
// its limits cleared (projects), when a settle finds it.
//
// # Why it is a package of its own
//
// The records say what each allocation may hold; a mechanism only makes
// the kernel agree, and its bookkeeping (qgroup relations, project IDs
// on directory trees, the sysfs counters) is of no use to anything else
// in the store. The store keeps what is policy: when to settle (after
// each journaled intent, again at open and after a failed settle), which
// group a new allocation gets, which limits it refuses (ErrNoQuota,
// record.ErrBadLimit), and how usage is reported. A settle that fails is
// logged and tried again after the next change; the records hold
// meanwhile, and the limits lag them.
package quota
