package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"
	"github.com/allocfs/allocfs/internal/btrfs"
	"golang.org/x/sys/unix"
)

// openQuotaStore opens a store with disk limits on a fresh btrfs image.
func openQuotaStore(t *testing.T, opts Options) *Store {
	t.Helper()
	mnt := fstest.Image(t, "btrfs", 400, "")
	opts.Quotas = true
	s, err := openStore(t, testLogger(t), filepath.Join(mnt, "data"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if r := s.Quota(); !r.Enforced() || r.Mechanism != quota.BtrfsQgroups || r.Filesystem != "btrfs" {
		t.Fatalf("Quota() = %+v", r)
	}
	return s
}

// fillLayer writes n bytes into a new file of the upper layer of volume
// key of allocation id, syncing it, and returns how many it wrote.
func fillLayer(t *testing.T, s *Store, id, key, name string, n int) (int, error) {
	t.Helper()
	st := mustState(t, s, id)
	return fstest.WriteUntil(filepath.Join(s.LayerPath(st.Volumes[key].Upper), name), 0o644, n)
}

func usageOf(t *testing.T, s *Store, id string) Usage {
	t.Helper()
	unix.Sync()
	u, ok, err := s.Usage(id)
	if err != nil || !ok {
		t.Fatalf("Usage(%s) = %+v, %v, %v", id, u, ok, err)
	}
	return u
}

func TestQuotaLimitsAnAllocation(t *testing.T) {
	s := openQuotaStore(t, Options{})
	const limit = 24 << 20
	st, err := s.Create("a1", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: limit}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Disk == nil || st.Disk.Bytes != limit || st.Disk.Group != quota.DefaultGroups[0] {
		t.Fatalf("record's disk = %+v", st.Disk)
	}
	for key, v := range st.Volumes {
		if ok, err := btrfs.IsSubvolume(s.LayerPath(v.Upper)); err != nil || !ok {
			t.Fatalf("layer of %s is not a subvolume: %v", key, err)
		}
		if st.Tags[v.Upper] == 0 {
			t.Fatalf("layer of %s has no tag: %v", key, st.Tags)
		}
	}
	mustCreate(t, s, "free", "web")
	n1, err := fillLayer(t, s, "a1", "alloc/data", "big", 16<<20)
	if err != nil {
		t.Fatalf("16 MiB into a 24 MiB allocation: %v", err)
	}
	// The logs count against the same limit.
	n2, err := fillLayer(t, s, "a1", "alloc/logs", "web.stdout.0", 16<<20)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("16 MiB more into the logs: %d bytes, %v; want EDQUOT", n2, err)
	}
	if n1+n2 > limit {
		t.Fatalf("%d bytes written under a %d-byte limit", n1+n2, limit)
	}
	if _, err := fillLayer(t, s, "free", "alloc/data", "big", 40<<20); err != nil {
		t.Fatalf("the allocation without a limit: %v", err)
	}
	u := usageOf(t, s, "a1")
	if u.Limit.Bytes != limit || u.Bytes < int64(n1) || u.Bytes > limit {
		t.Fatalf("usage %+v after %d+%d bytes", u, n1, n2)
	}
	if _, ok, err := s.Usage("free"); ok || err != nil {
		t.Fatalf("usage of an allocation without a limit: %v, %v", ok, err)
	}

	// A second allocation takes the next group; destroying the first
	// removes its group.
	st2, err := s.Create("a2", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: limit}})
	if err != nil {
		t.Fatal(err)
	}
	if st2.Disk.Group != quota.DefaultGroups[0]+1 {
		t.Fatalf("second group %d", st2.Disk.Group)
	}
	if err := s.Destroy("a1"); err != nil {
		t.Fatal(err)
	}
	if !s.quota.GroupFree(quota.DefaultGroups[0]) {
		t.Fatal("the group of a destroyed allocation is left")
	}
}

