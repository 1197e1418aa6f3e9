package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/internal/btrfs"
	"github.com/allocfs/allocfs/internal/projquota"
	"github.com/hashicorp/go-hclog"
)

// TestQuotaCrashAtEveryStep runs every change that moves an allocation's
// disk accounting on a btrfs data dir with limits, killed at each of its
// steps: its disk's and each change the quota makes in the kernel
// (subvolume, qgroup, limit, relation). The next start must leave the
// kernel's groups agreeing with the records, whichever state (before or
// after) they show: each allocation with a limit has its group with that
// limit and the uppers of its volumes, and nothing more, as members; no
// group of the store's range outlives its allocation; no layer is left
// that no record names.
//
// Each run has a data dir of its own on one btrfs image, with a range of
// group IDs of its own, since qgroups are the filesystem's. The kernel's
// state is what a kill -9 leaves (the image is not unmounted); a power
// cut is not simulated here: the btrfs transaction that holds a qgroup
// change commits with or before the journal's fsync.
func TestQuotaCrashAtEveryStep(t *testing.T) {
	mnt := fstest.Image(t, "btrfs", 1024, "")
	if err := btrfs.EnableQuotas(mnt); err != nil {
		t.Fatal(err)
	}
	runQuotaCrashes(t, mnt, 3000000, checkQuotaAgrees)
}

// TestProjectQuotaCrashAtEveryStep is TestQuotaCrashAtEveryStep on a
// filesystem with project quotas: after every crash, each allocation with
// a limit has its project's limits and its uppers in its project, and no
// project of the store's range that no record names keeps limits.
func TestProjectQuotaCrashAtEveryStep(t *testing.T) {
	dir := fstest.ProjectQuotaDir(t)
	if quota.FSType(dir) == "ext4" && quota.HasCapSysResource() {
		t.Skip("ext4 lets CAP_SYS_RESOURCE past project quotas, and this test has it: run it without (setpriv --bounding-set=-sys_resource)")
	}
	runQuotaCrashes(t, dir, 6000000, checkProjectsAgree)
}

