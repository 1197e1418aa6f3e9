package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/store/storetest"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// testLogger is the repository's one test logger.
var testLogger = allocdirtest.Logger

// Helpers shared with the tree's tests (package fs).
var (
	must, mustWrite = storetest.Must, storetest.MustWrite
	dirNames, tasks = storetest.DirNames, storetest.Tasks
)

func errOnly[T any](v T, err error) error { return storetest.ErrOnly(v, err) }

func mustState(t *testing.T, s *Store, id string) *record.State {
	return storetest.Value[*record.State](t)(s.Get(id))
}

// openTestStore opens a store in dir, failing the test on error, and
// closes it when the test ends.
func openTestStore(t *testing.T, dir string) *Store {
	t.Helper()
	return openTestStoreWith(t, dir, Options{})
}

// openTestStoreWith is openTestStore with opts.
func openTestStoreWith(t *testing.T, dir string, opts Options) *Store {
	t.Helper()
	s, err := openStore(t, testLogger(t), dir, opts)
	if err != nil {
		t.Fatalf("Open(%q): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// openStore is how every test of the store opens one: through
// storetest.Open, which puts it on btrfs subvolumes under make
// test-btrfs. The caller closes it, or kills it as a crash test does.
// Unless opts takes the quota's steps itself, they go to the fault
// setFault installs, as the disk's do.
func openStore(t testing.TB, logger hclog.Logger, dir string, opts Options) (*Store, error) {
	t.Helper()
	var s *Store
	if opts.quotaStep == nil {
		opts.quotaStep = func(op, p string) error { return quotaFault(s, op, p) }
	}
	var err error
	s, err = storetest.Open(t, func(limits bool) (*Store, error) {
		opts.Quotas = opts.Quotas || limits
		return OpenWith(logger, dir, opts)
	})
	return s, err
}

// openPlainStore is openStore for the tests of a store without disk
// limits, whatever the run asks.
func openPlainStore(t testing.TB, logger hclog.Logger, dir string, opts Options) (*Store, error) {
	t.Helper()
	return storetest.OpenPlain(t, func(bool) (*Store, error) { return OpenWith(logger, dir, opts) })
}

// restartView opens a copy of s's data dir as it is now: what a daemon
// killed at this instant (kill -9: the page cache survives) would find on
// its next start. s goes on untouched.
func restartView(t *testing.T, s *Store) *Store {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "data")
	storetest.CopyDataDir(t, s.DataDir(), cp)
	return openTestStore(t, cp)
}

// reopenStore closes s, as a daemon that stops does, and opens its data
// dir again.
func reopenStore(t *testing.T, s *Store) *Store {
	t.Helper()
	if err := s.Close(); err != nil {
		t.Fatalf("close store: %v", err)
	}
	return openTestStore(t, s.DataDir())
}

func layerDirs(t *testing.T, s *Store) []string {
	return dirNames(t, filepath.Join(s.DataDir(), "layers"))
}

// stateFiles lists the state files, without the journal.
func stateFiles(t *testing.T, s *Store) []string {
	var out []string
	for _, n := range dirNames(t, filepath.Join(s.DataDir(), "state")) {
		if n != journalName {
			out = append(out, n)
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}

func mustCreate(t *testing.T, s *Store, id string, names ...string) *record.State {
	t.Helper()
	st, err := s.Create(id, tasks(names...), CreateOptions{})
	if err != nil {
		t.Fatalf("Create(%q, %v): %v", id, names, err)
	}
	return st
}

// TestStoreCreate checks the records and the directories Create makes, and
// that the umask does not change their modes. Not parallel: it sets the
// process umask.
func TestStoreCreate(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	dir := filepath.Join(t.TempDir(), "data")
	s := openTestStore(t, dir)
	if fi, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	} else if got, want := fi.Mode(), os.ModeDir|0o755; got != want {
		t.Errorf("mode of the data dir: got %v, want %v", got, want)
	}
	for _, sub := range []string{"state", "layers", "staging"} {
		fi, err := os.Stat(filepath.Join(dir, sub))
		if err != nil {
			t.Fatalf("data dir: %v", err)
		}
		if got, want := fi.Mode(), os.ModeDir|0o700; got != want {
			t.Errorf("mode of %s/: got %v, want %v", sub, got, want)
		}
	}

	before := time.Now()
	st := mustCreate(t, s, "a1", "web", "sidecar")
	if st.ID != "a1" || st.Status != record.StatusRunning {
		t.Errorf("got ID %q status %q, want %q %q", st.ID, st.Status, "a1", record.StatusRunning)
	}
	if st.Created.Before(before.Add(-time.Second)) || st.Created.After(time.Now().Add(time.Second)) {
		t.Errorf("created: got %v, want about %v", st.Created, before)
	}
	if got, want := st.Tasks, tasks("web", "sidecar"); !reflect.DeepEqual(got, want) {
		t.Errorf("tasks: got %v, want %v", got, want)
	}

	wantModes := map[string]os.FileMode{
		".":             0o755,
		"alloc":         0o777,
		"alloc/data":    0o777,
		"alloc/logs":    0o777,
		"alloc/tmp":     0o777,
		"web":           0o777,
		"sidecar":       0o777,
		"web/local":     0o777,
		"web/tmp":       0o777 | os.ModeSticky,
		"sidecar/local": 0o777,
		"sidecar/tmp":   0o777 | os.ModeSticky,
	}
	if got, want := len(st.Volumes), len(wantModes); got != want {
		t.Errorf("volumes: got %d (%v), want %d", got, st.Volumes, want)
	}
	var nobodyUID, nobodyGID = -1, -1
	if os.Geteuid() == 0 {
		if u, err := user.Lookup("nobody"); err == nil {
			nobodyUID, _ = strconv.Atoi(u.Uid)
			nobodyGID, _ = strconv.Atoi(u.Gid)
		}
	}
	seen := map[string]string{}
	for key, mode := range wantModes {
		v := st.Volumes[key]
		if v == nil {
			t.Errorf("volume %q: missing", key)
			continue
		}
		if len(v.Upper) != 16 || strings.Trim(v.Upper, "0123456789abcdef") != "" {
			t.Errorf("volume %q: got layer ID %q, want 16 hex characters", key, v.Upper)
		}
		if len(v.Lowers) != 0 {
			t.Errorf("volume %q: got lowers %v, want none", key, v.Lowers)
		}
		if other, dup := seen[v.Upper]; dup {
			t.Errorf("volumes %q and %q share layer %s, want one each", key, other, v.Upper)
		}
		seen[v.Upper] = key
		fi, err := os.Lstat(s.LayerPath(v.Upper))
		if err != nil {
			t.Errorf("volume %q: %v", key, err)
			continue
		}
		if got, want := fi.Mode(), os.ModeDir|mode; got != want {
			t.Errorf("volume %q: got mode %v, want %v", key, got, want)
		}
		if key == record.RootVolume {
			// The allocation's own directory is the agent's.
			if sys := fi.Sys().(*syscall.Stat_t); int(sys.Uid) != os.Geteuid() {
				t.Errorf("volume %q: got owner %d, want the daemon's %d", key, sys.Uid, os.Geteuid())
			}
		} else if nobodyUID >= 0 {
			sys := fi.Sys().(*syscall.Stat_t)
			if int(sys.Uid) != nobodyUID || int(sys.Gid) != nobodyGID {
				t.Errorf("volume %q: got owner %d:%d, want nobody %d:%d", key, sys.Uid, sys.Gid, nobodyUID, nobodyGID)
			}
		}
	}
	if got, want := len(layerDirs(t, s)), len(wantModes); got != want {
		t.Errorf("layer dirs: got %d, want %d", got, want)
	}
	if got, want := stateFiles(t, s), []string{"a1.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("state dir: got %v, want %v", got, want)
	}
	onDisk, err := record.Read(filepath.Join(dir, "state", "a1.json"))
	if err != nil {
		t.Fatalf("record.Read: %v", err)
	}
	if !reflect.DeepEqual(onDisk, st) {
		t.Errorf("state file: got %+v, want %+v", onDisk, st)
	}
	got, err := s.Get("a1")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !reflect.DeepEqual(got, st) {
		t.Errorf("Get: got %+v, want %+v", got, st)
	}
}

// TestStoreReopen checks that a reopened store holds the same states.
func TestStoreReopen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	mustCreate(t, s, "b", "web")
	mustCreate(t, s, "a", "web", "db")
	if _, err := s.Update("b", func(st *record.State) error {
		st.Status = record.StatusTerminal
		return nil
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	want := s.List()
	if got := []string{want[0].ID, want[1].ID}; !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("List order: got %v, want [a b]", got)
	}

	s2 := restartView(t, s)
	if got := s2.List(); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: got %+v, want %+v", got, want)
	}
}

// TestStoreCreateInvalid checks that bad IDs and tasks are refused and
// leave nothing on disk.
func TestStoreCreateInvalid(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		id    string
		tasks []allocdir.Task
		want  error
	}{
		{"empty id", "", tasks("web"), allocdir.ErrInvalidName},
		{"dot id", ".", tasks("web"), allocdir.ErrInvalidName},
		{"dotdot id", "..", tasks("web"), allocdir.ErrInvalidName},
		{"slash id", "a/b", tasks("web"), allocdir.ErrInvalidName},
		{"nul id", "a\x00b", tasks("web"), allocdir.ErrInvalidName},
		{"id too long for a file name", strings.Repeat("x", 251), tasks("web"), allocdir.ErrInvalidName},
		{"no tasks", "x", nil, ErrNoTasks},
		{"task alloc", "x", tasks("alloc"), allocdir.ErrInvalidName},
		{"duplicate task", "x", tasks("web", "db", "web"), allocdir.ErrInvalidName},
		{"slash task", "x", tasks("web", "a/b"), allocdir.ErrInvalidName},
		{"empty task", "x", tasks(""), allocdir.ErrInvalidName},
		{"dotdot task", "x", tasks(".."), allocdir.ErrInvalidName},
	}
	s := openTestStore(t, t.TempDir())
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, err := s.Create(c.id, c.tasks, CreateOptions{})
			if !errors.Is(err, c.want) {
				t.Fatalf("Create(%q, %v): got %v, want %v", c.id, c.tasks, err, c.want)
			}
			if st != nil {
				t.Errorf("got state %+v, want nil", st)
			}
			if got := stateFiles(t, s); len(got) != 0 {
				t.Errorf("state dir: got %v, want empty", got)
			}
			if got := layerDirs(t, s); len(got) != 0 {
				t.Errorf("layers dir: got %v, want empty", got)
			}
			if got := s.List(); len(got) != 0 {
				t.Errorf("List: got %d states, want 0", len(got))
			}
		})
	}
}