func TestQuotaRefusals(t *testing.T) {
	plain := storetest.Value[*Store](t)(openPlainStore(t, testLogger(t), t.TempDir(), Options{}))
	t.Cleanup(func() { plain.Close() })
	_, err := plain.Create("a1", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 1 << 20}})
	if !errors.Is(err, ErrNoQuota) {
		t.Fatalf("a limit on a store without quotas: %v, want ErrNoQuota", err)
	}
	if files := stateFiles(t, plain); len(files) != 0 || len(layerDirs(t, plain)) != 0 {
		t.Fatalf("a refused create left %v and layers %v", files, layerDirs(t, plain))
	}
	if r := plain.Quota(); r.Enforced() || r.Filesystem == "unknown" || !strings.Contains(r.Why, "--enable-quotas") || !strings.Contains(r.Why, r.Filesystem) {
		t.Fatalf("Quota() of a plain store = %+v", r)
	}
	if _, err := openPlainStore(t, testLogger(t), t.TempDir(), Options{DefaultLimit: record.Limit{Bytes: 1 << 20}}); !errors.Is(err, ErrNoQuota) {
		t.Fatalf("open with a default limit it cannot enforce: %v, want ErrNoQuota", err)
	}

	s := openQuotaStore(t, Options{})
	for _, lim := range []record.Limit{{Inodes: 100}, {Bytes: -1}} {
		if _, err := s.Create("a1", tasks("web"), CreateOptions{Limit: lim}); !errors.Is(err, record.ErrBadLimit) {
			t.Fatalf("limit %+v: %v, want record.ErrBadLimit", lim, err)
		}
	}
	if files := stateFiles(t, s); len(files) != 0 || len(layerDirs(t, s)) != 0 {
		t.Fatalf("a refused create left %v and layers %v", files, layerDirs(t, s))
	}
	for _, g := range [][2]uint64{{5, 4}, {0, 0x10}, {1, 1 << 48}} {
		if _, err := openStore(t, testLogger(t), t.TempDir(), Options{Groups: g}); !errors.Is(err, record.ErrBadLimit) {
			t.Fatalf("group range %v: %v", g, err)
		}
	}
}

// TestQuotaGroupsOfTheHost: a qgroup the host made in the store's range
// is never taken.
func TestQuotaGroupsOfTheHost(t *testing.T) {
	s := openQuotaStore(t, Options{Groups: [2]uint64{7000, 7001}})
	if err := btrfs.CreateQgroup(s.layersDir(), btrfs.Qgroup(1, 7000)); err != nil {
		t.Fatal(err)
	}
	st, err := s.Create("a1", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Disk.Group != 7001 {
		t.Fatalf("group %d, want 7001 (7000 is the host's)", st.Disk.Group)
	}
	if _, err := s.Create("a2", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 8 << 20}}); err == nil {
		t.Fatal("a create past the end of the group range")
	}
	if _, err := s.Get("a2"); err == nil {
		t.Fatal("a refused create left its record")
	}
}

func TestQuotaMigrations(t *testing.T) {
	s := openQuotaStore(t, Options{})
	if _, err := s.Create("a1", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 64 << 20}}); err != nil {
		t.Fatal(err)
	}
	if _, err := fillLayer(t, s, "a1", "alloc/data", "db", 12<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := fillLayer(t, s, "a1", "alloc/logs", "web.stdout.0", 4<<20); err != nil {
		t.Fatal(err)
	}
	before := usageOf(t, s, "a1")
	must(t, errOnly(s.Stop("a1")))

	// Adopt: the data's usage moves to a2, the logs' stays with a1.
	if _, err := s.Create("a2", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 64 << 20}, Previous: "a1", Migration: MigrationAdopt}); err != nil {
		t.Fatal(err)
	}
	u1, u2 := usageOf(t, s, "a1"), usageOf(t, s, "a2")
	if u2.Bytes < 12<<20 || u1.Bytes < 4<<20 || u1.Bytes > before.Bytes-12<<20+1<<20 {
		t.Fatalf("after adopt: a1 %d, a2 %d bytes (a1 had %d)", u1.Bytes, u2.Bytes, before.Bytes)
	}

	// Snapshot: a3 stacks a2's layers and pays only for what it writes.
	must(t, errOnly(s.Stop("a2")))
	if _, err := s.Create("a3", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 64 << 20}, Previous: "a2", Migration: MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	if u3 := usageOf(t, s, "a3"); u3.Bytes > 1<<20 {
		t.Fatalf("a snapshot's new allocation pays %d bytes before writing", u3.Bytes)
	}
	if u2 := usageOf(t, s, "a2"); u2.Bytes < 12<<20 {
		t.Fatalf("the sealed allocation's usage went to %d", u2.Bytes)
	}
	st3 := mustState(t, s, "a3")
	if v := st3.Volumes["alloc/data"]; len(v.Lowers) != 1 || st3.Tags[v.Lowers[0]] == 0 || st3.Tags[v.Lowers[0]] == st3.Tags[v.Upper] {
		t.Fatalf("a3's data volume %+v, tags %v", v, st3.Tags)
	}

	// Adopt onto a smaller limit: carried out, and the writes fail.
	must(t, errOnly(s.Stop("a3")))
	if _, err := fillLayer(t, s, "a3", "alloc/data", "more", 2<<20); err != nil {
		t.Fatal(err)
	}
	must(t, errOnly(s.Stop("a3")))
	if _, err := s.Create("a4", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 1 << 20}, Previous: "a3", Migration: MigrationAdopt}); err != nil {
		t.Fatalf("adopt onto a smaller limit: %v", err)
	}
	if u4 := usageOf(t, s, "a4"); u4.Bytes <= u4.Limit.Bytes {
		t.Fatalf("a4 holds %d of %d bytes", u4.Bytes, u4.Limit.Bytes)
	}
	if _, err := fillLayer(t, s, "a4", "alloc/tmp", "x", 1<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("a write of an allocation over its limit: %v, want EDQUOT", err)
	}
}

