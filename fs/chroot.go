package fs

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/fs/volume"
	"golang.org/x/sys/unix"
)

// A chroot that copies nothing. Nomad's exec and java drivers run a task
// chrooted in its directory, and Nomad builds the chroot first: for every
// host path of its chroot_env it re-creates the directories, and for
// every file it skips one already there, else hard-links the host's, else
// copies it. A host file can never be linked into a FUSE mount, so on a
// plain FUSE alloc_dir every such task would copy /usr, /lib, /bin and
// /etc. allocfs shows the chroot environment instead, read-only, below
// the task's own layer (a host layer, fs/layer/host.go): Nomad finds
// every file there and copies none, and what a task or Nomad changes
// copies up into the task's layer, never reaching the host (on a plain
// disk, a task that can write a hard-linked file writes the host's).
//
// Only a task directory Nomad builds a chroot in shows it: a raw_exec,
// docker or exec2 task must find in its directory what it would find on
// a plain disk, and nothing of the host's. Every task directory Nomad
// makes through the mount has the host layer, off; it turns on
// (record.State.Chroots) at the first step of Nomad's chroot build, a
// chown of the still empty task directory to root (Nomad gives each
// directory it re-creates the owner of its host counterpart, the task
// directory itself that of the host's /, and before that made it
// nobody's): nothing else chowns a task directory Nomad just made to
// root before its task writes anything in it. It turns off when Nomad
// tears the directory down (tearDownChroot).

// setupChroot resolves env (Nomad's chroot_env) and makes its skeleton
// under the store's chroot directory, once per content: a skeleton with
// the same entries is used again (its inode numbers are what the kernel
// may still hold, after a restart), others are removed. An empty env is
// none.
func (m *Mount) setupChroot(env map[string]string) error {
	if len(env) == 0 {
		return nil
	}
	entries, err := layer.NewHostEntries(env)
	if err != nil {
		return err
	}
	if len(entries) > maxHostEntries {
		return fmt.Errorf("%w: %d entries, at most %d", layer.ErrChrootEntry, len(entries), maxHostEntries)
	}
	c := &chrootEnv{entries: entries}
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%s\x00%s\x00%t\x00", e.Dest, e.Source, e.Dir)
		var st unix.Stat_t
		if err := unix.Stat(e.Source, &st); err != nil {
			return err
		}
		c.devs = append(c.devs, st.Dev)
	}
	name := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(m.store.ChrootDir(), name)
	c.skeleton, c.empty = filepath.Join(dir, "root"), filepath.Join(dir, "empty")
	old, err := os.ReadDir(m.store.ChrootDir())
	if err != nil {
		return err
	}
	for _, e := range old {
		if e.Name() != name && e.Name() != removedDirName {
			if err := os.RemoveAll(filepath.Join(m.store.ChrootDir(), e.Name())); err != nil {
				return err
			}
		}
	}
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		tmp := dir + ".tmp"
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		if err := layer.BuildSkeleton(filepath.Join(tmp, "root"), entries); err != nil {
			return errors.Join(err, os.RemoveAll(tmp))
		}
		if err := os.Mkdir(filepath.Join(tmp, "empty"), 0o755); err != nil {
			return errors.Join(err, os.RemoveAll(tmp))
		}
		if err := os.Rename(tmp, dir); err != nil {
			return errors.Join(err, os.RemoveAll(tmp))
		}
	} else if err != nil {
		return err
	}
	c.removedDir = filepath.Join(m.store.ChrootDir(), removedDirName)
	if err := m.sweepRemovals(c.removedDir); err != nil {
		return err
	}
	m.chroot = c
	m.logger.Info("chroot environment: task directories Nomad builds a chroot in show it, read-only", "entries", len(entries))
	return nil
}

// removedDirName is the directory of the chroot directory that holds the
// removals of each task layer from its host layer. The host entries
// removed outlive a change of the chroot environment, as a task's own
// files do.
const removedDirName = "removed"

// hostLayer is the host layer of task's directory in allocation id, whose
// upper layer is upper: on while its record says Nomad builds a chroot
// there.
func (m *Mount) hostLayer(id, task, upper string) *layer.HostLayer {
	return &layer.HostLayer{
		Skeleton: m.chroot.skeleton,
		Empty:    m.chroot.empty,
		Entries:  m.chroot.entries,
		On: func() bool {
			st, err := m.store.View(id)
			return err == nil && st.IsChroot(task)
		},
		Removed: m.removals(upper),
	}
}

