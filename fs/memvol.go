package fs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/volume"
	"github.com/allocfs/allocfs/internal/tmpfs"
	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A memory volume (a task's secrets/ or private/) is a kernel tmpfs of
// its own, made detached (internal/tmpfs): no mount table shows it, and
// only descriptors reach it. The mount serves it as it serves a disk
// volume, a volume.Node over a one-layer stack whose root is the instance's
// descriptor (layer.Stack.Held), file data by passthrough; the kernel
// does the accounting (size=, nr_inodes=), and df shows the caps.
//
// The instance lives while a descriptor of it is open. The mount keeps
// one, and hands a copy to its MemoryKeeper (the holder, or systemd's
// descriptor store) as it makes the instance: a daemon killed, stopped
// with the mount left, or upgraded leaves the instance to the keeper, and
// the next daemon adopts it by name (MountOptions.HeldMemory). Only the
// allocation's destroy, an rmdir of the directory, or a full stop ends
// it (the memory goes with the last descriptor: files a task still holds
// open keep theirs).
//
// Each volume is shown in a view slot of its own (memoryView): tmpfs
// inode numbers are unique within an instance only, and a node of one
// allocation's secrets must never be taken for another's.

// startMemory takes over the memory volumes a previous daemon left: held
// are the descriptors its keeper handed over, by key. A recorded volume
// without one is lost, and said so; a descriptor of no recorded volume,
// of an allocation or task that is gone, or of something not a tmpfs
// root is closed and dropped from the keeper.
func (m *Mount) startMemory(held map[string]int) {
	mv := &m.mem
	mv.vols = make(map[string]*memVolume)
	mv.kept = make(map[string]bool)
	mv.keeper = m.opts.Memory
	mv.file = memoryPath(m.store.DataDir())
	var rec memoryFile
	if b, err := os.ReadFile(mv.file); err == nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			m.logger.Warn("the record of the memory volumes is unreadable", "file", mv.file, "error", err)
		}
	}
	for _, key := range rec.Volumes {
		fd, ok := held[key]
		if !ok {
			mv.lost = append(mv.lost, key)
			continue
		}
		delete(held, key)
		if !m.memoryKeyLive(key) {
			unix.Close(fd)
			m.dropKept(key)
			continue
		}
		f, err := tmpfs.Adopt(fd, true)
		if err != nil {
			m.logger.Error("a kept memory volume is not a tmpfs root; dropped", "volume", key, "error", err)
			unix.Close(fd)
			m.dropKept(key)
			continue
		}
		mv.vols[key] = &memVolume{key: key, fs: f}
		mv.kept[key] = true
	}
	for key, fd := range held {
		m.logger.Warn("closing a memory volume's descriptor that no daemon recorded", "volume", key)
		unix.Close(fd)
		m.dropKept(key)
	}
	if len(mv.lost) > 0 {
		m.logger.Error("memory volumes lost: what kept them while no daemon ran is gone (the holder was killed, or systemd's store emptied); their tasks find them empty", "volumes", strings.Join(mv.lost, ", "))
	}
	if len(rec.Volumes) > 0 {
		mv.mu.Lock()
		defer mv.mu.Unlock()
		if err := mv.saveLocked(); err != nil {
			m.logger.Error("failed to record the memory volumes: a daemon taking over will not tell which it lost", "error", err)
		}
	}
}

// LostMemory names the memory volumes that the previous daemon of this
// connection made and that were gone when this one started.
func (m *Mount) LostMemory() []string { return m.mem.lost }

// memoryKeyLive reports whether key names a memory volume of a task of a
// live allocation.
func (m *Mount) memoryKeyLive(key string) bool {
	parts := strings.Split(key, "/")
	if len(parts) != 3 || parts[2] != allocdir.TaskSecrets && parts[2] != allocdir.TaskPrivate {
		return false
	}
	st, err := m.store.View(parts[0])
	return err == nil && st.TaskIndex(parts[1]) >= 0
}

func (m *Mount) dropKept(key string) {
	m.mem.mu.Lock()
	k := m.mem.keeper
	m.mem.mu.Unlock()
	if k == nil {
		return
	}
	if err := k.Drop(key); err != nil {
		m.logger.Warn("the keeper did not drop a memory volume", "volume", key, "error", err)
	}
}