// TestQuotaSettlesAtOpen: what a crash between a change's intent and
// its settle leaves (the kernel's groups behind the records), and a
// group of the store's range that no record names, are put right when
// the store opens.
func TestQuotaSettlesAtOpen(t *testing.T) {
	s := openQuotaStore(t, Options{})
	st, err := s.Create("a1", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 8 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.layersDir()
	g := btrfs.Qgroup(1, st.Disk.Group)
	sv, err := btrfs.SubvolumeID(s.LayerPath(st.Volumes["alloc/data"].Upper))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := btrfs.Assign(dir, btrfs.Qgroup(0, sv), g, false); err != nil {
		t.Fatal(err)
	}
	if err := btrfs.Limit(dir, g, 0); err != nil {
		t.Fatal(err)
	}
	stray := btrfs.Qgroup(1, quota.DefaultGroups[0]+5)
	if err := btrfs.CreateQgroup(dir, stray); err != nil {
		t.Fatal(err)
	}
	if _, err := btrfs.Assign(dir, btrfs.Qgroup(0, sv), stray, true); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = openStore(t, testLogger(t), s.DataDir(), Options{Quotas: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	rel, err := btrfs.Relations(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := rel[btrfs.Qgroup(0, sv)]; !slices.Equal(got, []btrfs.QgroupID{g}) {
		t.Fatalf("the data layer's groups after open: %v, want [%v]", got, g)
	}
	if !s.quota.GroupFree(stray.ID()) {
		t.Fatal("a group no record names survived the open")
	}
	if _, err := fillLayer(t, s, "a1", "alloc/data", "big", 16<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("the limit after open: %v, want EDQUOT", err)
	}
}

func TestQuotaImport(t *testing.T) {
	s := openQuotaStore(t, Options{})
	stage := func(n int) map[string]string {
		dir, err := os.MkdirTemp(s.StagingDir(), "import")
		if err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(dir, "alloc", "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(data, "f"), bytes.Repeat([]byte{1}, n), 0o644); err != nil {
			t.Fatal(err)
		}
		return map[string]string{"alloc/data": data}
	}
	before := layerDirs(t, s)
	_, err := s.Create("big", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 2 << 20}, Previous: "prev", Migration: MigrationRemote, Imported: stage(4 << 20)})
	if !errors.Is(err, ErrTooBig) {
		t.Fatalf("an import past the limit: %v, want ErrTooBig", err)
	}
	if _, err := s.Get("big"); err == nil || !slices.Equal(layerDirs(t, s), before) {
		t.Fatalf("a refused import left a record or layers: %v", layerDirs(t, s))
	}
	st, err := s.Create("fits", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 8 << 20}, Previous: "prev", Migration: MigrationRemote, Imported: stage(1 << 20)})
	if err != nil {
		t.Fatal(err)
	}
	v := st.Volumes["alloc/data"]
	if len(v.Lowers) != 1 {
		t.Fatalf("imported volume %+v: want a fresh upper over the received tree", v)
	}
	if ok, _ := btrfs.IsSubvolume(s.LayerPath(v.Upper)); !ok {
		t.Fatal("the imported volume's upper is not a subvolume")
	}
	if _, err := fillLayer(t, s, "fits", "alloc/data", "more", 16<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("writes over an imported volume: %v, want EDQUOT", err)
	}
}

