package gc

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/allocfs/allocfs/allocdir/allocdirtest"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/storetest"
)

// trailDisk is the data dir's disk, recording each step it takes: its
// name and the paths it names, relative to the data dir, with layer IDs
// (random per data dir) written as L.
type trailDisk struct {
	disk.OS
	dir string

	mu    sync.Mutex
	steps []string
}

var layerID = regexp.MustCompile(`\b[0-9a-f]{16}\b`)

func (d *trailDisk) add(op string, paths ...string) {
	for i, p := range paths {
		if rel, err := filepath.Rel(d.dir, p); err == nil {
			p = rel
		}
		paths[i] = layerID.ReplaceAllString(p, "L")
	}
	d.mu.Lock()
	d.steps = append(d.steps, op+" "+strings.Join(paths, " "))
	d.mu.Unlock()
}

func (d *trailDisk) Mkdir(p string, mode uint32) error {
	d.add("mkdir", p)
	return d.OS.Mkdir(p, mode)
}

func (d *trailDisk) Lchown(p string, uid, gid int) error {
	d.add("lchown", p)
	return d.OS.Lchown(p, uid, gid)
}

func (d *trailDisk) Chmod(p string, mode uint32) error {
	d.add("chmod", p)
	return d.OS.Chmod(p, mode)
}

func (d *trailDisk) WriteFile(p string, data []byte, mode uint32) error {
	d.add("write", p)
	return d.OS.WriteFile(p, data, mode)
}

func (d *trailDisk) AppendFile(p string, data []byte) error {
	d.add("append", p)
	return d.OS.AppendFile(p, data)
}

func (d *trailDisk) Truncate(p string, size int64) error {
	d.add("truncate", p)
	return d.OS.Truncate(p, size)
}

func (d *trailDisk) Fsync(p string) error {
	d.add("fsync", p)
	return d.OS.Fsync(p)
}

func (d *trailDisk) Syncfs(p string) error {
	d.add("syncfs", p)
	return d.OS.Syncfs(p)
}

func (d *trailDisk) Rename(oldpath, newpath string, flags uint) error {
	d.add("rename", oldpath, newpath)
	return d.OS.Rename(oldpath, newpath, flags)
}

func (d *trailDisk) MkdirAt(l layer.Loc, mode uint32) error {
	d.add("mkdirat", l.Name)
	return d.OS.MkdirAt(l, mode)
}

func (d *trailDisk) LinkAt(from, to layer.Loc) error {
	d.add("linkat", from.Name, to.Name)
	return d.OS.LinkAt(from, to)
}

func (d *trailDisk) Remove(p string) error {
	d.add("remove", p)
	return d.OS.Remove(p)
}

func (d *trailDisk) RemoveAll(p string) error {
	d.add("removeall", p)
	return d.OS.RemoveAll(p)
}

// TestCollectorPassSteps ties the store's crash test of a collection
// (fs/store, case "gc"), which cannot import this package, to what a pass
// of the collector asks of the store: on the same setup, a terminal
// allocation with data beside a running one, CollectAll takes exactly the
// steps on disk that the crash test's sequence takes (Destroy, Sweep,
// Flatten, Resettle), so that a crash at each of those is a crash at each
// step of a real pass.
func TestCollectorPassSteps(t *testing.T) {
	trail := func(pass func(s *store.Store) error) []string {
		dir := filepath.Join(t.TempDir(), "data")
		d := &trailDisk{dir: dir}
		s := storetest.Value[*store.Store](t)(store.OpenWith(allocdirtest.Logger(t), dir, store.Options{Disk: d}))
		defer func() { storetest.Must(t, s.Close()) }()
		for _, id := range []string{"a", "c"} {
			storetest.Must(t, storetest.ErrOnly(s.Create(id, storetest.Tasks("web"))))
		}
		upper := s.LayerPath(mustVolume(t, s, "a", "alloc/data"))
		storetest.MustWrite(t, filepath.Join(upper, "data.txt"), "precious", 0o644)
		storetest.Must(t, storetest.ErrOnly(s.Stop("a")))
		d.mu.Lock()
		d.steps = nil
		d.mu.Unlock()
		if err := pass(s); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get("a"); err == nil {
			t.Fatal("a outlived the pass")
		}
		if _, err := os.Stat(upper); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a's layer outlived the pass: %v", err)
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.steps
	}
	collector := trail(func(s *store.Store) error {
		_, err := NewCollector(allocdirtest.Logger(t), s, DefaultConfig()).CollectAll("test")
		return err
	})
	direct := trail(func(s *store.Store) error {
		err := s.Destroy("a")
		_, serr := s.Sweep()
		_, ferr := s.Flatten()
		return errors.Join(err, serr, ferr, s.Resettle())
	})
	if len(collector) == 0 {
		t.Fatal("a collection took no step on disk: the trail records nothing")
	}
	if !reflect.DeepEqual(collector, direct) {
		t.Errorf("a pass of the collector takes other steps than the crash test's sequence:\ncollector: %q\nsequence:  %q", collector, direct)
	}
}

// mustVolume returns the upper layer of volume key of allocation id.
func mustVolume(t *testing.T, s *store.Store, id, key string) string {
	t.Helper()
	st, err := s.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return st.Volumes[key].Upper
}