// memVolumeOf returns the memory volume name of task of allocation st,
// making it on first use with the task's caps and owner.
func (m *Mount) memVolumeOf(st *record.State, task allocdir.Task, name string) (*memVolume, error) {
	key := st.ID + "/" + task.Name + "/" + name
	mv := &m.mem
	mv.mu.Lock()
	defer mv.mu.Unlock()
	if v, ok := mv.vols[key]; ok {
		return v, nil
	}
	limit := task.SecretsBytes()
	if name == allocdir.TaskPrivate {
		limit = task.PrivateBytes()
	}
	opts := tmpfs.Options{Bytes: limit, Inodes: defaultMemInodes(limit), UID: int(m.agent.uid), GID: int(m.agent.gid), Mode: 0o700}
	if m.opts.MemoryInodes != nil {
		opts.Inodes = m.opts.MemoryInodes(limit)
	}
	o, mode, err := allocdir.SecretsOwner(task)
	if err != nil {
		// Fail closed: without its user, the directory is the agent's
		// alone rather than nobody's.
		m.logger.Error("task user not found; its secrets are the agent's only", "alloc_id", st.ID, "task", task.Name, "user", task.User, "error", err)
	} else {
		opts.Mode = uint32(mode.Perm())
		if o != nil {
			opts.UID, opts.GID = o.UID, o.GID
		}
	}
	f, err := tmpfs.New(opts)
	if err != nil {
		return nil, fmt.Errorf("memory volume %s: %w", key, err)
	}
	if !f.NoSwap() {
		m.noSwapOnce.Do(func() {
			m.logger.Warn("this kernel's tmpfs has no noswap (Linux 6.4): memory volumes' pages may be swapped to disk")
		})
	}
	v := &memVolume{key: key, fs: f}
	mv.vols[key] = v
	if err := mv.saveLocked(); err != nil {
		m.logger.Error("failed to record the memory volumes: a daemon taking over will not tell which it lost", "error", err)
	}
	if mv.keeper != nil {
		if err := mv.keeper.Keep(key, f.Fd()); err != nil {
			m.logger.Error("the keeper refused a memory volume: its files end with this daemon", "volume", key, "error", err)
		} else {
			mv.kept[key] = true
		}
	}
	return v, nil
}

// KeepMemory makes k the keeper of the memory volumes, and hands it every
// live one: a keeper that starts after the mount (a holder started for a
// new mount, one that replaced a holder that died) keeps them from then
// on. It returns the volumes k refused.
func (m *Mount) KeepMemory(k MemoryKeeper) error {
	mv := &m.mem
	mv.mu.Lock()
	defer mv.mu.Unlock()
	mv.keeper = k
	var errs []error
	for key, v := range mv.vols {
		mv.kept[key] = false
		if k == nil {
			continue
		}
		v.mu.Lock()
		var err error
		if !v.dropped {
			err = k.Keep(key, v.fs.Fd())
		}
		v.mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		mv.kept[key] = true
	}
	return errors.Join(errs...)
}

// existingMemVolume returns a task's memory volume if it has been made,
// or nil.
func (m *Mount) existingMemVolume(allocID, task, name string) *memVolume {
	m.mem.mu.Lock()
	defer m.mem.mu.Unlock()
	return m.mem.vols[allocID+"/"+task+"/"+name]
}

// memoryInode returns the root node of the memory volume name of the
// task at index i of st.
func (m *Mount) memoryInode(ctx context.Context, parent *gofs.Inode, st *record.State, i int, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	v, err := m.memVolumeOf(st, st.Tasks[i], name)
	if err != nil {
		m.logger.Error("failed to make a memory volume", "error", err)
		if errors.Is(err, syscall.EPERM) {
			return nil, syscall.EPERM
		}
		return nil, syscall.EIO
	}
	view := memoryViewOf(i, name)
	slot, errno := m.slots.slot(st.ID, view)
	if errno != 0 {
		m.logger.Error("too many allocation views live at once", "alloc_id", st.ID, "max", maxSlot)
		return nil, errno
	}
	stack := &layer.Stack{Roots: []string{"memory:" + v.key}, Held: v}
	node, errno := m.vol.NewRoot(ctx, parent, volume.Root{View: view, Slot: slot, Stack: stack, Memory: true}, out)
	if errno == 0 {
		m.stableTimeouts(out)
	}
	return node, errno
}

// dropMemory ends the memory volumes of an allocation (prefix "<alloc>/")
// or one volume (its key).
func (m *Mount) dropMemory(match func(key string) bool) {
	var dropped []*memVolume
	mv := &m.mem
	mv.mu.Lock()
	for key, v := range mv.vols {
		if match(key) {
			delete(mv.vols, key)
			delete(mv.kept, key)
			dropped = append(dropped, v)
		}
	}
	if len(dropped) > 0 {
		if err := mv.saveLocked(); err != nil {
			m.logger.Warn("failed to record the memory volumes", "error", err)
		}
	}
	mv.mu.Unlock()
	for _, v := range dropped {
		v.drop()
		m.dropKept(v.key)
	}
}

