package store

import (
	"bytes"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
)

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
	got, err := s.Update("x", func(st *record.State) error {
		st.Status = record.StatusTerminal
		st.Volumes["alloc/data"].Lowers = []string{lower}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got.Status != record.StatusTerminal || !reflect.DeepEqual(got.Volumes["alloc/data"].Lowers, []string{lower}) {
		t.Errorf("Update: got %+v, want terminal with lower %s", got, lower)
	}
	if orig.Status != record.StatusRunning {
		t.Errorf("Create's result changed by Update: got status %q, want %q", orig.Status, record.StatusRunning)
	}
	want := got
	reopened := restartView(t, s)
	if got, _ := reopened.Get("x"); !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen: got %+v, want %+v", got, want)
	}

	// Emptying the lowers is recorded as no lowers, in memory as on disk.
	emptied, err := s.Update("x", func(st *record.State) error {
		st.Volumes["alloc/data"].Lowers = []string{}
		return nil
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got, _ := restartView(t, s).Get("x"); !reflect.DeepEqual(got, emptied) {
		t.Errorf("after reopen: got %+v, want %+v", got, emptied)
	}
	// What the failures below must leave: its tags, where the layers are
	// subvolumes, are not the first Update's, since a tag is never given
	// twice.
	if want, err = s.Update("x", func(st *record.State) error {
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
		fn   func(*record.State) error
		want error // nil: any error
	}{
		{"fn fails", func(st *record.State) error {
			st.Status = record.StatusRunning
			st.Volumes["alloc/data"] = &record.Volume{Upper: lower}
			st.Tasks = nil
			return errFn
		}, errFn},
		{"missing layer", func(st *record.State) error {
			st.Volumes["alloc/data"].Lowers = []string{"00000000000000bb"}
			return nil
		}, iofs.ErrNotExist},
		{"id changed", func(st *record.State) error {
			st.ID = "y"
			return nil
		}, nil},
		{"bad task", func(st *record.State) error {
			st.Tasks = append(st.Tasks, allocdir.Task{Name: "alloc"})
			return nil
		}, allocdir.ErrInvalidName},
		{"bad layer ID", func(st *record.State) error {
			st.Volumes["alloc/data"].Upper = "../../etc"
			return nil
		}, allocdir.ErrInvalidName},
		{"bad status", func(st *record.State) error {
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
	_, err = s.Update("x", func(st *record.State) error {
		st.Status = record.StatusRunning
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

	if _, err := s.Update("nope", func(*record.State) error { return nil }); !errors.Is(err, allocdir.ErrUnknownAlloc) {
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
	s.List()[0].Status = record.StatusTerminal
	var kept *record.State
	if _, err := s.Update("x", func(st *record.State) error {
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
	if _, err := s.Update("b", func(st *record.State) error {
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
		"Update":  func() error { _, err := s.Update("a", func(*record.State) error { return nil }); return err },
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
	if _, err := s.Update("y", func(st *record.State) error {
		st.Volumes["alloc/data"].Lowers = []string{stuck}
		return nil
	}); err == nil {
		t.Errorf("Update onto the stuck layer: got nil error, want one")
	}
	if got, _ := s.Get("y"); !reflect.DeepEqual(got, other) {
		t.Errorf("y after refused Update: got %+v, want %+v", got, other)
	}
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
				if _, err := s.Create(id, tasks("web"), CreateOptions{}); err != nil {
					t.Error(err)
					return
				}
				if _, err := s.EnsureTask(id, allocdir.Task{Name: "db"}); err != nil {
					t.Error(err)
				}
				if _, err := s.Update(id, func(st *record.State) error { st.Status = record.StatusTerminal; return nil }); err != nil {
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
	if got, want := len(layerDirs(t, s)), 20*11; got != want {
		t.Errorf("layers: got %d, want %d", got, want)
	}
}
