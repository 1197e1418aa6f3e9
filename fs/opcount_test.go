package fs

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
)

// TestRequestCounts checks that the mount counts the requests the kernel
// sends, by opcode: a mkdir, a create with a write and a close, a listing
// and a stat each show up under their own name, and a closed passthrough
// file costs no FLUSH.
func TestRequestCounts(t *testing.T) {
	tm := newTestMount(t)
	if _, err := tm.store.Create("a", []allocdir.Task{{Name: "web"}}, store.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := filepath.Join(tm.dir, "a", "alloc", "data", "d")
	before := tm.mount.RequestCounts()
	must(t, os.Mkdir(d, 0o755))
	must(t, os.WriteFile(filepath.Join(d, "f"), []byte("x"), 0o644))
	if _, err := os.ReadDir(d); err != nil {
		t.Fatal(err)
	}
	after := tm.mount.RequestCounts()
	for _, op := range []string{"MKDIR", "CREATE", "LOOKUP", "OPENDIR", "READDIRPLUS"} {
		if after[op] <= before[op] {
			t.Errorf("%s: %d requests before, %d after, want more", op, before[op], after[op])
		}
	}
	if tm.mount.Passthrough() && after["FLUSH"] != before["FLUSH"] {
		t.Errorf("closing a passthrough file sent %d FLUSH requests, want none", after["FLUSH"]-before["FLUSH"])
	}
	for op := range after {
		if op == "" {
			t.Error("a request was counted without a name")
		}
	}
}

// kernelBookkeeping are the requests the kernel sends on its own schedule,
// not as the cost of an operation: the FORGETs of nodes it dropped from
// its caches, and the INTERRUPT it sends when a signal reaches a caller
// that waits on the mount (Go's runtime preempts threads with SIGURG).
var kernelBookkeeping = map[string]bool{"FORGET": true, "BATCH_FORGET": true, "INTERRUPT": true}

// TestRequestsPerOperation counts the FUSE requests each common
// operation costs on this kernel, on a plain volume and on a snapshot
// (one lower layer), and fails when one costs more than it does today:
// a change that adds a round trip to a create, a stat or a listing must
// say so here. The counts are per operation, over n of them,
// once the kernel has sent what it sends late (RELEASE is asynchronous).
func TestRequestsPerOperation(t *testing.T) {
	const n = 40
	tm := newTestMount(t)
	names := func(prefix string) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("%s%02d", prefix, i))
		}
		return out
	}
	data := snapshotVolume(t, tm, func(d string) {
		must(t, os.Mkdir(filepath.Join(d, "lower"), 0o755))
		for _, name := range names("l") {
			must(t, os.WriteFile(filepath.Join(d, "lower", name), []byte("lower"), 0o644))
		}
	})
	plain := filepath.Join(tm.dir, "new", "alloc", "logs")
	st := mustState(t, tm.store, "new")
	plainLayer := tm.store.LayerPath(st.Volumes["alloc/logs"].Upper)
	must(t, os.Mkdir(filepath.Join(plainLayer, "lower"), 0o755))
	for _, name := range names("l") {
		must(t, os.WriteFile(filepath.Join(plainLayer, "lower", name), []byte("lower"), 0o644))
	}
	block := make([]byte, 4096)

	// settled returns the request counts once they stop changing.
	settled := func() map[string]uint64 {
		prev := tm.mount.RequestCounts()
		for range 100 {
			time.Sleep(20 * time.Millisecond)
			cur := tm.mount.RequestCounts()
			if maps.Equal(prev, cur) {
				return cur
			}
			prev = cur
		}
		return prev
	}
	type op struct {
		name string
		// max is the most requests of each opcode one operation may
		// cost; an opcode not named may not be sent at all.
		max map[string]float64
		do  func(dir, name string) error
		// kind of names: "new" names not yet made, "lower" entries the
		// kernel has not looked up, "made" the ones "create" made.
		names string
	}
	ops := []op{
		{"create+write+close", map[string]float64{"LOOKUP": 1, "CREATE": 1, "GETXATTR": 1, "GETATTR": 1, "RELEASE": 1},
			func(dir, name string) error { return os.WriteFile(filepath.Join(dir, "new", name), block, 0o644) }, "new"},
		{"stat, cold", map[string]float64{"LOOKUP": 1},
			func(dir, name string) error { _, err := os.Lstat(filepath.Join(dir, "lower", name)); return err }, "lower"},
		{"stat, warm", map[string]float64{},
			func(dir, name string) error { _, err := os.Lstat(filepath.Join(dir, "lower", name)); return err }, "lower"},
		{"append+close", map[string]float64{"OPEN": 1, "RELEASE": 1},
			func(dir, name string) error {
				f, err := os.OpenFile(filepath.Join(dir, "new", name), os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					return err
				}
				_, err = f.Write(block[:100])
				return errors.Join(err, f.Close())
			}, "made"},
		// The kernel looks the new name up, and the old one again.
		{"rename", map[string]float64{"LOOKUP": 2, "RENAME": 1, "GETATTR": 1},
			func(dir, name string) error {
				return os.Rename(filepath.Join(dir, "new", name), filepath.Join(dir, "new", "r"+name))
			}, "made"},
		{"unlink", map[string]float64{"UNLINK": 1, "GETATTR": 1},
			func(dir, name string) error { return os.Remove(filepath.Join(dir, "new", "r"+name)) }, "made"},
	}
	for kind, dir := range map[string]string{"plain": plain, "snapshot": data} {
		t.Run(kind, func(t *testing.T) {
			must(t, os.Mkdir(filepath.Join(dir, "new"), 0o755))
			// The directory's first entry copies it up on a snapshot:
			// not what is counted.
			must(t, os.WriteFile(filepath.Join(dir, "new", "first"), nil, 0o644))
			for _, o := range ops {
				list := names("f")
				if o.names == "lower" {
					list = names("l")
				}
				before := settled()
				for _, name := range list {
					if err := o.do(dir, name); err != nil {
						t.Fatalf("%s: %v", o.name, err)
					}
				}
				after := settled()
				var got []string
				for opcode, count := range after {
					sent := count - before[opcode]
					if sent == 0 || kernelBookkeeping[opcode] {
						continue
					}
					per := float64(sent) / n
					got = append(got, fmt.Sprintf("%s %.2f", opcode, per))
					// One request more over the whole run is the
					// kernel learning the directory once.
					if float64(sent) > o.max[opcode]*n+1 {
						t.Errorf("%s costs %.2f %s requests, want at most %.0f", o.name, per, opcode, o.max[opcode])
					}
				}
				sort.Strings(got)
				t.Logf("%s: %s", o.name, strings.Join(got, ", "))
			}
			// A listing with lstat of every entry (ls -l without its
			// xattr reads): the first batch comes with attributes.
			before := settled()
			if err := listEntries(filepath.Join(dir, "lower"), true, n); err != nil {
				t.Fatal(err)
			}
			after := settled()
			total := uint64(0)
			var got []string
			for opcode, count := range after {
				if sent := count - before[opcode]; sent > 0 && !kernelBookkeeping[opcode] {
					total += sent
					got = append(got, fmt.Sprintf("%s %d", opcode, sent))
				}
			}
			sort.Strings(got)
			t.Logf("readdir+lstat of %d entries: %s", n, strings.Join(got, ", "))
			if total > 5 {
				t.Errorf("a listing with lstat of %d entries cost %d requests, want at most 5 (%s)", n, total, strings.Join(got, ", "))
			}
		})
	}
}