// TestStoreCreateExists checks that a duplicate ID is refused and changes
// nothing.
func TestStoreCreateExists(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	want := mustCreate(t, s, "x", "web")
	layers := layerDirs(t, s)
	file := filepath.Join(s.DataDir(), "state", "x.json")
	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}

	_, err = s.Create("x", tasks("other"), CreateOptions{})
	if !errors.Is(err, ErrExists) {
		t.Fatalf("second Create: got %v, want %v", err, ErrExists)
	}
	if got := layerDirs(t, s); !reflect.DeepEqual(got, layers) {
		t.Errorf("layers: got %v, want %v", got, layers)
	}
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after, before) {
		t.Errorf("state file changed: got %s, want %s", after, before)
	}
	if got, _ := s.Get("x"); !reflect.DeepEqual(got, want) {
		t.Errorf("Get: got %+v, want %+v", got, want)
	}
}

// TestCreateOptionsRefused checks that options that contradict
// themselves are refused before anything changes, the previous
// allocation included, and that Migrate takes only the local kinds.
func TestCreateOptionsRefused(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	mustCreate(t, s, "prev", "web")
	must(t, errOnly(s.Stop("prev")))
	prev := mustState(t, s, "prev")
	layers := layerDirs(t, s)
	staged := map[string]string{"alloc/data": filepath.Join(s.StagingDir(), "fetch", "alloc/data")}
	for _, c := range []struct {
		name string
		opts CreateOptions
	}{
		{"previous without a migration", CreateOptions{Previous: "prev"}},
		{"adopt without a previous", CreateOptions{Migration: MigrationAdopt}},
		{"snapshot without a previous", CreateOptions{Migration: MigrationSnapshot}},
		{"remote without a previous", CreateOptions{Migration: MigrationRemote, Imported: staged}},
		{"imported without a migration", CreateOptions{Imported: staged}},
		{"imported into an adopt", CreateOptions{Previous: "prev", Migration: MigrationAdopt, Imported: staged}},
		{"imported into a snapshot", CreateOptions{Previous: "prev", Migration: MigrationSnapshot, Imported: map[string]string{}}},
		{"unknown migration", CreateOptions{Previous: "prev", Migration: "copy"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if st, err := s.Create("next", tasks("web"), c.opts); !errors.Is(err, ErrBadOptions) || st != nil {
				t.Fatalf("Create(%+v) = %v, %v; want ErrBadOptions", c.opts, st, err)
			}
			if _, err := s.Get("next"); !errors.Is(err, allocdir.ErrUnknownAlloc) {
				t.Errorf("the refused allocation exists: %v", err)
			}
			if got := layerDirs(t, s); !reflect.DeepEqual(got, layers) {
				t.Errorf("layers: got %v, want %v", got, layers)
			}
			if got := mustState(t, s, "prev"); !reflect.DeepEqual(got, prev) {
				t.Errorf("the previous allocation changed: %+v, want %+v", got, prev)
			}
		})
	}
	mustCreate(t, s, "next", "web")
	for _, kind := range []MigrationKind{"", MigrationRemote, "copy"} {
		if n, err := s.Migrate("prev", "next", []string{"alloc/data"}, kind); !errors.Is(err, ErrBadOptions) || n != 0 {
			t.Errorf("Migrate(%q) = %d, %v; want ErrBadOptions", kind, n, err)
		}
	}
	if got := mustState(t, s, "prev"); !reflect.DeepEqual(got, prev) {
		t.Errorf("a refused Migrate changed the previous allocation: %+v, want %+v", got, prev)
	}
}

