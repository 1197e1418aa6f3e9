package store

// Crash injection. Every change of the store is run once to count its
// durable steps (the calls it makes to its disk), then again from the
// same starting data dir once per step N, with the disk dying at step N:
// that step and every later one fail, as they would for a process killed
// there. The data dir is then opened by a fresh store, as the next daemon
// would open it, in two ways:
//
//   - kill: as the dead process left it. kill -9 loses nothing the
//     process wrote, since the page cache survives it.
//   - power: as a power cut would leave it. The simulation follows the
//     ordered journalling of ext4 (data=ordered) and xfs, the backing
//     filesystems allocfs supports: a sync (fsync of any file, or
//     syncfs) makes every earlier change of names, modes and owners
//     durable, together with the data of the file synced (of every file,
//     for syncfs); the data of a file the store wrote and did not sync
//     since is lost (the file keeps its last synced content, or is empty).
//     Layer content written by the test itself counts as synced.
//
// Whatever the step and the mode, the reopened store must show the
// records as they were before the change or as they are after it (layer
// IDs the change made compare equal by position, times are ignored),
// every layer a record stacks must exist, no writable layer may be stacked
// writable by two volumes, and one sweep must leave no layer that no
// record names.

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store/lock"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/hashicorp/go-hclog"
)

// crashOp is one change of the store under test: setup builds the data
// dir it starts from (and is closed afterwards, so that it is durable);
// run makes the change on a store opened on a copy of it.
type crashOp struct {
	name  string
	setup func(t *testing.T, s *Store)
	run   func(s *Store) error
	// check, if set, looks at the reopened store beyond the records:
	// after says which of the two states it showed.
	check func(t *testing.T, s *Store, after bool)
	// merges is set for a change that merges layers by link(2), which
	// a store whose layers are subvolumes does not make (Flatten).
	merges bool
}

// TestCrashAtEveryStep runs every multi-step change of the store with a
// crash at each of its steps, killed and powered off, and checks that a
// restart shows the state before or after the change.
func TestCrashAtEveryStep(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("cp"); err != nil {
		fstest.Lacks(t, "cp is needed to copy data dirs")
	}
	for _, op := range crashOps() {
		t.Run(op.name, func(t *testing.T) {
			t.Parallel()
			tpl := filepath.Join(t.TempDir(), "template")
			s, err := openStore(t, hclog.NewNullLogger(), tpl, Options{})
			must(t, err)
			if op.merges && s.quota != nil && s.quota.Subvolumes() {
				must(t, s.Close())
				t.Skip("the layers are btrfs subvolumes, which Flatten leaves as they are: no change to crash in (the flatten tests check that it makes none)")
			}
			op.setup(t, s)
			must(t, s.Close())
			tplLayers := layerSet(t, tpl)

			// The change without a crash: how many steps, and the
			// state it leaves.
			before := canonicalRecords(t, tpl, tplLayers)
			dir := copyDataDir(t, tpl)
			counter := newCrashDisk(t, dir, tpl, 0, false)
			s, err = openStore(t, hclog.NewNullLogger(), dir, Options{Disk: counter, quotaStep: counter.step})
			must(t, err)
			counter.steps = 0 // opening the closed template takes none
			if err := op.run(s); err != nil {
				t.Fatalf("%s without a crash: %v", op.name, err)
			}
			total := counter.steps
			trail := counter.trail
			after := canonicalRecords(t, dir, tplLayers)
			must(t, s.Close())
			if after == before {
				t.Fatalf("%s changed no record", op.name)
			}
			if total < 2 {
				t.Fatalf("%s took %d steps, want a multi-step change", op.name, total)
			}
			t.Logf("%s: %d steps: %s", op.name, total, strings.Join(trail, ", "))

			seen := map[string]int{}
			for n := 1; n <= total; n++ {
				for _, power := range []bool{false, true} {
					dir := copyDataDir(t, tpl)
					d := newCrashDisk(t, dir, tpl, 0, power)
					s, err := openStore(t, hclog.NewNullLogger(), dir, Options{Disk: d, quotaStep: d.step})
					must(t, err)
					d.steps, d.limit = 0, n
					runErr := op.run(s)
					// The process dies here: nothing it holds runs again.
					must(t, s.lock.Release())
					if power {
						must(t, os.RemoveAll(dir))
						storetest.CopyDataDir(t, d.image, dir)
					}
					mode := map[bool]string{false: "kill", true: "power"}[power]
					where := fmt.Sprintf("crash at step %d of %d (%s; run: %v)", n, total, mode, runErr)
					got := restartAndCheck(t, dir, tplLayers, where)
					switch got.records {
					case before:
						seen["before"]++
					case after:
						seen["after"]++
					default:
						t.Errorf("%s: records are neither before nor after:\n%s\nbefore:\n%s\nafter:\n%s", where, got.records, before, after)
						continue
					}
					if op.check != nil {
						op.check(t, got.store, got.records == after)
					}
				}
			}
			if seen["before"] == 0 || seen["after"] == 0 {
				t.Errorf("states seen after crashes: %v, want both before and after", seen)
			}
		})
	}
}

