package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/internal/projquota"
	"golang.org/x/sys/unix"
)

// openProjectStore opens a store with disk limits on a filesystem with
// project quotas, or skips (fstest.ProjectQuotaDir says why).
func openProjectStore(t *testing.T, opts Options) *Store {
	t.Helper()
	dir := fstest.ProjectQuotaDir(t)
	opts.Quotas = true
	s, err := openStore(t, testLogger(t), filepath.Join(dir, "data"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r := s.Quota()
	if r.Filesystem == "ext4" && quota.HasCapSysResource() {
		// ext4 lets CAP_SYS_RESOURCE past project limits: the store
		// must refuse to claim it enforces them.
		if r.Enforced() || !strings.Contains(r.Why, "CAP_SYS_RESOURCE") {
			t.Fatalf("Quota() on ext4 with CAP_SYS_RESOURCE = %+v, want refused for it", r)
		}
		t.Skip("ext4 lets CAP_SYS_RESOURCE past project quotas, and this test has it: run it without (setpriv --bounding-set=-sys_resource)")
	}
	if r.Mechanism != quota.ProjectQuotas {
		t.Fatalf("Quota() on a filesystem with project quotas = %+v", r)
	}
	return s
}

// limitErr is the error a write past a project's limit gets: xfs reports
// the project full (ENOSPC), ext4 over quota (EDQUOT).
func limitErr(s *Store) error {
	if s.Quota().Filesystem == "xfs" {
		return unix.ENOSPC
	}
	return unix.EDQUOT
}

// projectOf is the project of the upper layer of volume key of id.
func projectOf(t *testing.T, s *Store, id, key string) uint32 {
	t.Helper()
	p, err := projquota.ProjectOf(s.LayerPath(mustState(t, s, id).Volumes[key].Upper))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProjectQuota: on xfs or ext4 with project quotas, an allocation's
// limit holds its bytes and its inodes against writes into any of its
// volumes, usage is read in one call, an adopt moves the data's project
// (and usage) to the new allocation, a snapshot's new upper is the new
// allocation's, a removed limit frees its project, and a project the host
// uses in the range is never taken.
func TestProjectQuota(t *testing.T) {
	s := openProjectStore(t, Options{Groups: [2]uint64{5000, 5099}})
	if err := projquota.Limit(s.layersDir(), 5000, 1<<30, 0); err != nil {
		t.Fatal(err)
	}
	st, err := s.Create("a1", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 16 << 20, Inodes: 64}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Disk.Group != 5001 || len(st.Tags) != 0 {
		t.Fatalf("record: %+v, tags %v; want group 5001 (5000 is the host's) and no tags", st.Disk, st.Tags)
	}
	for key := range st.Volumes {
		if p := projectOf(t, s, "a1", key); p != 5001 {
			t.Fatalf("%s's upper is in project %d", key, p)
		}
	}
	n, err := fillLayer(t, s, "a1", "alloc/data", "big", 32<<20)
	if !errors.Is(err, limitErr(s)) || n > 16<<20 {
		t.Fatalf("32 MiB into a 16 MiB allocation: %d bytes, %v; want EDQUOT", n, err)
	}
	must(t, os.Remove(filepath.Join(s.LayerPath(st.Volumes["alloc/data"].Upper), "big")))
	made := 0
	for ; made < 200; made++ {
		d := s.LayerPath(st.Volumes["web/tmp"].Upper)
		if err := os.WriteFile(filepath.Join(d, "f"+string(rune('A'+made%26))+string(rune('a'+made/26))), nil, 0o644); err != nil {
			if !errors.Is(err, limitErr(s)) {
				t.Fatalf("file %d: %v, want EDQUOT", made, err)
			}
			break
		}
	}
	if made >= 64 || made == 0 {
		t.Fatalf("%d files made under a limit of 64 inodes", made)
	}
	u := usageOf(t, s, "a1")
	if u.Inodes < int64(made) || u.Limit.Inodes != 64 {
		t.Fatalf("usage %+v after %d files", u, made)
	}
	tmp := s.LayerPath(st.Volumes["web/tmp"].Upper)
	must(t, os.RemoveAll(tmp))
	must(t, os.Mkdir(tmp, 0o777))
	must(t, errOnly(s.SetLimit("a1", record.Limit{Bytes: 16 << 20, Inodes: 64}, record.FromRequest)))
	if _, err := fillLayer(t, s, "a1", "alloc/data", "eight", 8<<20); err != nil {
		t.Fatalf("8 MiB into a 16 MiB allocation: %v", err)
	}

	// Adopt onto a smaller limit: carried out, every byte moved into
	// a2's project, and a2's writes fail until it deletes.
	must(t, errOnly(s.Stop("a1")))
	dataLayer := mustState(t, s, "a1").Volumes["alloc/data"].Upper
	if _, err := s.Create("a2", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 4 << 20}, Previous: "a1", Migration: MigrationAdopt}); err != nil {
		t.Fatal(err)
	}
	st2 := mustState(t, s, "a2")
	if st2.Volumes["alloc/data"].Upper != dataLayer || projectOf(t, s, "a2", "alloc/data") != uint32(st2.Disk.Group) {
		t.Fatalf("a2's data layer %s is in project %d, want a2's %d", st2.Volumes["alloc/data"].Upper, projectOf(t, s, "a2", "alloc/data"), st2.Disk.Group)
	}
	if u2 := usageOf(t, s, "a2"); u2.Bytes < 8<<20 || u2.Limit.Bytes != 4<<20 {
		t.Fatalf("a2 after adopting 8 MiB: %+v", u2)
	}
	if err := s.QuotaError(); err != nil {
		t.Fatalf("the adopt onto a smaller limit left the projects unsettled: %v", err)
	}
	if _, err := fillLayer(t, s, "a2", "alloc/tmp", "x", 1<<20); !errors.Is(err, limitErr(s)) {
		t.Fatalf("a write of an allocation over its limit: %v, want %v", err, limitErr(s))
	}
	must(t, errOnly(s.SetLimit("a2", record.Limit{Bytes: 64 << 20}, record.FromRequest)))
	if _, err := fillLayer(t, s, "a2", "alloc/data", "more", 8<<20); err != nil {
		t.Fatalf("a2 writes after its limit was raised: %v", err)
	}

	// Snapshot: a3's fresh upper is a3's.
	must(t, errOnly(s.Stop("a2")))
	if _, err := s.Create("a3", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 32 << 20}, Previous: "a2", Migration: MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	st3 := mustState(t, s, "a3")
	if p := projectOf(t, s, "a3", "alloc/data"); p != uint32(st3.Disk.Group) || projectOf(t, s, "a2", "alloc/data") != uint32(st2.Disk.Group) {
		t.Fatalf("after the snapshot: a3's upper in %d (want %d), a2's in %d", p, st3.Disk.Group, projectOf(t, s, "a2", "alloc/data"))
	}

	// A limit removed: the uppers go back to project 0, the project's
	// limits are cleared, and it is free once its files are gone.
	if _, err := s.SetLimit("a3", record.Limit{}, record.FromRequest); err != nil {
		t.Fatal(err)
	}
	if p := projectOf(t, s, "a3", "alloc/data"); p != 0 {
		t.Fatalf("a3's upper in project %d after its limit was removed", p)
	}
	if !s.quota.GroupFree(st3.Disk.Group) {
		t.Fatalf("project %d is not free after its limit was removed", st3.Disk.Group)
	}
	if err := s.QuotaError(); err != nil {
		t.Fatalf("projects unsettled at the end: %v", err)
	}
}
