package fs

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store"
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
// makes through the mount has the host layer, off; it turns on for good
// (store.State.Chroots) at the first step of Nomad's chroot build, a
// chown of the still empty task directory to root (Nomad gives each
// directory it re-creates the owner of its host counterpart, the task
// directory itself that of the host's /, and before that made it
// nobody's): nothing else chowns a task directory Nomad just made to
// root before its task writes anything in it.

// DefaultChrootEnv is Nomad's default chroot_env: host paths by their
// place in the chroot.
func DefaultChrootEnv() map[string]string {
	env := make(map[string]string)
	for _, p := range []string{"/bin", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr", "/run/resolvconf", "/run/systemd/resolve"} {
		env[p] = p
	}
	return env
}

// chrootEnv is a mount's chroot environment, ready to stack.
type chrootEnv struct {
	entries  []layer.HostEntry
	skeleton string // the host layer's root: <data-dir>/chroot/<hash>/root
	empty    string // what an off host layer shows: <data-dir>/chroot/<hash>/empty
	// dataDev is the data dir's device; devs numbers every other one
	// an entry lies on, from 1 (identity.go, backingIno).
	dataDev uint64
	mu      sync.Mutex
	devs    map[uint64]uint64
}

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
	var st unix.Stat_t
	if err := unix.Stat(m.store.DataDir(), &st); err != nil {
		return err
	}
	c := &chrootEnv{entries: entries, dataDev: st.Dev, devs: make(map[uint64]uint64)}
	h := sha256.New()
	for _, e := range entries {
		fmt.Fprintf(h, "%s\x00%s\x00%t\x00", e.Dest, e.Source, e.Dir)
		// Numbered in the order of the entries, so that a daemon taking
		// the mount over numbers them as this one did.
		if err := unix.Stat(e.Source, &st); err == nil {
			c.devOf(st.Dev)
		}
	}
	name := hex.EncodeToString(h.Sum(nil))[:16]
	dir := filepath.Join(m.store.ChrootDir(), name)
	c.skeleton, c.empty = filepath.Join(dir, "root"), filepath.Join(dir, "empty")
	old, err := os.ReadDir(m.store.ChrootDir())
	if err != nil {
		return err
	}
	for _, e := range old {
		if e.Name() != name {
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
	m.chroot = c
	m.logger.Info("chroot environment: task directories Nomad builds a chroot in show it, read-only", "entries", len(entries))
	return nil
}

// devOf numbers a device other than the data dir's.
func (c *chrootEnv) devOf(dev uint64) uint64 {
	if dev == c.dataDev {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.devs[dev]
	if !ok {
		n = uint64(len(c.devs) + 1)
		c.devs[dev] = n
	}
	return n
}

// hostLayer is the host layer of task's directory in allocation id: on
// while its record says Nomad builds a chroot there.
func (m *Mount) hostLayer(id, task string) *layer.HostLayer {
	return &layer.HostLayer{
		Skeleton: m.chroot.skeleton,
		Empty:    m.chroot.empty,
		Entries:  m.chroot.entries,
		On: func() bool {
			st, err := m.store.View(id)
			return err == nil && st.IsChroot(task)
		},
	}
}

// hasHostLayer reports whether the volume key of st stacks a host layer:
// the directory of a task of an allocation Nomad made through the mount,
// on a mount with a chroot environment.
func (m *Mount) hasHostLayer(st *store.State, key string) bool {
	return m.chroot != nil && st.Origin == store.OriginMount && st.TaskIndex(key) >= 0
}

// foreignShift places the number of a host filesystem other than the
// data dir's in a backing inode number, whose bits below it hold the
// inode number there: inode numbers of two filesystems must never meet
// in one volume, which go-fuse would take for one node.
const foreignShift = 40

// backingIno is the inode number the mount shows for the backing entry
// st, before the view's slot is mixed in: its own on the data dir's
// filesystem, on another (a chroot entry's host path) its number there
// with that filesystem's in the bits from foreignShift up.
func (m *Mount) backingIno(st *syscall.Stat_t) uint64 {
	if m.chroot == nil {
		return st.Ino
	}
	n := m.chroot.devOf(st.Dev)
	if n == 0 {
		return st.Ino
	}
	return st.Ino&(1<<foreignShift-1) | n<<foreignShift
}

// maybeChroot turns on the host layer of task root n when the chown in
// of the SETATTR is the first step of Nomad's chroot build: the still
// empty directory of a task Nomad made, given to root.
func (m *Mount) maybeChroot(n *volNode, uid uint32) syscall.Errno {
	if uid != 0 || m.chroot == nil || n.st.Host == nil {
		return 0
	}
	st, err := m.store.View(n.task.id)
	if err != nil || st.IsChroot(n.task.task) {
		return 0
	}
	entries, err := n.st.List("", []int{0})
	if err != nil {
		return toErrno(m.logger, err)
	}
	if len(entries) > 0 {
		return 0
	}
	err = m.handlerChange([]string{n.task.id}, func() error {
		_, err := m.store.SetChroot(n.task.id, n.task.task)
		return err
	})
	if err != nil {
		return toErrno(m.logger, err)
	}
	m.logger.Info("Nomad builds a chroot in a task directory: it shows the chroot environment", "alloc_id", n.task.id, "task", n.task.task)
	return 0
}

// hostPaths returns where in the mount the host entry of backing inode
// number ino (backingIno) may be: in the directory of each task of st
// that shows the chroot environment, at the entry's place; nil when ino
// is no host entry's. A daemon taking the mount over resolves the nodes
// the kernel holds for a chroot's files so (takeover.go).
func (m *Mount) hostPaths(st *store.State, view, ino uint64) [][]string {
	if m.chroot == nil || view != 0 || len(st.Chroots) == 0 {
		return nil
	}
	n, raw := ino>>foreignShift, ino&(1<<foreignShift-1)
	var p string
	var err error
	if n == 0 {
		p, err = openByIno(m.store.DataDir(), ino)
	} else {
		err = os.ErrNotExist
		for _, e := range m.chroot.entries {
			var st unix.Stat_t
			if unix.Stat(e.Source, &st) == nil && m.chroot.devOf(st.Dev) == n {
				p, err = openByIno(e.Source, raw)
				break
			}
		}
	}
	if err != nil {
		return nil
	}
	rel, ok := m.chroot.destOf(p)
	if !ok {
		return nil
	}
	var out [][]string
	for _, task := range st.Chroots {
		out = append(out, append([]string{st.ID, task}, rel...))
	}
	return out
}

// destOf is the place in a task directory of the host path p: below an
// entry's source, or in the skeleton.
func (c *chrootEnv) destOf(p string) ([]string, bool) {
	split := func(dest, below string) []string {
		parts := strings.Split(dest, "/")
		if below != "" {
			parts = append(parts, strings.Split(below, "/")...)
		}
		return parts
	}
	for _, e := range c.entries {
		if p == e.Source {
			return split(e.Dest, ""), true
		}
		if below, ok := strings.CutPrefix(p, e.Source+"/"); ok {
			return split(e.Dest, below), true
		}
	}
	if below, ok := strings.CutPrefix(p, c.skeleton+"/"); ok {
		return strings.Split(below, "/"), true
	}
	return nil, false
}