// removals are the host entries the task layer upper removed, read from
// their log the first time a stack asks, shared by every stack of the
// mount after that. Without them (the log cannot be read), a removal
// from the host layer falls back to a whiteout.
func (m *Mount) removals(upper string) *layer.Removals {
	c := m.chroot
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.removals[upper]; r != nil {
		return r
	}
	r, err := layer.OpenRemovals(filepath.Join(c.removedDir, upper))
	if err != nil {
		m.logger.Error("removals from the host layer unreadable", "layer", upper, "error", err)
		return nil
	}
	if c.removals == nil {
		c.removals = make(map[string]*layer.Removals)
	}
	c.removals[upper] = r
	return r
}

// forgetRemovals closes and deletes the removal logs of the layers that
// are gone: a layer's removals go with it.
func (m *Mount) forgetRemovals() {
	c := m.chroot
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for upper, r := range c.removals {
		if _, err := os.Lstat(m.store.LayerPath(upper)); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		delete(c.removals, upper)
		if err := errors.Join(r.Close(), os.Remove(r.Path())); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.logger.Warn("failed to remove the removals of a layer that is gone", "layer", upper, "error", err)
		}
	}
}

// sweepRemovals makes dir, the directory of the removal logs, and
// deletes the logs of layers that are gone (a crash between a layer's
// removal and its log's) and what a compaction left half-written.
func (m *Mount) sweepRemovals(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("failed to make the directory of host layer removals: %w", err)
	}
	logs, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("failed to list the host layer removals: %w", err)
	}
	for _, e := range logs {
		if _, err := os.Lstat(m.store.LayerPath(e.Name())); errors.Is(err, os.ErrNotExist) || strings.HasSuffix(e.Name(), ".tmp") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return fmt.Errorf("failed to remove the removals of a layer that is gone: %w", err)
			}
		}
	}
	return nil
}

// hasHostLayer reports whether the volume key of st stacks a host layer:
// the directory of a task of an allocation Nomad made through the mount,
// on a mount with a chroot environment.
func (m *Mount) hasHostLayer(st *record.State, key string) bool {
	return m.chroot != nil && st.Origin == record.OriginMount && st.TaskIndex(key) >= 0
}

// hostShift places the number of a host layer's entry in the inode
// number of a host file shown below it (identity), whose bits below it
// hold the file's inode number on its filesystem. One host file may show
// at two places of a chroot (/lib is /usr/lib on a merged-/usr host, and
// Nomad's chroot_env names both) and its filesystem need not be the data
// dir's: either way it must be another node at each place, and never
// meet a layer's file, which go-fuse would take for one node.
const hostShift = 40

// maxHostEntries is how many entries the bits from hostShift up to the
// view's slot number, the top one left for a host file of another
// filesystem than its entry's source (a mount inside it).
const maxHostEntries = 1<<(volume.ViewShift-hostShift-1) - 1

// identity is the inode number the mount shows for the entry rel of the
// layer at position i of stack, whose lstat is st, before the view's
// slot is mixed in: a layer's file's own, a host file's numbered by the
// entry it lies in (hostShift).
func (m *Mount) identity(stack *layer.Stack, i int, rel string, st *syscall.Stat_t) uint64 {
	if !stack.IsHost(i) {
		ino, _ := stack.Salted(i, st.Ino)
		return ino
	}
	n := stack.Host.EntryOf(rel)
	if n == 0 {
		return st.Ino
	}
	ino := st.Ino&(1<<hostShift-1) | uint64(n)<<hostShift
	if st.Dev != m.chroot.devs[n-1] {
		ino |= 1 << (volume.ViewShift - 1)
	}
	return ino
}

