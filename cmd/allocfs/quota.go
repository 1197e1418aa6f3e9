//go:build linux

package main

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/spf13/pflag"
)

// quotaArgs are serve's flags for allocations' disk limits.
type quotaArgs struct {
	enable         bool
	defaultDiskMB  int64
	groups         string
	nomadAddr      string
	nomadTokenFile string
}

func addQuotaFlags(fset *pflag.FlagSet, q *quotaArgs) {
	fset.BoolVar(&q.enable, "enable-quotas", false, "enforce allocations' disk limits with the data dir's filesystem: btrfs qgroups (accounting is turned on, and every new layer is a subvolume), or project quotas on xfs or ext4 mounted with them (-o prjquota); where the filesystem cannot, serve says what would")
	fset.Int64Var(&q.defaultDiskMB, "default-disk-mb", 0, "disk limit, in `MiB`, of an allocation that asks for none (Nomad's ephemeral_disk.size); 0: none. Needs --enable-quotas on a data dir that can enforce it: serve refuses to start otherwise")
	fset.StringVar(&q.nomadAddr, "nomad-addr", "", "`address` of the Nomad agent (http://127.0.0.1:4646): each allocation Nomad's client makes through the mount gets its task group's ephemeral_disk.size as its disk limit, read from Nomad's API (TLS from the NOMAD_CACERT, NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY variables)")
	fset.StringVar(&q.nomadTokenFile, "nomad-token-file", "", "`file` holding the ACL token (its secret ID) with which to read allocations from --nomad-addr")
	fset.StringVar(&q.groups, "quota-groups", fmt.Sprintf("%d-%d", quota.DefaultGroups[0], quota.DefaultGroups[1]), "`range` of IDs allocfs may take for allocations' quota groups, btrfs level-1 qgroups or project IDs (FIRST-LAST); keep it clear of those the host numbers itself")
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
	if q.nomadAddr != "" {
		if u, err := url.Parse(q.nomadAddr); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return opts, fmt.Errorf("--nomad-addr %q: want http://host:port or https://host:port", q.nomadAddr)
		}
	}
	if q.nomadTokenFile != "" && q.nomadAddr == "" {
		return opts, fmt.Errorf("--nomad-token-file needs --nomad-addr")
	}
	opts.Quotas = q.enable
	opts.Groups = [2]uint64{a, b}
	opts.DefaultLimit = record.Limit{Bytes: q.defaultDiskMB << 20}
	return opts, nil
}