// TestStoreCreateFailureLeavesNothing checks that a full disk at any step
// of Create leaves no layer, no state file and no record.
func TestStoreCreateFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, step := range []struct {
		op string // "mkdir": the making of a layer's root (layerRootOp)
		n  int    // fail the n-th call of op
	}{{"mkdir", 1}, {"mkdir", 4}, {"mkdir", 7}, {"append", 1}} {
		t.Run(fmt.Sprintf("%s#%d", step.op, step.n), func(t *testing.T) {
			s := openTestStore(t, t.TempDir())
			want := step.op
			if want == "mkdir" {
				want = layerRootOp(s)
			}
			calls := 0
			setFault(s, func(op, _ string) error {
				if op != want {
					return nil
				}
				calls++
				if calls == step.n {
					return syscall.ENOSPC
				}
				return nil
			})
			_, err := s.Create("x", tasks("web", "db"), CreateOptions{})
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Create: got %v, want %v", err, syscall.ENOSPC)
			}
			if got := stateFiles(t, s); len(got) != 0 {
				t.Errorf("state dir: got %v, want empty", got)
			}
			if got := layerDirs(t, s); len(got) != 0 {
				t.Errorf("layers dir: got %v, want empty", got)
			}
			if _, err := s.Get("x"); !errors.Is(err, allocdir.ErrUnknownAlloc) {
				t.Errorf("Get: got %v, want %v", err, allocdir.ErrUnknownAlloc)
			}

			setFault(s, nil)
			mustCreate(t, s, "x", "web", "db")
		})
	}
}