// hostPaths returns where in the mount the host entry of backing inode
// number ino (identity), shown in view, may be: in the directory of
// the task of st the view is (taskRootView), at the entry's place; nil
// when ino is no host entry's. A daemon taking the mount over resolves the nodes
// the kernel holds for a chroot's files so (takeover.go).
func (m *Mount) hostPaths(st *record.State, view, ino uint64) [][]string {
	if m.chroot == nil || view < taskRootView || view-taskRootView >= uint64(len(st.Tasks)) {
		return nil
	}
	task := st.Tasks[view-taskRootView].Name
	if !st.IsChroot(task) {
		return nil
	}
	n, raw := ino>>hostShift, ino&(1<<hostShift-1)
	var p string
	var err error
	switch {
	case n == 0:
		p, err = openByIno(m.store.DataDir(), ino)
	case n <= uint64(len(m.chroot.entries)) && !m.chroot.entries[n-1].Dir:
		// A file's entry shows that file alone, and a handle is opened
		// from a directory: its own inode number says whether it is
		// the one.
		p = m.chroot.entries[n-1].Source
		var st unix.Stat_t
		if err = unix.Stat(p, &st); err == nil && st.Ino != raw {
			err = fmt.Errorf("the chroot entry %s is inode %d now, not %d", p, st.Ino, raw)
		}
	case n <= uint64(len(m.chroot.entries)):
		p, err = openByIno(m.chroot.entries[n-1].Source, raw)
	default:
		return nil
	}
	if err != nil {
		return nil
	}
	rel, ok := m.chroot.destOf(p)
	if !ok {
		return nil
	}
	return [][]string{append([]string{st.ID, task}, rel...)}
}

// fileidIno32Gen is the ext4 (and ext2/3) file handle type: a 32-bit
// inode number and a 32-bit generation.
const fileidIno32Gen = 1

// openByIno opens inode ino of the filesystem of dir by handle and
// returns its path.
func openByIno(dir string, ino uint64) (string, error) {
	if ino > 1<<32-1 {
		return "", errors.New("inode number beyond 32 bits")
	}
	mfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(mfd)
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b, uint32(ino))
	fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(fileidIno32Gen, b), unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Ino != ino {
		return "", fmt.Errorf("handle of inode %d opened inode %d (%v)", ino, st.Ino, err)
	}
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}

// volumeStack is the stack of layers of the volume key of st, or nil for
// none: its layers, and for a task directory of Nomad's the host layer of
// the chroot environment at the bottom.
func (m *Mount) volumeStack(st *record.State, key string) *layer.Stack {
	v := st.Volumes[key]
	if v == nil {
		return nil
	}
	stack := &layer.Stack{Roots: []string{m.store.LayerPath(v.Upper)}, Cache: m.roots, Dirs: m.dirs, Links: &m.links, Ctimes: &m.ctimes, CopyUps: m.opts.CopyUps}
	for _, l := range v.Lowers {
		stack.Roots = append(stack.Roots, m.store.LayerPath(l))
	}
	if len(st.Tags) > 0 {
		stack.Salts = make([]uint64, len(stack.Roots))
		for i, l := range append([]string{v.Upper}, v.Lowers...) {
			stack.Salts[i] = uint64(st.Tags[l]) << layer.SaltShift
		}
	}
	if m.hasHostLayer(st, key) {
		stack.Host = m.hostLayer(st.ID, key, v.Upper)
		stack.Roots = append(stack.Roots, stack.Host.Skeleton)
		stack.Identity = func(i int, rel string, st *syscall.Stat_t) uint64 { return m.identity(stack, i, rel, st) }
	}
	return stack
}

// tearDownChroot stops showing the chroot environment in the directory
// of task, once both its secrets/ and private/ are gone. Nomad removes a
// chroot task's secrets/ and private/ only when it destroys the
// allocation (its GC; a task's restart, an agent's restart and a stop
// leave them), and its os.RemoveAll of the allocation's directory
// follows. A crash between the removal and this change leaves the chroot
// on: the walk then removes each host entry, as it would without this. On a local disk that walk unlinks
// every file of the chroot, one by one; here the host layer is off
// first, so that the walk lists, and removes, the task's own layer
// alone, and the GC costs nothing per host entry. Listings of a chroot
// task's directories are never kept by the kernel (volume.Node's
// overlay handles), so the walk sees the change at once.
func (m *Mount) tearDownChroot(id, task string) {
	err := m.handlerChange([]string{id}, func() error {
		_, err := m.store.SetChroot(id, task, false)
		return err
	})
	if err != nil {
		m.logger.Warn("could not take the chroot environment out of a task directory Nomad tears down: its GC will remove each host entry", "alloc_id", id, "task", task, "error", err)
		return
	}
	m.logger.Info("Nomad tears a chroot task directory down: it no longer shows the chroot environment", "alloc_id", id, "task", task)
}
