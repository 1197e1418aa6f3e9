package fs

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"sort"
	"sync"
	"syscall"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/internal/tmpfs"
	"github.com/allocfs/allocfs/restart"
	"golang.org/x/sys/unix"
)

// A memory volume and the mount's table of them; what the mount does with
// them (make, keep, serve, drop) is memvol.go.

// memoryView is the first view of the memory volumes: memoryView+2i is
// the i-th task's secrets/, memoryView+2i+1 its private/.
const memoryView = 2 << 20

func memoryViewOf(task int, name string) uint64 {
	v := uint64(memoryView + 2*task)
	if name == allocdir.TaskPrivate {
		v++
	}
	return v
}

// memoryPlace is the task index and name of memory view view.
func memoryPlace(view uint64) (int, string, bool) {
	if view < memoryView {
		return 0, "", false
	}
	i := int(view-memoryView) / 2
	if (view-memoryView)%2 == 1 {
		return i, allocdir.TaskPrivate, true
	}
	return i, allocdir.TaskSecrets, true
}

// MemoryKeeper keeps the memory volumes' descriptors while no daemon
// runs (package restart's holder or systemd's descriptor store).
type MemoryKeeper = restart.MemoryKeeper

// memMinInodes is the smallest entry cap a memory volume gets.
const memMinInodes = 1024

// defaultMemInodes is the entry cap (nr_inodes) of a memory volume of size
// bytes: one entry per KiB of the byte cap, and never fewer than
// memMinInodes (what the default 1 MiB volume gets). An entry costs the
// kernel about a KiB of slab that size= does not count, so the cap keeps
// what a task can make the kernel hold within about twice its byte cap;
// tmpfs's own default, half the machine's pages, would not.
func defaultMemInodes(size int64) int64 {
	return max(size/1024, memMinInodes)
}

// memVolume is one memory volume's instance.
type memVolume struct {
	key string
	mu  sync.Mutex
	fs  *tmpfs.FS
	// pins counts the callers using fs's descriptor; once dropped, the
	// last one closes it.
	pins    int
	dropped bool
}

// Root implements layer.HeldRoot.
func (v *memVolume) Root() (int, func(), error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dropped {
		return -1, nil, &os.PathError{Op: "open memory volume", Path: v.key, Err: syscall.ENOENT}
	}
	v.pins++
	return v.fs.Fd(), v.unpin, nil
}

func (v *memVolume) unpin() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pins--
	if v.pins == 0 && v.dropped {
		v.fs.Close()
	}
}

// drop ends this process's hold on the instance.
func (v *memVolume) drop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.dropped {
		return
	}
	v.dropped = true
	if v.pins == 0 {
		v.fs.Close()
	}
}

// used reports whether the instance holds anything beyond its root.
func (v *memVolume) used() bool {
	fd, release, err := v.Root()
	if err != nil {
		return false
	}
	defer release()
	var st unix.Statfs_t
	if unix.Fstatfs(fd, &st) != nil {
		return false
	}
	return st.Bfree < st.Blocks || st.Files-st.Ffree > 1
}

// empty reports whether the instance's root lists no entry.
func (v *memVolume) empty() (bool, error) {
	fd, release, err := v.Root()
	if err != nil {
		return false, err
	}
	defer release()
	dup, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	d := os.NewFile(uintptr(dup), v.key)
	defer d.Close()
	names, err := d.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0, err
}

// memVolumes are a mount's memory volumes.
type memVolumes struct {
	mu   sync.Mutex
	vols map[string]*memVolume
	// keeper keeps the descriptors beyond this process; nil for none.
	keeper MemoryKeeper
	// kept are the keys whose descriptor the keeper has: only those
	// survive this daemon.
	kept map[string]bool
	// lost names the volumes the previous daemon recorded whose
	// instances are gone (their keeper died), found at the start.
	lost []string
	// file records the keys made, for the next daemon to tell what it
	// lost: <data-dir>/fuse/memory.json.
	file string
}

// memoryFile is <data-dir>/fuse/memory.json, the memory volumes a daemon
// of the connection made and its keeper holds:
//
//	{"volumes": ["<alloc>/<task>/secrets", ...]}
type memoryFile struct {
	Volumes []string `json:"volumes"`
}

func memoryPath(dataDir string) string { return restart.StateFile(dataDir, "memory.json") }

// saveLocked records the keys of the live volumes; mv.mu is held. Like
// the slot table it matters on this boot only.
func (mv *memVolumes) saveLocked() error {
	f := memoryFile{Volumes: make([]string, 0, len(mv.vols))}
	for k := range mv.vols {
		f.Volumes = append(f.Volumes, k)
	}
	sort.Strings(f.Volumes)
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return restart.WriteReplace(mv.file, b)
}
