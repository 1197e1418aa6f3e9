package record

import "errors"

// ErrBadLimit: a limit that is negative, or of a kind the mechanism
// does not count (inodes on btrfs).
var ErrBadLimit = errors.New("invalid disk limit")

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
// layers of the allocation's volumes; on xfs or ext4 the project of that
// ID, which those layers carry.
type DiskQuota struct {
	Limit
	Group uint64 `json:"group"`
	// From says who set the limit: "request" (the API or the allocdir
	// contract), "default" (the store's default limit), "nomad" (the
	// allocation's ephemeral_disk.size, read from Nomad's API).
	From string `json:"from,omitempty"`
}

// Where a limit came from (DiskQuota.From).
const (
	FromRequest = "request"
	FromDefault = "default"
	FromNomad   = "nomad"
)