// restarted is a store opened after a crash and the canonical form of
// its records.
type restarted struct {
	store   *Store
	records string
}

// restartAndCheck opens dir as the next daemon would and checks what
// must hold whatever the crash: the store opens, every layer a record
// names exists, no writable layer is stacked writable twice, and one sweep
// leaves only layers some record names.
func restartAndCheck(t *testing.T, dir string, tplLayers map[string]bool, where string) restarted {
	t.Helper()
	s, err := openStore(t, hclog.NewNullLogger(), dir, Options{})
	// A child another test forks inherits the dead store's lock until it
	// execs; the lock is gone a moment later.
	for i := 0; i < 100 && errors.Is(err, lock.ErrLocked); i++ {
		time.Sleep(10 * time.Millisecond)
		s, err = openStore(t, hclog.NewNullLogger(), dir, Options{})
	}
	if err != nil {
		t.Fatalf("%s: the next start fails: %v", where, err)
	}
	t.Cleanup(func() { s.Close() })
	writable := map[string]string{}
	for _, st := range s.List() {
		for key, v := range st.Volumes {
			for _, l := range v.Layers() {
				if err := s.checkLayer(l); err != nil {
					t.Errorf("%s: %s's %s stacks layer %s: %v", where, st.ID, key, l, err)
				}
			}
			if v.ReadOnly {
				continue
			}
			if other, ok := writable[v.Upper]; ok {
				t.Errorf("%s: layer %s is writable under both %s and %s/%s", where, v.Upper, other, st.ID, key)
			}
			writable[v.Upper] = st.ID + "/" + key
		}
	}
	if _, err := s.Sweep(); err != nil {
		t.Errorf("%s: sweep: %v", where, err)
	}
	used := s.referencedAll()
	for l := range layerSet(t, dir) {
		if _, ok := used[l]; !ok {
			t.Errorf("%s: layer %s is left after the sweep, named by no record", where, l)
		}
	}
	if got := dirNames(t, s.StagingDir()); len(got) != 0 {
		t.Errorf("%s: staging holds %v after the start", where, got)
	}
	return restarted{store: s, records: canonicalRecords(t, dir, tplLayers)}
}

// canonicalRecords renders the records of a data dir, read as a restart
// would (state files and journal), with the layer IDs the template did not
// have numbered by first appearance and the times dropped, so that two
// runs of one change compare equal.
func canonicalRecords(t *testing.T, dir string, tplLayers map[string]bool) string {
	t.Helper()
	cp := copyDataDir(t, dir)
	s, err := openStore(t, hclog.NewNullLogger(), cp, Options{})
	if err != nil {
		t.Fatalf("read records of %s: %v", dir, err)
	}
	defer s.Close()
	fresh := map[string]string{}
	name := func(l string) string {
		if tplLayers[l] {
			return l
		}
		if n, ok := fresh[l]; ok {
			return n
		}
		fresh[l] = fmt.Sprintf("new%d", len(fresh))
		return fresh[l]
	}
	var b strings.Builder
	for _, st := range s.List() {
		st.Created, st.Stopped = time.Time{}, time.Time{}
		if st.Gen != 0 {
			// Random: one run's differs from another's.
			st.Gen = 1
		}
		for _, key := range st.VolumeKeys() {
			v := st.Volumes[key]
			v.Upper = name(v.Upper)
			for i, l := range v.Lowers {
				v.Lowers[i] = name(l)
			}
		}
		for i, l := range st.Retained {
			st.Retained[i] = name(l)
		}
		sort.Strings(st.Retained)
		if st.Tags != nil {
			// Layers are tagged where they are subvolumes, those a
			// change gives a record in the order of their IDs, which
			// are random: the tags compare as a set.
			var values []int
			for _, tag := range st.Tags {
				values = append(values, int(tag))
			}
			sort.Ints(values)
			st.Tags = make(map[string]uint8, len(values))
			for i, tag := range values {
				st.Tags[fmt.Sprintf("tag%02d", i)] = uint8(tag)
			}
		}
		data, err := json.Marshal(st)
		must(t, err)
		b.Write(data)
		b.WriteByte('\n')
	}
	return b.String()
}