// runQuotaCrashes runs the changes that move disk accounting, each once
// to count its steps and again crashed at each, in data dirs under dir
// with group ranges from base up, and checks each with check.
func runQuotaCrashes(t *testing.T, mnt string, base uint64, check func(t *testing.T, dir string, g [2]uint64, where string)) {
	sized := record.Limit{Bytes: 32 << 20}
	stage := func(s *Store) map[string]string {
		dir, err := os.MkdirTemp(s.StagingDir(), "import")
		if err != nil {
			panic(err)
		}
		data := filepath.Join(dir, "alloc", "data")
		if err := os.MkdirAll(data, 0o755); err != nil {
			panic(err)
		}
		if err := os.WriteFile(filepath.Join(data, "f"), []byte("received"), 0o644); err != nil {
			panic(err)
		}
		return map[string]string{"alloc/data": data}
	}
	stopped := func(t *testing.T, s *Store) {
		if _, err := s.Create("a", tasks("web"), CreateOptions{Limit: sized}); err != nil {
			t.Fatal(err)
		}
		putFile(t, s, "a", "alloc/data", "data.txt", "precious")
		must(t, errOnly(s.Stop("a")))
	}
	ops := []struct {
		name  string
		setup func(t *testing.T, s *Store)
		run   func(s *Store) error
	}{
		{"create", func(*testing.T, *Store) {}, func(s *Store) error { return errOnly(s.Create("a", tasks("web"), CreateOptions{Limit: sized})) }},
		{"adopt", stopped, func(s *Store) error {
			_, err := s.Create("b", tasks("web"), CreateOptions{Limit: record.Limit{Bytes: 64 << 20}, Previous: "a", Migration: MigrationAdopt})
			return err
		}},
		{"seal", stopped, func(s *Store) error {
			_, err := s.Create("b", tasks("web"), CreateOptions{Limit: sized, Previous: "a", Migration: MigrationSnapshot})
			return err
		}},
		{"adopt-volume", func(t *testing.T, s *Store) {
			stopped(t, s)
			must(t, errOnly(s.CreateFromMount("b", 0o755, 0, 0)))
			must(t, errOnly(s.SetLimit("b", sized, record.FromNomad)))
		}, func(s *Store) error { return s.AdoptVolume("a", "b", "alloc/data") }},
		{"import", func(*testing.T, *Store) {}, func(s *Store) error {
			return errOnly(s.Create("b", tasks("web"), CreateOptions{Limit: sized, Previous: "a", Migration: MigrationRemote, Imported: stage(s)}))
		}},
		{"set-limit", func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") }, func(s *Store) error {
			return errOnly(s.SetLimit("a", sized, record.FromNomad))
		}},
		{"destroy", stopped, func(s *Store) error { return s.Destroy("a") }},
	}
	next := base
	groups := func() [2]uint64 {
		next += 10
		return [2]uint64{next, next + 9}
	}
	for _, op := range ops {
		t.Run(op.name, func(t *testing.T) {
			open := func(dir string, g [2]uint64, d *crashDisk) *Store {
				opts := Options{Quotas: true, Groups: g}
				if d != nil {
					opts.Disk, opts.quotaStep = d, d.step
				}
				s, err := openStore(t, hclog.NewNullLogger(), dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			// The change without a crash: how many steps it takes.
			dir := filepath.Join(mnt, op.name+"-count")
			g := groups()
			counter := newCrashDisk(t, dir, "", 0, false)
			s := open(dir, g, counter)
			op.setup(t, s)
			counter.steps, counter.trail = 0, nil
			if err := op.run(s); err != nil {
				t.Fatalf("%s without a crash: %v", op.name, err)
			}
			total, trail := counter.steps, counter.trail
			must(t, s.Close())
			check(t, dir, g, "without a crash")
			t.Logf("%s: %d steps: %s", op.name, total, strings.Join(trail, ", "))
			if !slices.ContainsFunc(trail, func(s string) bool {
				return strings.HasPrefix(s, "qgroup") || strings.HasPrefix(s, "subvolume") || strings.HasPrefix(s, "project")
			}) {
				t.Fatalf("%s took no quota step", op.name)
			}
			for n := 1; n <= total; n++ {
				dir := filepath.Join(mnt, fmt.Sprintf("%s-%d", op.name, n))
				g := groups()
				d := newCrashDisk(t, dir, "", 0, false)
				s := open(dir, g, d)
				op.setup(t, s)
				d.steps, d.limit = 0, n
				runErr := op.run(s)
				must(t, s.lock.Release())
				where := fmt.Sprintf("crash at step %d of %d (%s; run: %v)", n, total, trail[n-1], runErr)
				s = open(dir, g, nil)
				if _, err := s.Sweep(); err != nil {
					t.Errorf("%s: sweep: %v", where, err)
				}
				must(t, s.Close())
				check(t, dir, g, where)
			}
		})
	}
}

// checkQuotaAgrees checks, on the closed store in dir, that the kernel's
// groups of range g are the records' (see TestQuotaCrashAtEveryStep).
func checkQuotaAgrees(t *testing.T, dir string, g [2]uint64, where string) {
	t.Helper()
	s, err := openPlainStore(t, hclog.NewNullLogger(), dir, Options{Groups: g})
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	defer s.Close()
	layers := s.layersDir()
	fsid, err := btrfs.FSID(layers)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := btrfs.Relations(layers)
	if err != nil {
		t.Fatal(err)
	}
	members := map[uint64][]string{}
	for child, parents := range rel {
		for _, p := range parents {
			if p.Level() == 1 && p.ID() >= g[0] && p.ID() <= g[1] {
				members[p.ID()] = append(members[p.ID()], child.String())
			}
		}
	}
	named := map[uint64]bool{}
	for _, st := range s.List() {
		for _, key := range st.VolumeKeys() {
			if err := s.checkLayer(st.Volumes[key].Upper); err != nil {
				t.Errorf("%s: %s's %s: %v", where, st.ID, key, err)
			}
		}
		if st.Disk == nil {
			continue
		}
		named[st.Disk.Group] = true
		var want []string
		for _, key := range st.VolumeKeys() {
			id, err := btrfs.SubvolumeID(s.LayerPath(st.Volumes[key].Upper))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, btrfs.Qgroup(0, id).String())
		}
		got := members[st.Disk.Group]
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: %s's group %d has members %v, want its uppers %v", where, st.ID, st.Disk.Group, got, want)
		}
		u, err := btrfs.ReadUsage(fsid, btrfs.Qgroup(1, st.Disk.Group))
		if err != nil || u.MaxReferenced != uint64(st.Disk.Bytes) {
			t.Errorf("%s: %s's group limit %d, want %d (%v)", where, st.ID, u.MaxReferenced, st.Disk.Bytes, err)
		}
	}
	for id := g[0]; id <= g[1]; id++ {
		_, err := os.Lstat(fmt.Sprintf("/sys/fs/btrfs/%s/qgroups/1_%d", fsid, id))
		if err == nil && !named[id] {
			t.Errorf("%s: group %d outlives its allocation (members %v)", where, id, members[id])
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
	}
	used := s.referencedAll()
	for l := range layerSet(t, dir) {
		if _, ok := used[l]; !ok {
			t.Errorf("%s: layer %s is left after the sweep, named by no record", where, l)
		}
	}
}

// checkProjectsAgree is checkQuotaAgrees for project quotas.
func checkProjectsAgree(t *testing.T, dir string, g [2]uint64, where string) {
	t.Helper()
	s, err := openPlainStore(t, hclog.NewNullLogger(), dir, Options{Groups: g})
	if err != nil {
		t.Fatalf("%s: %v", where, err)
	}
	defer s.Close()
	layers := s.layersDir()
	named := map[uint64]bool{}
	for _, st := range s.List() {
		if st.Disk == nil {
			continue
		}
		named[st.Disk.Group] = true
		u, err := projquota.Get(layers, uint32(st.Disk.Group))
		if err != nil || u.LimitBytes != uint64(st.Disk.Bytes) || u.LimitInodes != uint64(st.Disk.Inodes) {
			t.Errorf("%s: %s's project %d limits %d bytes %d inodes, want %+v (%v)", where, st.ID, st.Disk.Group, u.LimitBytes, u.LimitInodes, st.Disk.Limit, err)
		}
		for _, key := range st.VolumeKeys() {
			p, err := projquota.ProjectOf(s.LayerPath(st.Volumes[key].Upper))
			if err != nil || p != uint32(st.Disk.Group) {
				t.Errorf("%s: %s's %s upper in project %d, want %d (%v)", where, st.ID, key, p, st.Disk.Group, err)
			}
		}
	}
	for id := g[0]; id <= g[1]; id++ {
		if named[id] {
			continue
		}
		if u, err := projquota.Get(layers, uint32(id)); err != nil || u.LimitBytes != 0 || u.LimitInodes != 0 {
			t.Errorf("%s: project %d keeps limits %+v with no allocation (%v)", where, id, u, err)
		}
	}
	used := s.referencedAll()
	for l := range layerSet(t, dir) {
		if _, ok := used[l]; !ok {
			t.Errorf("%s: layer %s is left after the sweep, named by no record", where, l)
		}
	}
}