func (m *Mount) dropMem(allocID string) {
	m.dropMemory(func(key string) bool { return strings.HasPrefix(key, allocID+"/") })
}

func (m *Mount) dropMemRoot(allocID, task, name string) {
	key := allocID + "/" + task + "/" + name
	m.dropMemory(func(k string) bool { return k == key })
}

// closeMemory ends every memory volume, at a full stop.
func (m *Mount) closeMemory() error {
	m.dropMemory(func(string) bool { return true })
	if err := os.Remove(m.mem.file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("failed to remove the record of the memory volumes: %w", err)
	}
	return nil
}

// MemoryInUse names the memory volumes (<alloc>/<task>/secrets or
// private) that hold anything and that no keeper holds: their content
// ends with this process.
func (m *Mount) MemoryInUse() []string {
	m.mem.mu.Lock()
	var vols []*memVolume
	for key, v := range m.mem.vols {
		if !m.mem.kept[key] {
			vols = append(vols, v)
		}
	}
	m.mem.mu.Unlock()
	var names []string
	for _, v := range vols {
		if v.used() {
			names = append(names, v.key)
		}
	}
	sort.Strings(names)
	return names
}

// memoryRoot is the read side's view of a task's memory volume: a
// descriptor of its root for a beneath-only ReadFS, or -1 when it has
// not been made. The caller closes it.
func (m *Mount) memoryRoot(allocID, task, name string) (int, error) {
	v := m.existingMemVolume(allocID, task, name)
	if v == nil {
		return -1, nil
	}
	fd, release, err := v.Root()
	if err != nil {
		return -1, nil
	}
	defer release()
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("memory volume %s: %w", v.key, err)
	}
	return dup, nil
}

// memoryPaths finds node ino of the memory volume name of the i-th task
// of st, for a daemon that took the connection over: the instance's tree
// is searched (it holds at most its entry cap). A file born after this
// daemon started only took a freed number, and is not the node.
func (m *Mount) memoryPaths(st *record.State, i int, name string, ino uint64) ([][]string, syscall.Errno) {
	if i >= len(st.Tasks) {
		return nil, syscall.ESTALE
	}
	v, err := m.memVolumeOf(st, st.Tasks[i], name)
	if err != nil {
		return nil, syscall.ESTALE
	}
	fd, release, err := v.Root()
	if err != nil {
		return nil, syscall.ESTALE
	}
	defer release()
	rel, ok := findInoAt(fd, ino, m.started)
	if !ok {
		return nil, syscall.ESTALE
	}
	return [][]string{append([]string{st.ID, st.Tasks[i].Name, name}, rel...)}, 0
}

// findInoAt searches the tree beneath the directory dirfd for an entry of
// inode number ino made before started, and returns its names below
// dirfd ([] for dirfd itself).
func findInoAt(dirfd int, ino uint64, started time.Time) ([]string, bool) {
	var st unix.Statx_t
	if err := unix.Statx(dirfd, "", unix.AT_EMPTY_PATH, unix.STATX_INO|unix.STATX_BTIME, &st); err != nil {
		return nil, false
	}
	if st.Ino == ino {
		return []string{}, bornBefore(&st, started)
	}
	return findBelow(dirfd, ino, started)
}

func findBelow(dirfd int, ino uint64, started time.Time) ([]string, bool) {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	d := os.NewFile(uintptr(fd), "")
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var dirs []string
	for _, n := range names {
		var st unix.Statx_t
		if unix.Statx(fd, n, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_TYPE|unix.STATX_BTIME, &st) != nil {
			continue
		}
		if st.Ino == ino {
			return []string{n}, bornBefore(&st, started)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			dirs = append(dirs, n)
		}
	}
	for _, n := range dirs {
		sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		rel, ok := findBelow(sub, ino, started)
		unix.Close(sub)
		if rel != nil {
			return append([]string{n}, rel...), ok
		}
	}
	return nil, false
}

// bornBefore reports whether the entry st was made before t: one made
// later only took a freed inode number.
func bornBefore(st *unix.Statx_t, t time.Time) bool {
	if st.Mask&unix.STATX_BTIME == 0 {
		return true
	}
	return time.Unix(st.Btime.Sec, int64(st.Btime.Nsec)).Before(t)
}