func copyDataDir(t *testing.T, dir string) string {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "data")
	storetest.CopyDataDir(t, dir, cp)
	return cp
}

func layerSet(t *testing.T, dir string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, l := range dirNames(t, filepath.Join(dir, layersDirName)) {
		out[l] = true
	}
	return out
}

// volumeHas reports whether the volume key of allocation id shows name
// (a file in any of its layers; the tests' files are never whited out).
func volumeHas(s *Store, id, key, name string) bool {
	st, err := s.Get(id)
	if err != nil || st.Volumes[key] == nil {
		return false
	}
	for _, l := range st.Volumes[key].Layers() {
		if _, err := os.Lstat(filepath.Join(s.LayerPath(l), name)); err == nil {
			return true
		}
	}
	return false
}

// putFile writes a file into the upper layer of a volume, as a task
// would through the mount.
func putFile(t *testing.T, s *Store, id, key, name, content string) {
	t.Helper()
	st := mustState(t, s, id)
	must(t, os.WriteFile(filepath.Join(s.LayerPath(st.Volumes[key].Upper), name), []byte(content), 0o644))
}

// stoppedWithData is the start of the migrations: allocation a, stopped,
// with a file in alloc/data, and b created beside it.
func stoppedWithData(withB bool) func(t *testing.T, s *Store) {
	return func(t *testing.T, s *Store) {
		mustCreate(t, s, "a", "web")
		putFile(t, s, "a", "alloc/data", "data.txt", "precious")
		putFile(t, s, "a", "web/local", "local.txt", "local")
		if _, err := s.Stop("a"); err != nil {
			t.Fatal(err)
		}
		if withB {
			mustCreate(t, s, "b", "web")
		}
	}
}

// dataWith checks that exactly one of a and b shows the migrated data as
// its own writable volume, as the state says.
func dataWith(snapshot bool) func(t *testing.T, s *Store, after bool) {
	return func(t *testing.T, s *Store, after bool) {
		t.Helper()
		if !volumeHas(s, "a", "alloc/data", "data.txt") && !(after && !snapshot) {
			t.Errorf("a lost its data before handing it over")
		}
		if after {
			if !volumeHas(s, "b", "alloc/data", "data.txt") || !volumeHas(s, "b", "web/local", "local.txt") {
				t.Errorf("b does not show the data it took over")
			}
			if !snapshot && !volumeHas(s, "a", "alloc/data", MigratedToName) {
				t.Errorf("a shows no %s note after the adopt", MigratedToName)
			}
			if a, err := s.Get("a"); err == nil && !snapshot {
				note := filepath.Join(s.LayerPath(a.Volumes["alloc/data"].Upper), MigratedToName)
				if b, err := os.ReadFile(note); err != nil || !strings.Contains(string(b), "allocation b") {
					t.Errorf("a's %s note: %q, %v", MigratedToName, b, err)
				}
			}
		}
	}
}