func TestQuotaSetLimit(t *testing.T) {
	s := openQuotaStore(t, Options{})
	mustCreate(t, s, "a1", "web")
	if _, err := fillLayer(t, s, "a1", "alloc/data", "f", 4<<20); err != nil {
		t.Fatal(err)
	}
	st, err := s.SetLimit("a1", record.Limit{Bytes: 2 << 20}, record.FromNomad)
	if err != nil {
		t.Fatal(err)
	}
	if st.Disk == nil || st.Disk.From != record.FromNomad || st.Disk.Bytes != 2<<20 {
		t.Fatalf("record after SetLimit: %+v", st.Disk)
	}
	if _, err := fillLayer(t, s, "a1", "alloc/tmp", "g", 1<<20); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("a write over a limit set below the usage: %v, want EDQUOT", err)
	}
	if _, err := s.SetLimit("a1", record.Limit{Bytes: 64 << 20}, record.FromRequest); err != nil {
		t.Fatal(err)
	}
	if _, err := fillLayer(t, s, "a1", "alloc/tmp", "g", 1<<20); err != nil {
		t.Fatalf("a write after the limit was raised: %v", err)
	}
	if st, err := s.SetLimit("a1", record.Limit{}, record.FromRequest); err != nil || st.Disk != nil {
		t.Fatalf("removing the limit: %+v, %v", st, err)
	}
	if !s.quota.GroupFree(quota.DefaultGroups[0]) {
		t.Fatal("the group of a limit removed is left")
	}
	if _, err := s.SetLimit("nope", record.Limit{Bytes: 1 << 20}, record.FromNomad); err == nil {
		t.Fatal("a limit on an unknown allocation")
	}
}

// TestQuotaSetLimitIsQuiet: a new limit tells no OnChange hook. The mount
// invalidates the kernel's entries from its hook, and a limit arrives
// (from Nomad's API) while Nomad's client is inside a mkdir of the
// allocation: the invalidation would wait for the directory that mkdir
// holds locked, the mkdir for the store the change holds.
func TestQuotaSetLimitIsQuiet(t *testing.T) {
	s := openQuotaStore(t, Options{})
	must(t, errOnly(s.CreateFromMount("a1", 0o755, 0, 0)))
	var heard []string
	stop := s.OnChange(func(id string) { heard = append(heard, id) })
	defer stop()
	if _, err := s.SetLimit("a1", record.Limit{Bytes: 8 << 20}, record.FromNomad); err != nil {
		t.Fatal(err)
	}
	if len(heard) != 0 {
		t.Fatalf("SetLimit told the hooks of %v", heard)
	}
	if st := mustState(t, s, "a1"); st.Disk == nil || st.Disk.From != record.FromNomad {
		t.Fatalf("record after SetLimit: %+v", st.Disk)
	}
}

// TestQuotaTagsAreNeverReused: a layer that replaces another in an
// allocation (an adopt's placeholder) gets a tag the allocation never
// gave: the kernel may still hold the old layer's nodes under the
// numbers the tag made.
func TestQuotaTagsAreNeverReused(t *testing.T) {
	s := openQuotaStore(t, Options{})
	mustCreate(t, s, "a1", "web")
	must(t, errOnly(s.Stop("a1")))
	before := mustState(t, s, "a1")
	seen := map[uint8]bool{}
	for _, tag := range before.Tags {
		seen[tag] = true
	}
	if _, err := s.Create("a2", tasks("web"), CreateOptions{Limit: record.Limit{}, Previous: "a1", Migration: MigrationAdopt}); err != nil {
		t.Fatal(err)
	}
	after := mustState(t, s, "a1")
	for l, tag := range after.Tags {
		if _, kept := before.Tags[l]; !kept && seen[tag] {
			t.Fatalf("a1's new layer %s took tag %d, which a1 gave before (tags before %v, after %v)", l, tag, before.Tags, after.Tags)
		}
	}
	a2 := mustState(t, s, "a2")
	moved := a2.Volumes["alloc/data"].Upper
	if a2.Tags[moved] != before.Tags[moved] {
		t.Errorf("the adopted layer's tag went from %d to %d", before.Tags[moved], a2.Tags[moved])
	}
	if after.TagTop <= before.TagTop {
		t.Errorf("a1's TagTop %d after new layers, was %d", after.TagTop, before.TagTop)
	}
}