// TestStoreOpenBadState checks that Open refuses a state file it
// cannot use, and names the file in its error.
func TestStoreOpenBadState(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		setup func(t *testing.T, stateDir string) string // returns the bad file
	}{
		{"not json", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "x.json")
			writeFile(t, p, "{not json")
			return p
		}},
		{"truncated", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "x.json")
			writeFile(t, p, "")
			return p
		}},
		{"id does not match name", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "x.json")
			writeFile(t, p, `{"id":"y","tasks":[{"Name":"web"}],"status":"running","volumes":{}}`)
			return p
		}},
		{"unreadable", func(t *testing.T, dir string) string {
			p := filepath.Join(dir, "x.json")
			if err := os.Mkdir(p, 0o700); err != nil {
				t.Fatal(err)
			}
			return p
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			stateDir := filepath.Join(dir, "state")
			if err := os.MkdirAll(stateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			bad := c.setup(t, stateDir)
			s, err := openStore(t, testLogger(t), dir, Options{})
			if err == nil {
				t.Fatalf("Open: got a store, want an error naming %q", bad)
			}
			if s != nil {
				t.Errorf("Open: got a store with the error, want nil")
			}
			// The operator must be told which file to move away.
			if !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "move") {
				t.Errorf("Open: got %q, want it to name %q and say to move it", err, bad)
			}
		})
	}
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestStoreOpenMissingLayer checks that Open refuses a state whose
// layer is gone, naming the allocation and the layer.
func TestStoreOpenMissingLayer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	st := mustCreate(t, s, "x", "web")
	layer := st.Volumes["web/local"].Upper
	if err := os.RemoveAll(s.LayerPath(layer)); err != nil {
		t.Fatal(err)
	}
	must(t, s.Close())
	_, err := openStore(t, testLogger(t), dir, Options{})
	if !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("Open: got %v, want %v", err, iofs.ErrNotExist)
	}
	if !strings.Contains(err.Error(), `allocation "x" `) || !strings.Contains(err.Error(), layer) {
		t.Errorf("Open: got %q, want it to name allocation x and layer %s", err, layer)
	}
}