// crashOps are the changes under test.
func crashOps() []crashOp {
	web := []allocdir.Task{{Name: "web"}}
	return []crashOp{
		{
			name:  "create",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run: func(s *Store) error {
				_, err := s.Create("n", []allocdir.Task{{Name: "web"}, {Name: "db"}}, CreateOptions{})
				return err
			},
		},
		{
			name:  "stop",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run:   func(s *Store) error { _, err := s.Stop("a"); return err },
		},
		{
			// The checkpoint that follows changes (at close, or when the
			// journal is over its limit) is itself a multi-step change.
			name:  "stop-and-checkpoint",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run: func(s *Store) error {
				if _, err := s.Stop("a"); err != nil {
					return err
				}
				return s.Close()
			},
		},
		{
			name:  "add-task",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run: func(s *Store) error {
				_, err := s.EnsureTask("a", allocdir.Task{Name: "db"})
				return err
			},
		},
		{
			name:  "create-adopt",
			setup: stoppedWithData(false),
			run: func(s *Store) error {
				_, err := s.Create("b", web, CreateOptions{Previous: "a", Migration: MigrationAdopt})
				return err
			},
			check: dataWith(false),
		},
		{
			name:  "create-seal",
			setup: stoppedWithData(false),
			run: func(s *Store) error {
				_, err := s.Create("b", web, CreateOptions{Previous: "a", Migration: MigrationSnapshot})
				return err
			},
			check: dataWith(true),
		},
		{
			name:  "remap",
			setup: stoppedWithData(true),
			run: func(s *Store) error {
				_, err := s.Migrate("a", "b", []string{"alloc/data", "web/local"}, MigrationAdopt)
				return err
			},
			check: dataWith(false),
		},
		{
			name:  "seal",
			setup: stoppedWithData(true),
			run: func(s *Store) error {
				_, err := s.Migrate("a", "b", []string{"alloc/data", "web/local"}, MigrationSnapshot)
				return err
			},
			check: dataWith(true),
		},
		{
			name: "import",
			setup: func(t *testing.T, s *Store) {
				mustCreate(t, s, "a", "web")
			},
			run: func(s *Store) error {
				// What a fetch leaves in staging: checked and complete.
				dir := filepath.Join(s.StagingDir(), "fetch-1")
				for _, key := range []string{"alloc/data", "web/local"} {
					if err := os.MkdirAll(filepath.Join(dir, key), 0o755); err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(dir, key, "got.txt"), []byte("received"), 0o644); err != nil {
						return err
					}
				}
				_, err := s.Create("b", web, CreateOptions{Previous: "remote", Migration: MigrationRemote, Imported: map[string]string{
					"alloc/data": filepath.Join(dir, "alloc/data"),
					"web/local":  filepath.Join(dir, "web/local"),
				}})
				return err
			},
			check: func(t *testing.T, s *Store, after bool) {
				if after && (!volumeHas(s, "b", "alloc/data", "got.txt") || !volumeHas(s, "b", "web/local", "got.txt")) {
					t.Errorf("b does not show what it received")
				}
			},
		},
		// Nomad's client through the mount: each syscall one change.
		{
			name:  "mount-mkdir-alloc",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run: func(s *Store) error {
				_, err := s.CreateFromMount("n", 0o755, 0, 0)
				return err
			},
		},
		{
			name:  "mount-mkdir-task",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run: func(s *Store) error {
				_, err := s.AddTask("a", "db", 0o777, 0, 0)
				return err
			},
		},
		{
			name:  "mount-rmdir-volume",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run:   func(s *Store) error { return s.DropVolume("a", "alloc/tmp") },
		},
		{
			name: "mount-mkdir-volume",
			setup: func(t *testing.T, s *Store) {
				mustCreate(t, s, "a", "web")
				must(t, s.DropVolume("a", "web/tmp"))
			},
			run: func(s *Store) error {
				_, err := s.AddVolume("a", "web/tmp")
				return err
			},
		},
		{
			name:  "mount-rmdir-task",
			setup: func(t *testing.T, s *Store) { mustCreate(t, s, "a", "web") },
			run:   func(s *Store) error { return s.DropTask("a", "web") },
		},
		{
			// A rename of a task's directory over an empty one: the
			// task's volumes under the new name, the replaced task's
			// layers gone.
			name: "mount-rename-task",
			setup: func(t *testing.T, s *Store) {
				mustCreate(t, s, "a", "web")
				putFile(t, s, "a", "web/local", "l.txt", "local")
				if _, err := s.AddTask("a", "db", 0o777, 0, 0); err != nil {
					t.Fatal(err)
				}
			},
			run: func(s *Store) error { return s.RenameTask("a", "web", "db", true) },
			check: func(t *testing.T, s *Store, after bool) {
				inWeb, inDB := volumeHas(s, "a", "web/local", "l.txt"), volumeHas(s, "a", "db/local", "l.txt")
				if inWeb == inDB || inDB != after {
					t.Errorf("local/ is web's: %v, db's: %v; want exactly one, db's after the change", inWeb, inDB)
				}
			},
		},
		{
			name: "mount-rmdir-shared",
			setup: func(t *testing.T, s *Store) {
				mustCreate(t, s, "a", "web")
				for _, v := range allocdir.SharedAllocDirs {
					must(t, s.DropVolume("a", "alloc/"+v))
				}
			},
			run: func(s *Store) error { return s.DropVolume("a", record.SharedVolume) },
		},
		{
			// Nomad's Move, one volume at a time, the previous
			// allocation still running.
			name: "mount-rename-data",
			setup: func(t *testing.T, s *Store) {
				mustCreate(t, s, "a", "web")
				putFile(t, s, "a", "alloc/data", "data.txt", "precious")
				mustCreate(t, s, "b", "web")
				must(t, s.DropVolume("b", "alloc/data"))
			},
			run: func(s *Store) error { return s.AdoptVolume("a", "b", "alloc/data") },
			check: func(t *testing.T, s *Store, after bool) {
				inA, inB := volumeHas(s, "a", "alloc/data", "data.txt"), volumeHas(s, "b", "alloc/data", "data.txt")
				if inA == inB || inB != after {
					t.Errorf("the data is in a: %v, in b: %v; want it in exactly one, b after the change", inA, inB)
				}
			},
		},
		{
			name: "destroy",
			setup: func(t *testing.T, s *Store) {
				stoppedWithData(false)(t, s)
				if _, err := s.Create("b", web, CreateOptions{Previous: "a", Migration: MigrationSnapshot}); err != nil {
					t.Fatal(err)
				}
			},
			run: func(s *Store) error { return s.Destroy("a") },
			check: func(t *testing.T, s *Store, after bool) {
				if !volumeHas(s, "b", "alloc/data", "data.txt") {
					t.Errorf("b lost the data it stacks on when a was destroyed")
				}
			},
		},
		{
			// One terminal allocation beside a running one: a pass of
			// several is several changes, each as atomic as this one.
			// run asks of the store what a pass of the collector
			// (package gc) asks: the terminal one destroyed, then the
			// sweep, the flatten and the settle of the limits.
			name: "gc",
			setup: func(t *testing.T, s *Store) {
				stoppedWithData(false)(t, s)
				mustCreate(t, s, "c", "web")
			},
			run: func(s *Store) error {
				err := s.Destroy("a")
				_, serr := s.Sweep()
				_, ferr := s.Flatten()
				return errors.Join(err, serr, ferr, s.Resettle())
			},
		},
		{
			name:   "flatten",
			merges: true,
			setup: func(t *testing.T, s *Store) {
				prev := "c0"
				mustCreate(t, s, prev, "web")
				// One lower over the bound: one merge.
				for i := 1; i <= MaxLowers+1; i++ {
					putFile(t, s, prev, "alloc/data", fmt.Sprintf("f%d", i), "gen")
					if _, err := s.Stop(prev); err != nil {
						t.Fatal(err)
					}
					// alloc/data only, so that one volume is over the
					// bound.
					id := fmt.Sprintf("c%d", i)
					mustCreate(t, s, id, "web")
					if _, err := s.Migrate(prev, id, []string{"alloc/data"}, MigrationSnapshot); err != nil {
						t.Fatal(err)
					}
					must(t, s.Destroy(prev))
					prev = id
				}
			},
			run: func(s *Store) error {
				n, err := s.Flatten()
				if err == nil && n == 0 {
					return errors.New("nothing flattened")
				}
				return err
			},
			check: func(t *testing.T, s *Store, after bool) {
				for i := 1; i <= MaxLowers+1; i++ {
					if !volumeHas(s, fmt.Sprintf("c%d", MaxLowers+1), "alloc/data", fmt.Sprintf("f%d", i)) {
						t.Errorf("f%d is gone from the chain's view", i)
					}
				}
			},
		},
	}
}
