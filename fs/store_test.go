package fs

import (
	"bytes"
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
	"github.com/hashicorp/go-hclog"
)

// testWriter sends log lines to the test's log, so they show with -v or
// when the test fails.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Output: testWriter{t}, Level: hclog.Debug})
}

// openTestStore opens a store in dir, failing the test on error, and
// closes it when the test ends.
func openTestStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := OpenStore(testLogger(t), dir)
	if err != nil {
		t.Fatalf("OpenStore(%q): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
	})
	return s
}

// restartView opens a copy of s's data dir as it is now: what a daemon
// killed at this instant (kill -9: the page cache survives) would find on
// its next start. s goes on untouched.
func restartView(t *testing.T, s *Store) *Store {
	t.Helper()
	cp := filepath.Join(t.TempDir(), "data")
	if out, err := exec.Command("cp", "-a", s.DataDir(), cp).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s: %v: %s", s.DataDir(), err, out)
	}
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

func tasks(names ...string) []allocdir.Task {
	out := make([]allocdir.Task, len(names))
	for i, n := range names {
		out[i] = allocdir.Task{Name: n}
	}
	return out
}

// dirNames lists the names in dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("ReadDir(%q): %v", dir, err)
	}
	out := []string{}
	for _, e := range entries {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out
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

func mustCreate(t *testing.T, s *Store, id string, names ...string) *State {
	t.Helper()
	st, err := s.Create(id, tasks(names...))
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
	if st.ID != "a1" || st.Status != StatusRunning {
		t.Errorf("got ID %q status %q, want %q %q", st.ID, st.Status, "a1", StatusRunning)
	}
	if st.Created.Before(before.Add(-time.Second)) || st.Created.After(time.Now().Add(time.Second)) {
		t.Errorf("created: got %v, want about %v", st.Created, before)
	}
	if got, want := st.Tasks, tasks("web", "sidecar"); !reflect.DeepEqual(got, want) {
		t.Errorf("tasks: got %v, want %v", got, want)
	}

	wantModes := map[string]os.FileMode{
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
		if nobodyUID >= 0 {
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
	onDisk, err := readState(filepath.Join(dir, "state", "a1.json"))
	if err != nil {
		t.Fatalf("readState: %v", err)
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
	if _, err := s.Update("b", func(st *State) error {
		st.Status = StatusTerminal
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
			st, err := s.Create(c.id, c.tasks)
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

	_, err = s.Create("x", tasks("other"))
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

// TestStoreCreateFailureLeavesNothing checks that a full disk at any step
// of Create leaves no layer, no state file and no record.
func TestStoreCreateFailureLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, step := range []struct {
		op string
		n  int // fail the n-th call of op
	}{{"mkdir", 1}, {"mkdir", 4}, {"mkdir", 7}, {"append", 1}} {
		t.Run(fmt.Sprintf("%s#%d", step.op, step.n), func(t *testing.T) {
			s := openTestStore(t, t.TempDir())
			calls := 0
			setFault(s, func(op, _ string) error {
				if op != step.op {
					return nil
				}
				calls++
				if calls == step.n {
					return syscall.ENOSPC
				}
				return nil
			})
			_, err := s.Create("x", tasks("web", "db"))
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

// TestStoreOpenBadState checks that OpenStore refuses a state file it
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
			s, err := OpenStore(testLogger(t), dir)
			if err == nil {
				t.Fatalf("OpenStore: got a store, want an error naming %q", bad)
			}
			if s != nil {
				t.Errorf("OpenStore: got a store with the error, want nil")
			}
			// The operator must be told which file to move away.
			if !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "move") {
				t.Errorf("OpenStore: got %q, want it to name %q and say to move it", err, bad)
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

// TestStoreOpenMissingLayer checks that OpenStore refuses a state whose
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
	_, err := OpenStore(testLogger(t), dir)
	if !errors.Is(err, iofs.ErrNotExist) {
		t.Fatalf("OpenStore: got %v, want %v", err, iofs.ErrNotExist)
	}
	if !strings.Contains(err.Error(), "allocation x ") || !strings.Contains(err.Error(), layer) {
		t.Errorf("OpenStore: got %q, want it to name allocation x and layer %s", err, layer)
	}
}

// TestStoreUpdate checks that an update is persisted, and that a failing
// fn, an invalid result or a full disk change nothing.
func TestStoreUpdate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	orig := mustCreate(t, s, "x", "web")
	file := filepath.Join(dir, "state", "x.json")

	// A lower layer made by hand, as a migration would.
	lower := "00000000000000aa"
	if err := os.Mkdir(s.LayerPath(lower), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := s.Update("x", func(st *State) error {
		st.Status = StatusTerminal
		st.Volumes["alloc/data"].Lowers = []string{lower}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got.Status != StatusTerminal || !reflect.DeepEqual(got.Volumes["alloc/data"].Lowers, []string{lower}) {
		t.Errorf("Update: got %+v, want terminal with lower %s", got, lower)
	}
	if orig.Status != StatusRunning {
		t.Errorf("Create's result changed by Update: got status %q, want %q", orig.Status, StatusRunning)
	}
	want := got
	reopened := restartView(t, s)
	if got, _ := reopened.Get("x"); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: got %+v, want %+v", got, want)
	}

	// Emptying the lowers is recorded as no lowers, in memory as on disk.
	emptied, err := s.Update("x", func(st *State) error {
		st.Volumes["alloc/data"].Lowers = []string{}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got, _ := restartView(t, s).Get("x"); !reflect.DeepEqual(got, emptied) {
		t.Errorf("after reopen: got %+v, want %+v", got, emptied)
	}
	if _, err := s.Update("x", func(st *State) error {
		st.Volumes["alloc/data"].Lowers = []string{lower}
		return nil
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}

	before, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	errFn := errors.New("fn refused")
	failures := []struct {
		name string
		fn   func(*State) error
		want error // nil: any error
	}{
		{"fn fails", func(st *State) error {
			st.Status = StatusRunning
			st.Volumes["alloc/data"] = &Volume{Upper: lower}
			st.Tasks = nil
			return errFn
		}, errFn},
		{"missing layer", func(st *State) error {
			st.Volumes["alloc/data"].Lowers = []string{"00000000000000bb"}
			return nil
		}, iofs.ErrNotExist},
		{"id changed", func(st *State) error {
			st.ID = "y"
			return nil
		}, nil},
		{"bad task", func(st *State) error {
			st.Tasks = append(st.Tasks, allocdir.Task{Name: "alloc"})
			return nil
		}, allocdir.ErrInvalidName},
		{"bad layer ID", func(st *State) error {
			st.Volumes["alloc/data"].Upper = "../../etc"
			return nil
		}, allocdir.ErrInvalidName},
		{"bad status", func(st *State) error {
			st.Status = "paused"
			return nil
		}, nil},
	}
	for _, f := range failures {
		_, err := s.Update("x", f.fn)
		if err == nil || (f.want != nil && !errors.Is(err, f.want)) {
			t.Errorf("%s: got %v, want %v", f.name, err, f.want)
		}
	}

	// A full disk while writing.
	setFault(s, func(op, _ string) error {
		if op == "append" {
			return syscall.ENOSPC
		}
		return nil
	})
	_, err = s.Update("x", func(st *State) error {
		st.Status = StatusRunning
		return nil
	})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("full disk: got %v, want %v", err, syscall.ENOSPC)
	}
	setFault(s, nil)

	if got, _ := s.Get("x"); !reflect.DeepEqual(got, want) {
		t.Errorf("after failed updates: got %+v, want %+v", got, want)
	}
	after, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(after, before) {
		t.Errorf("state file after failed updates: got %s, want %s", after, before)
	}
	if got, want := stateFiles(t, s), []string{"x.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("state dir: got %v, want %v", got, want)
	}

	if _, err := s.Update("nope", func(*State) error { return nil }); !errors.Is(err, allocdir.ErrUnknownAlloc) {
		t.Errorf("unknown: got %v, want %v", err, allocdir.ErrUnknownAlloc)
	}
}

// TestStoreClones checks that callers cannot change the store's records
// through what it returns or what fn keeps.
func TestStoreClones(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	st := mustCreate(t, s, "x", "web")
	want, _ := s.Get("x")

	st.Tasks[0].Name = "changed"
	st.Volumes["alloc/data"].Upper = "changed"
	got, _ := s.Get("x")
	got.Volumes["alloc/logs"].Lowers = append(got.Volumes["alloc/logs"].Lowers, "changed")
	s.List()[0].Status = StatusTerminal
	var kept *State
	if _, err := s.Update("x", func(st *State) error {
		kept = st
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	kept.Tasks[0].User = "changed"

	if got, _ := s.Get("x"); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

// TestStoreDestroy checks that Destroy removes the state file and the
// layers only this allocation uses, and that a destroyed allocation is
// reported gone.
func TestStoreDestroy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	a := mustCreate(t, s, "a", "web")
	b := mustCreate(t, s, "b", "web")
	shared := a.Volumes["alloc/data"].Upper
	if _, err := s.Update("b", func(st *State) error {
		st.Volumes["alloc/data"].Lowers = []string{shared}
		return nil
	}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	// A file in a layer: Destroy removes whole trees.
	if err := os.MkdirAll(filepath.Join(s.LayerPath(a.Volumes["web/local"].Upper), "d", "e"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(s.LayerPath(a.Volumes["web/local"].Upper), "d", "e", "f"), "data")

	if err := s.Destroy("a"); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if got, want := stateFiles(t, s), []string{"b.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("state dir: got %v, want %v", got, want)
	}
	for key, v := range a.Volumes {
		_, err := os.Lstat(s.LayerPath(v.Upper))
		if v.Upper == shared {
			if err != nil {
				t.Errorf("layer %s of %s, shared with b: got %v, want it kept", v.Upper, key, err)
			}
			continue
		}
		if !errors.Is(err, iofs.ErrNotExist) {
			t.Errorf("layer %s of %s: got %v, want %v", v.Upper, key, err, iofs.ErrNotExist)
		}
	}
	for key, v := range b.Volumes {
		if _, err := os.Lstat(s.LayerPath(v.Upper)); err != nil {
			t.Errorf("layer %s of b's %s: got %v, want it kept", v.Upper, key, err)
		}
	}

	for name, call := range map[string]func() error{
		"Destroy": func() error { return s.Destroy("a") },
		"Get":     func() error { _, err := s.Get("a"); return err },
		"Update":  func() error { _, err := s.Update("a", func(*State) error { return nil }); return err },
		"EnsureTask": func() error {
			_, err := s.EnsureTask("a", allocdir.Task{Name: "web"})
			return err
		},
	} {
		err := call()
		if !errors.Is(err, allocdir.ErrGone) || !errors.Is(err, allocdir.ErrUnknownAlloc) {
			t.Errorf("%s after Destroy: got %v, want %v and %v", name, err, allocdir.ErrGone, allocdir.ErrUnknownAlloc)
		}
	}
	err := s.Destroy("never")
	if !errors.Is(err, allocdir.ErrUnknownAlloc) || errors.Is(err, allocdir.ErrGone) {
		t.Errorf("Destroy of an unknown ID: got %v, want %v only", err, allocdir.ErrUnknownAlloc)
	}

	// The shared layer is b's now; destroying b removes it.
	if err := s.Destroy("b"); err != nil {
		t.Fatalf("Destroy b: %v", err)
	}
	if got := layerDirs(t, s); len(got) != 0 {
		t.Errorf("layers after destroying both: got %v, want none", got)
	}
	s2 := reopenStore(t, s)
	if got := s2.List(); len(got) != 0 {
		t.Errorf("after reopen: got %d allocations, want 0", len(got))
	}
	// After a restart the store no longer knows the ID was destroyed.
	if _, err := s2.Get("a"); !errors.Is(err, allocdir.ErrUnknownAlloc) {
		t.Errorf("Get after reopen: got %v, want %v", err, allocdir.ErrUnknownAlloc)
	}
}

// TestStoreDestroyKeepsGoing checks that Destroy removes every layer it
// can when one removal fails, returns that failure, and keeps the failed
// layer out of reach.
func TestStoreDestroyKeepsGoing(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	st := mustCreate(t, s, "x", "web")
	other := mustCreate(t, s, "y", "web")
	stuck := st.Volumes["web/local"].Upper
	setFault(s, func(op, p string) error {
		if op == "removeAll" && p == s.LayerPath(stuck) {
			return syscall.EBUSY
		}
		return nil
	})
	err := s.Destroy("x")
	if !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("Destroy: got %v, want %v", err, syscall.EBUSY)
	}
	setFault(s, nil)
	for key, v := range st.Volumes {
		_, err := os.Lstat(s.LayerPath(v.Upper))
		if v.Upper == stuck {
			if err != nil {
				t.Errorf("layer of %s that failed to go: got %v, want it left for GC", key, err)
			}
			continue
		}
		if !errors.Is(err, iofs.ErrNotExist) {
			t.Errorf("layer of %s: got %v, want %v", key, err, iofs.ErrNotExist)
		}
	}
	if got, want := stateFiles(t, s), []string{"y.json"}; !reflect.DeepEqual(got, want) {
		t.Errorf("state dir: got %v, want %v", got, want)
	}
	if _, err := s.Get("x"); !errors.Is(err, allocdir.ErrGone) {
		t.Errorf("Get: got %v, want %v", err, allocdir.ErrGone)
	}
	// Nobody may stack on a layer that is half deleted.
	if _, err := s.Update("y", func(st *State) error {
		st.Volumes["alloc/data"].Lowers = []string{stuck}
		return nil
	}); err == nil {
		t.Errorf("Update onto the stuck layer: got nil error, want one")
	}
	if got, _ := s.Get("y"); !reflect.DeepEqual(got, other) {
		t.Errorf("y after refused Update: got %+v, want %+v", got, other)
	}
}

// TestStoreOpenCleansUp checks that OpenStore empties staging/ and removes
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
	s2, err := OpenStore(logger, dir)
	if err != nil {
		t.Fatalf("OpenStore: %v", err)
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
	if _, err := s.Update("a", func(st *State) error { st.Status = StatusTerminal; return nil }); err != nil {
		t.Fatal(err)
	}
	heard("a")
	if _, err := s.EnsureTask("a", allocdir.Task{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	heard("a")
	mustCreate(t, s, "b", "web")
	heard("b")
	if _, err := s.Remap("a", "b", []string{"alloc/data"}); err != nil {
		t.Fatal(err)
	}
	heard("a", "b") // one change of both records
	if err := s.Destroy("a"); err != nil {
		t.Fatal(err)
	}
	heard("a")
	if _, err := s.Create("a", nil); err == nil {
		t.Fatal("Create without tasks succeeded")
	}
	heard() // a refused change is not a change

	stop()
	stop() // twice is fine
	mustCreate(t, s, "after", "web")
	heard()
}

// TestStoreEnsureTask checks that EnsureTask adds a task with its layers,
// updates an existing one in place, and refuses bad input.
func TestStoreEnsureTask(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := openTestStore(t, dir)
	orig := mustCreate(t, s, "x", "web")

	st, err := s.EnsureTask("x", allocdir.Task{Name: "db", SecretsMB: 4, User: "postgres"})
	if err != nil {
		t.Fatalf("EnsureTask new: %v", err)
	}
	if got, want := st.Tasks, []allocdir.Task{{Name: "web"}, {Name: "db", SecretsMB: 4, User: "postgres"}}; !reflect.DeepEqual(got, want) {
		t.Errorf("tasks: got %v, want %v", got, want)
	}
	for key, mode := range map[string]os.FileMode{"db/local": 0o777, "db/tmp": 0o777 | os.ModeSticky} {
		v := st.Volumes[key]
		if v == nil {
			t.Errorf("volume %s: missing", key)
			continue
		}
		fi, err := os.Lstat(s.LayerPath(v.Upper))
		if err != nil {
			t.Errorf("volume %s: %v", key, err)
			continue
		}
		if got, want := fi.Mode(), os.ModeDir|mode; got != want {
			t.Errorf("volume %s: got mode %v, want %v", key, got, want)
		}
	}
	for key, v := range orig.Volumes {
		if got := st.Volumes[key]; !reflect.DeepEqual(got, v) {
			t.Errorf("volume %s: got %+v, want unchanged %+v", key, got, v)
		}
	}
	layers := layerDirs(t, s)

	st, err = s.EnsureTask("x", allocdir.Task{Name: "web", SecretsMB: 8, User: "www"})
	if err != nil {
		t.Fatalf("EnsureTask existing: %v", err)
	}
	if got, want := st.Tasks[0], (allocdir.Task{Name: "web", SecretsMB: 8, User: "www"}); got != want {
		t.Errorf("existing task: got %+v, want %+v", got, want)
	}
	if got := layerDirs(t, s); !reflect.DeepEqual(got, layers) {
		t.Errorf("layers after updating a task: got %v, want %v", got, layers)
	}
	want := st

	for _, c := range []struct {
		id   string
		task string
		err  error
	}{
		{"nope", "web", allocdir.ErrUnknownAlloc},
		{"x", "alloc", allocdir.ErrInvalidName},
		{"x", "a/b", allocdir.ErrInvalidName},
		{"x", "", allocdir.ErrInvalidName},
	} {
		if _, err := s.EnsureTask(c.id, allocdir.Task{Name: c.task}); !errors.Is(err, c.err) {
			t.Errorf("EnsureTask(%q, %q): got %v, want %v", c.id, c.task, err, c.err)
		}
	}
	setFault(s, func(op, _ string) error {
		if op == "append" {
			return syscall.ENOSPC
		}
		return nil
	})
	if _, err := s.EnsureTask("x", allocdir.Task{Name: "cache"}); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("EnsureTask on a full disk: got %v, want %v", err, syscall.ENOSPC)
	}
	setFault(s, nil)
	if got := layerDirs(t, s); !reflect.DeepEqual(got, layers) {
		t.Errorf("layers after failures: got %v, want %v", got, layers)
	}

	s2 := restartView(t, s)
	if got, _ := s2.Get("x"); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: got %+v, want %+v", got, want)
	}
}

// TestStoreConcurrent runs changes and reads at once; run it with -race.
func TestStoreConcurrent(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, t.TempDir())
	// A hook that reads the store, as the mount's does, runs under every
	// change.
	defer s.OnChange(func(id string) { s.Get(id) })()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := s.Create(id, tasks("web")); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.EnsureTask(id, allocdir.Task{Name: "db"}); err != nil {
					t.Error(err)
				}
				if _, err := s.Update(id, func(st *State) error { st.Status = StatusTerminal; return nil }); err != nil {
					t.Error(err)
				}
				s.List()
				if i%2 == 0 {
					if err := s.Destroy(id); err != nil {
						t.Error(err)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 200 {
			for _, st := range s.List() {
				s.Get(st.ID)
			}
		}
	}()
	wg.Wait()
	if got, want := len(s.List()), 20; got != want {
		t.Errorf("allocations: got %d, want %d", got, want)
	}
	if got, want := len(layerDirs(t, s)), 20*9; got != want {
		t.Errorf("layers: got %d, want %d", got, want)
	}
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
	if _, err := OpenStore(testLogger(t), dir); err == nil {
		t.Fatal("OpenStore with state/ a symlink: got nil error, want one")
	}
}