// TestStoreOpenCleansUp checks that Open empties staging/ and removes
// temporary state files, and leaves unreferenced layers alone.
func TestStoreOpenCleansUp(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	mustCreate(t, s, "x", "web")
	layers := layerDirs(t, s)

	staging := s.StagingDir()
	if err := os.MkdirAll(filepath.Join(staging, "half", "deep", "er"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(staging, "half", "deep", "er", "f"), "partial")
	writeFile(t, filepath.Join(staging, "loose"), "partial")
	writeFile(t, filepath.Join(dir, "state", "123456.tmp"), "{half a state")
	orphan := "00000000000000ff"
	if err := os.MkdirAll(filepath.Join(s.LayerPath(orphan), "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(s.LayerPath(orphan), "sub", "f"), "keep me")

	var logs bytes.Buffer
	logger := hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Debug})
	must(t, s.Close())
	s2, err := openStore(t, logger, dir, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s2.Close()
	if got := dirNames(t, staging); len(got) != 0 {
		t.Errorf("staging: got %v, want empty", got)
	}
	if got, want := stateFiles(t, s), []string{"x.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("state dir: got %v, want %v", got, want)
	}
	wantLayers := append(slices.Clone(layers), orphan)
	sort.Strings(wantLayers)
	if got := layerDirs(t, s); !reflect.DeepEqual(got, wantLayers) {
		t.Errorf("layers: got %v, want %v", got, wantLayers)
	}
	if b, err := os.ReadFile(filepath.Join(s.LayerPath(orphan), "sub", "f")); err != nil || string(b) != "keep me" {
		t.Errorf("orphan layer content: got %q, %v, want %q", b, err, "keep me")
	}
	out := logs.String()
	if !strings.Contains(out, "orphan layer") || !strings.Contains(out, "layer="+orphan) {
		t.Errorf("log: got %q, want an orphan layer warning for %s", out, orphan)
	}
	// Nothing names it, so nothing can need it: the collector's sweep
	// removes it, and says so.
	logs.Reset()
	if n, err := s2.Sweep(); n != 1 || err != nil {
		t.Errorf("Sweep: removed %d, %v; want the orphan", n, err)
	}
	if got := layerDirs(t, s2); !reflect.DeepEqual(got, layers) {
		t.Errorf("layers after the sweep: got %v, want %v", got, layers)
	}
	if out := logs.String(); !strings.Contains(out, "removed orphan layer") || !strings.Contains(out, "layer="+orphan) {
		t.Errorf("log: got %q, want the orphan's removal", out)
	}
}

// TestStoreOnChange checks that hooks hear of every create, update,
// task addition and destroy before the call that made it returns, and
// nothing once removed.
func TestStoreOnChange(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	var mu sync.Mutex
	var got []string
	stop := s.OnChange(func(id string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, id)
	})
	heard := func(want ...string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("hook heard %v, want %v", got, want)
		}
		got = nil
	}
	mustCreate(t, s, "a", "web")
	heard("a")
	if _, err := s.Update("a", func(st *record.State) error { st.Status = record.StatusTerminal; return nil }); err != nil {
		t.Fatal(err)
	}
	heard("a")
	if _, err := s.EnsureTask("a", allocdir.Task{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	heard("a")
	mustCreate(t, s, "b", "web")
	heard("b")
	if _, err := s.Migrate("a", "b", []string{"alloc/data"}, MigrationAdopt); err != nil {
		t.Fatal(err)
	}
	heard("a", "b") // one change of both records
	if err := s.Destroy("a"); err != nil {
		t.Fatal(err)
	}
	heard("a")
	if _, err := s.Create("a", nil, CreateOptions{}); err == nil {
		t.Fatal("Create without tasks succeeded")
	}
	heard() // a refused change is not a change

	stop()
	stop() // twice is fine
	mustCreate(t, s, "after", "web")
	heard()
}

// TestStoreStatfs checks that Statfs reports the data dir's filesystem.
func TestStoreStatfs(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	st, err := s.Statfs()
	if err != nil {
		t.Fatalf("Statfs: %v", err)
	}
	if st.Bsize <= 0 || st.Blocks == 0 {
		t.Errorf("got bsize %d blocks %d, want both > 0", st.Bsize, st.Blocks)
	}
}

// TestStoreOpenRefusesNonDir checks that a file in place of state/ is
// refused rather than written through.
func TestStoreOpenRefusesNonDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	target := t.TempDir()
	if err := os.Symlink(target, filepath.Join(dir, "state")); err != nil {
		t.Fatal(err)
	}
	if _, err := openStore(t, testLogger(t), dir, Options{}); err == nil {
		t.Fatal("Open with state/ a symlink: got nil error, want one")
	}
}

// TestCloseUnlocksWhileAChildHoldsTheLock: a child forked by anything in
// the process shares the lock's descriptor until it execs (or for its
// life, if it inherited it): closing the store still lets the next Open
// in at once. The child gets a duplicate of the store's own descriptor of
// <data-dir>/lock, found in /proc/self/fd, so that it shares the lock.
func TestCloseUnlocksWhileAChildHoldsTheLock(t *testing.T) {
	dir := t.TempDir()
	s := openTestStore(t, dir)
	held := openLockDescriptor(t, filepath.Join(dir, "lock"))
	child := exec.Command("sleep", "30")
	child.ExtraFiles = []*os.File{held}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	held.Close()
	t.Cleanup(func() {
		child.Process.Kill()
		child.Wait()
	})
	must(t, s.Close())
	s2 := openTestStore(t, dir)
	must(t, s2.Close())
}

// openLockDescriptor returns a duplicate of the process's descriptor of
// path.
func openLockDescriptor(t *testing.T, path string) *os.File {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err != nil || target != path {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return os.NewFile(uintptr(dup), path)
	}
	t.Fatalf("the process has no descriptor of %s", path)
	return nil
}

// TestOnChangeRunsUnlocked: a change's OnChange hooks run before its
// method returns, and with the store taking changes again: a hook's
// kernel notification may wait for a directory that a FUSE request holds
// locked while its handler waits for the store.
func TestOnChangeRunsUnlocked(t *testing.T) {
	s := openTestStore(t, t.TempDir())
	var heard []string
	var locked []bool
	stop := s.OnChange(func(id string) {
		heard = append(heard, id)
		free := s.writeMu.TryLock()
		if free {
			s.writeMu.Mutex.Unlock()
		}
		locked = append(locked, !free)
	})
	defer stop()
	mustCreate(t, s, "a1", "web")
	if _, err := s.Stop("a1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Destroy("a1"); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(heard, []string{"a1", "a1", "a1"}) {
		t.Fatalf("hooks heard %v by the time the changes returned, want a1 three times", heard)
	}
	if slices.Contains(locked, true) {
		t.Fatalf("a hook ran while the store held its change lock: %v", locked)
	}
}

// TestOpenUpgradesRecords opens a record of an earlier version, whose own
// directory and alloc/ were synthesised (their attributes in Dirs, a
// removed alloc/ in Gone, no generation), and checks that the store gives
// it their volumes with those attributes, keeps its generation, and that
// a reopen changes nothing more.
func TestOpenUpgradesRecords(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := openStore(t, hclog.NewNullLogger(), dir, Options{})
	must(t, err)
	mustCreate(t, s, "a", "web")
	mustCreate(t, s, "b", "web")
	mtime := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	old := func(gone bool) func(st *record.State) error {
		return func(st *record.State) error {
			delete(st.Volumes, record.RootVolume)
			delete(st.Volumes, record.SharedVolume)
			st.Gen = 0
			st.Dirs = map[string]*record.DirAttr{
				record.DirRoot:   {Mode: 0o751, UID: 12, GID: 34, Atime: mtime, Mtime: mtime},
				record.DirShared: {Mode: 0o707, UID: 56, GID: 78, Atime: mtime, Mtime: mtime},
			}
			if gone {
				st.Gone = []string{record.DirShared}
			}
			return nil
		}
	}
	must(t, errOnly(s.Update("a", old(false))))
	must(t, errOnly(s.Update("b", old(true))))
	// alloc/tmp was removed through the mount before: it stays removed.
	must(t, errOnly(s.Update("a", func(st *record.State) error {
		delete(st.Volumes, "alloc/tmp")
		return nil
	})))
	must(t, s.Close())

	s, err = openStore(t, hclog.NewNullLogger(), dir, Options{})
	must(t, err)
	a, err := s.Get("a")
	must(t, err)
	for key, want := range map[string]struct {
		mode     os.FileMode
		uid, gid uint32
	}{record.RootVolume: {0o751, 12, 34}, record.SharedVolume: {0o707, 56, 78}} {
		v := a.Volumes[key]
		if v == nil {
			t.Fatalf("a has no volume %q after the upgrade", key)
		}
		fi, err := os.Lstat(s.LayerPath(v.Upper))
		must(t, err)
		sys := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != want.mode || !fi.ModTime().Equal(mtime) {
			t.Errorf("volume %q: mode %v, mtime %v; want %v, %v", key, fi.Mode().Perm(), fi.ModTime(), want.mode, mtime)
		}
		if os.Geteuid() == 0 && (sys.Uid != want.uid || sys.Gid != want.gid) {
			t.Errorf("volume %q: owner %d:%d, want %d:%d", key, sys.Uid, sys.Gid, want.uid, want.gid)
		}
	}
	if a.Dirs != nil {
		t.Errorf("a keeps Dirs %v after the upgrade", a.Dirs)
	}
	if a.Volumes["alloc/tmp"] != nil {
		t.Errorf("the upgrade made again alloc/tmp, which was removed")
	}
	// The kernel knows its directories' nodes with generation 0.
	if a.Gen != 0 {
		t.Errorf("a has generation %d after the upgrade, want the 0 its directories had", a.Gen)
	}
	b, err := s.Get("b")
	must(t, err)
	if b.Volumes[record.RootVolume] == nil || b.Volumes[record.SharedVolume] != nil || b.Gone != nil {
		t.Errorf("b: volumes %v, gone %v; want its own directory's volume, no alloc/ and nothing gone", b.VolumeKeys(), b.Gone)
	}
	must(t, s.Close())

	before := layerSet(t, dir)
	s, err = openStore(t, hclog.NewNullLogger(), dir, Options{})
	must(t, err)
	defer s.Close()
	if after := layerSet(t, dir); !reflect.DeepEqual(before, after) {
		t.Errorf("a second open changed the layers: %v, then %v", before, after)
	}
}

// TestRenameTaskRefusals: a rename of a task the allocation lacks, onto
// a name no task can have, or onto a task without replace changes
// nothing; a rename keeps the layers and survives a reopen.
func TestRenameTaskRefusals(t *testing.T) {
	s := openTestStore(t, filepath.Join(t.TempDir(), "data"))
	mustCreate(t, s, "a", "web", "db")
	records := func() string {
		b, err := json.Marshal(s.List())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	before := records()
	for _, c := range []struct {
		from, to string
		replace  bool
		want     error
	}{
		{"nope", "x", false, iofs.ErrNotExist},
		{"web", "db", false, ErrExists},
		{"web", "alloc", false, allocdir.ErrInvalidName},
		{"web", "a/b", false, allocdir.ErrInvalidName},
		{"web", "bad\nname", false, allocdir.ErrInvalidName},
	} {
		if err := s.RenameTask("a", c.from, c.to, c.replace); !errors.Is(err, c.want) {
			t.Errorf("RenameTask(%q, %q, %v): %v, want %v", c.from, c.to, c.replace, err, c.want)
		}
	}
	if after := records(); after != before {
		t.Errorf("refused renames changed the records:\n%s\nwant\n%s", after, before)
	}
	web := mustState(t, s, "a").Volumes["web/local"].Upper
	if err := s.RenameTask("a", "web", "front", false); err != nil {
		t.Fatal(err)
	}
	s = reopenStore(t, s)
	st := mustState(t, s, "a")
	if st.TaskIndex("web") >= 0 || st.TaskIndex("front") < 0 || st.Volumes["front/local"] == nil || st.Volumes["front/local"].Upper != web || st.Volumes["web/local"] != nil {
		t.Errorf("the record after the rename and a reopen: %+v", st)
	}
}
