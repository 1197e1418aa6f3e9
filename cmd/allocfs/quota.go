package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"
)

// quotaArgs are serve's flags for allocations' disk limits.
type quotaArgs struct {
	enable        bool
	defaultDiskMB int64
	groups        string
}

func addQuotaFlags(fset *pflag.FlagSet, q *quotaArgs) {
	fset.BoolVar(&q.enable, "enable-quotas", false, "enforce allocations' disk limits with the data dir's filesystem (btrfs: turns qgroup accounting on, and makes every new layer a subvolume); where the filesystem cannot, serve says what would")
	fset.Int64Var(&q.defaultDiskMB, "default-disk-mb", 0, "disk limit, in `MiB`, of an allocation that asks for none (Nomad's ephemeral_disk.size); 0: none. Needs --enable-quotas on a data dir that can enforce it: serve refuses to start otherwise")
	fset.StringVar(&q.groups, "quota-groups", fmt.Sprintf("%d-%d", store.DefaultGroups[0], store.DefaultGroups[1]), "`range` of btrfs level-1 qgroup IDs allocfs may take for allocations (FIRST-LAST); keep it clear of the qgroups the host numbers itself")
}

// storeOptions turns the flags into the store's options.
func (q quotaArgs) storeOptions() (store.Options, error) {
	var opts store.Options
	if q.defaultDiskMB < 0 || q.defaultDiskMB > 1<<40 {
		return opts, fmt.Errorf("--default-disk-mb %d: want 0 (none) to %d", q.defaultDiskMB, int64(1)<<40)
	}
	first, last, ok := strings.Cut(q.groups, "-")
	a, err1 := strconv.ParseUint(strings.TrimSpace(first), 10, 64)
	b, err2 := strconv.ParseUint(strings.TrimSpace(last), 10, 64)
	if !ok || err1 != nil || err2 != nil || a == 0 || a > b || b >= 1<<48 {
		return opts, fmt.Errorf("--quota-groups %q: want FIRST-LAST, 1 <= FIRST <= LAST < 2^48", q.groups)
	}
	opts.Quotas = q.enable
	opts.Groups = [2]uint64{a, b}
	opts.DefaultLimit = store.Limit{Bytes: q.defaultDiskMB << 20}
	return opts, nil
}

// logQuota says once, at start, whether disk limits are enforced, and
// where they are not, what would enforce them.
func logQuota(logger hclog.Logger, s *store.Store) {
	r := s.Quota()
	if r.Enforced() {
		logger.Info("allocations' disk limits are enforced", "mechanism", r.Mechanism, "filesystem", r.Filesystem,
			"default_limit_mb", s.DefaultLimit().Bytes>>20)
		return
	}
	logger.Info("allocations' disk limits are not enforced: an allocation that asks for one is refused", "filesystem", r.Filesystem, "how_to_enable", r.Why)
}
