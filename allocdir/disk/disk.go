//go:build linux

package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/allocfs/allocfs/internal/mountinfo"
)

// AllocDir is the plain on-disk implementation of [allocdir.Interface]:
// real directories under <rootDir>/<allocID>, with Nomad's semantics. It
// is the reference that other implementations are compared against. All
// methods are safe for concurrent use.
type AllocDir struct {
	logger   hclog.Logger
	rootDir  string
	allocID  string
	allocDir string

	allocdir.TaskDirs

	mu    sync.RWMutex
	built bool
}

var _ allocdir.Interface = (*AllocDir)(nil)

// New returns the allocation allocID under rootDir (Nomad's
// client.alloc_dir). Nothing is created until Build.
func New(logger hclog.Logger, rootDir, allocID string) (*AllocDir, error) {
	if err := allocdir.ValidName(allocID); err != nil {
		return nil, fmt.Errorf("allocation ID: %w", err)
	}
	if !path.IsAbs(rootDir) {
		abs, err := absPath(rootDir)
		if err != nil {
			return nil, err
		}
		rootDir = abs
	}
	return &AllocDir{
		logger:   logger.Named("alloc_dir").With("alloc_id", allocID),
		rootDir:  rootDir,
		allocID:  allocID,
		allocDir: path.Join(rootDir, allocID),
	}, nil
}

func absPath(p string) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("failed to make %q absolute: %w", p, err)
	}
	return path.Join(wd, p), nil
}

// AllocDirPath implements allocdir.Interface.
func (d *AllocDir) AllocDirPath() string { return d.allocDir }

// ShareDirPath implements allocdir.Interface.
func (d *AllocDir) ShareDirPath() string { return path.Join(d.allocDir, allocdir.SharedAllocName) }

// NewTaskDir implements allocdir.Interface.
func (d *AllocDir) NewTaskDir(task allocdir.Task) *allocdir.TaskDir {
	return d.Register(allocdir.NewTaskDirPaths(d.allocDir, task, d.buildTask))
}

// Build implements allocdir.Interface.
func (d *AllocDir) Build() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := os.MkdirAll(d.rootDir, 0o755); err != nil {
		return fmt.Errorf("failed to create alloc root %q: %w", d.rootDir, err)
	}
	allocFd, err := d.ensureAllocDir()
	if err != nil {
		return err
	}
	defer unix.Close(allocFd)
	sharedFd, err := ensureDir(allocFd, allocdir.SharedAllocName, allocdir.SharedDirMode, allocdir.Nobody())
	if err != nil {
		return fmt.Errorf("failed to build shared alloc dir of %s: %w", d.allocID, err)
	}
	defer unix.Close(sharedFd)
	for _, name := range allocdir.SharedAllocDirs {
		fd, err := ensureDir(sharedFd, name, allocdir.SharedDirMode, allocdir.Nobody())
		if err != nil {
			return fmt.Errorf("failed to build alloc/%s of %s: %w", name, d.allocID, err)
		}
		unix.Close(fd)
	}
	d.built = true
	return nil
}

// ensureAllocDir creates <root>/<allocID> (0755, owned by the agent) and
// returns an fd of it.
func (d *AllocDir) ensureAllocDir() (int, error) {
	rootFd, err := unix.Open(d.rootDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("failed to open alloc root %q: %w", d.rootDir, err)
	}
	defer unix.Close(rootFd)
	fd, err := ensureDir(rootFd, d.allocID, allocdir.AllocDirMode, nil)
	if err != nil {
		return -1, fmt.Errorf("failed to create alloc dir %q: %w", d.allocDir, err)
	}
	return fd, nil
}

// openAlloc opens the allocation directory for fd-relative access.
func (d *AllocDir) openAlloc() (int, error) {
	fd, err := unix.Open(d.allocDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: d.allocDir, Err: err}
	}
	return fd, nil
}

func (d *AllocDir) buildTask(td *allocdir.TaskDir) error {
	name := td.Task.Name
	if err := allocdir.ValidName(name); err != nil {
		return fmt.Errorf("failed to build task dir: %w", err)
	}
	if name == allocdir.SharedAllocName {
		return fmt.Errorf("failed to build task dir: %w: %q is the shared alloc dir", allocdir.ErrInvalidName, name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	allocFd, err := d.ensureAllocDir()
	if err != nil {
		return err
	}
	defer unix.Close(allocFd)
	taskFd, err := ensureDir(allocFd, name, allocdir.TaskDirMode, allocdir.Nobody())
	if err != nil {
		return fmt.Errorf("failed to build task dir %q: %w", td.Dir, err)
	}
	defer unix.Close(taskFd)
	for _, sub := range []struct {
		name string
		mode os.FileMode
	}{{allocdir.TaskLocal, allocdir.TaskDirMode}, {allocdir.TmpDirName, allocdir.TaskTmpMode}} {
		fd, err := ensureDir(taskFd, sub.name, sub.mode, allocdir.Nobody())
		if err != nil {
			return fmt.Errorf("failed to build %s/%s: %w", name, sub.name, err)
		}
		unix.Close(fd)
	}
	owner, mode, err := allocdir.SecretsOwner(td.Task)
	if err != nil {
		return err
	}
	if err := d.buildSecretDir(taskFd, name, allocdir.TaskSecrets, td.Task.SecretsBytes(), owner, mode); err != nil {
		return err
	}
	return d.buildSecretDir(taskFd, name, allocdir.TaskPrivate, td.Task.PrivateBytes(), owner, mode)
}

// buildSecretDir creates a memory-only directory: a size-capped, noexec
// tmpfs when running as root, a plain directory otherwise.
func (d *AllocDir) buildSecretDir(taskFd int, task, name string, size int64, o *allocdir.Owner, mode os.FileMode) error {
	fd, err := ensureDir(taskFd, name, mode, o)
	if err != nil {
		return fmt.Errorf("failed to build %s/%s: %w", task, name, err)
	}
	if os.Geteuid() != 0 {
		unix.Close(fd)
		return nil
	}
	mounted, err := isMountPoint(taskFd, fd)
	if err != nil || mounted {
		unix.Close(fd)
		return err
	}
	// Mount through the fd's magic link so that a symlink swapped in for
	// the directory cannot redirect the mount.
	target := fmt.Sprintf("/proc/self/fd/%d", fd)
	opts := fmt.Sprintf("size=%d,mode=%o,noswap", size, uint32(mode.Perm()))
	flags := uintptr(unix.MS_NOEXEC | unix.MS_NOSUID | unix.MS_NODEV)
	err = unix.Mount("tmpfs", target, "tmpfs", flags, opts)
	if errors.Is(err, unix.EINVAL) {
		// Kernels before 6.4 do not know noswap.
		err = unix.Mount("tmpfs", target, "tmpfs", flags, strings.TrimSuffix(opts, ",noswap"))
	}
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("failed to mount tmpfs on %s/%s of %s: %w", task, name, d.allocID, err)
	}
	d.logger.Debug("mounted memory-only dir", "task", task, "dir", name, "bytes", size)
	// Re-open: the fd taken before the mount names the covered directory.
	fd, err = ensureDir(taskFd, name, mode, o)
	if err != nil {
		return fmt.Errorf("failed to set up %s/%s: %w", task, name, err)
	}
	unix.Close(fd)
	return nil
}

// isMountPoint reports whether dirFd is the root of a mount other than
// its parent's.
func isMountPoint(parentFd, dirFd int) (bool, error) {
	var parent, dir unix.Stat_t
	if err := unix.Fstat(parentFd, &parent); err != nil {
		return false, fmt.Errorf("failed to stat parent: %w", err)
	}
	if err := unix.Fstat(dirFd, &dir); err != nil {
		return false, fmt.Errorf("failed to stat dir: %w", err)
	}
	return parent.Dev != dir.Dev, nil
}

// Destroy implements allocdir.Interface.
func (d *AllocDir) Destroy() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.built = false
	var errs []error
	mounts, err := mountsUnder(d.allocDir)
	if err != nil {
		errs = append(errs, err)
	}
	unmountFailed := err != nil
	for _, mp := range mounts {
		if err := unmount(mp); err != nil {
			errs = append(errs, err)
			unmountFailed = true
		}
	}
	if unmountFailed {
		// A recursive delete through a mount that is still attached would
		// delete whatever it shows; leave everything for a later retry.
		errs = append(errs, fmt.Errorf("not removing %q: mounts below it could not be released", d.allocDir))
		return errors.Join(errs...)
	}
	if err := allocdir.RemoveAll(d.allocDir); err != nil {
		errs = append(errs, fmt.Errorf("failed to remove alloc dir %q: %w", d.allocDir, err))
	}
	return errors.Join(errs...)
}

// mountsUnder lists mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	mounts, err := mountinfo.Read("")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m.MountPoint)
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out, nil
}

// unmount releases a mount point, falling back to a lazy detach when it is
// busy: a detached mount is no longer reachable through the tree, so the
// removal that follows cannot reach into it.
func unmount(mp string) error {
	err := unix.Unmount(mp, unix.UMOUNT_NOFOLLOW)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err2 := unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err2 != nil {
		return fmt.Errorf("failed to unmount %q: %w (lazy: %v)", mp, err, err2)
	}
	return nil
}

// Move implements allocdir.Interface. Between two on-disk allocations it
// renames alloc/data and each task's local/ (the same filesystem is
// required, as in Nomad). From any other implementation it copies through
// that implementation's snapshot, and the source keeps its data.
func (d *AllocDir) Move(other allocdir.Interface, tasks []string) error {
	d.mu.RLock()
	built := d.built
	d.mu.RUnlock()
	if !built {
		return fmt.Errorf("unable to move to %q: %w", d.allocDir, allocdir.ErrNotBuilt)
	}
	dirs, err := allocdir.MigratedDirs(tasks)
	if err != nil {
		return fmt.Errorf("unable to move: %w", err)
	}
	prev, ok := other.(*AllocDir)
	if !ok {
		return d.moveFromSnapshot(other, dirs)
	}
	// The renames below need no lock: the directories being replaced are
	// empty placeholders and the source's tree is read by name only.
	dstFd, err := d.openAlloc()
	if err != nil {
		return fmt.Errorf("unable to move to %q: %w", d.allocDir, err)
	}
	defer unix.Close(dstFd)
	srcFd, err := prev.openAlloc()
	if err != nil {
		return fmt.Errorf("unable to move from %q: %w", prev.allocDir, err)
	}
	defer unix.Close(srcFd)

	for _, rel := range dirs {
		moved, err := renameDirBeneath(srcFd, dstFd, rel)
		if err != nil {
			return fmt.Errorf("error moving %s from %s to %s: %w", rel, prev.allocID, d.allocID, err)
		}
		d.logger.Debug("moved", "what", rel, "from", prev.allocID, "moved", moved)
	}
	return nil
}

// renameDirBeneath moves the directory rel from under srcFd to the same
// place under dstFd. A missing source is not an error (nothing to move);
// an empty destination placeholder is replaced; the destination's parent
// is created (0777, nobody) when missing.
func renameDirBeneath(srcFd, dstFd int, rel string) (bool, error) {
	st, err := allocdir.LstatBeneath(srcFd, rel)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return false, fmt.Errorf("%q is not a directory", rel)
	}
	parent, base := path.Split(rel)
	parent = strings.TrimSuffix(parent, "/")
	srcParent, err := allocdir.OpenBeneath(srcFd, parent, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(srcParent)
	dstParent, err := ensureDir(dstFd, parent, allocdir.TaskDirMode, allocdir.Nobody())
	if err != nil {
		return false, err
	}
	defer unix.Close(dstParent)
	if err := unix.Unlinkat(dstParent, base, unix.AT_REMOVEDIR); err != nil && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("destination %q is not an empty directory: %w", rel, err)
	}
	if err := unix.Renameat2(srcParent, base, dstParent, base, unix.RENAME_NOREPLACE); err != nil {
		return false, fmt.Errorf("rename %q: %w", rel, err)
	}
	return true, nil
}

// moveFromSnapshot copies another implementation's data in through its
// snapshot, unpacked by the safe reader next to the allocation and then
// renamed into place.
func (d *AllocDir) moveFromSnapshot(other allocdir.Interface, dirs []string) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(other.Snapshot(pw)) }()
	staging, err := os.MkdirTemp(d.rootDir, "."+d.allocID+".move-*")
	if err != nil {
		pr.CloseWithError(err)
		return fmt.Errorf("failed to stage move into %s: %w", d.allocID, err)
	}
	defer os.RemoveAll(staging)
	dest := path.Join(staging, "tree")
	_, err = snapshot.Extract(pr, dest, snapshot.ExtractOptions{Chown: os.Geteuid() == 0})
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return fmt.Errorf("failed to copy snapshot into %s: %w", d.allocID, err)
	}
	srcFd, err := unix.Open(dest, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("failed to open staged snapshot: %w", err)
	}
	defer unix.Close(srcFd)
	dstFd, err := d.openAlloc()
	if err != nil {
		return err
	}
	defer unix.Close(dstFd)
	for _, rel := range dirs {
		if _, err := renameDirBeneath(srcFd, dstFd, rel); err != nil {
			return fmt.Errorf("error moving %q into %s: %w", rel, d.allocID, err)
		}
	}
	return nil
}

// Snapshot implements allocdir.FS.
func (d *AllocDir) Snapshot(w io.Writer) error {
	var names []string
	_ = d.WalkTaskDirs(func(td *allocdir.TaskDir) error {
		names = append(names, td.Task.Name)
		return nil
	})
	roots, err := allocdir.MigratedDirs(names)
	if err != nil {
		return fmt.Errorf("failed to snapshot %s: %w", d.allocID, err)
	}
	rootFd, err := d.openAlloc()
	if err != nil {
		return fmt.Errorf("failed to snapshot %s: %w", d.allocID, err)
	}
	defer unix.Close(rootFd)
	return snapshot.Write(w, d.allocID, allocdir.NewBeneathFS(rootFd), roots)
}

// readSide is the shared read side over the allocation directory.
func (d *AllocDir) readSide() allocdir.ReadSide {
	return allocdir.ReadSide{
		AllocID:    d.allocID,
		HostPrefix: d.allocDir,
		Open: func() (allocdir.ReadFS, func(), error) {
			fd, err := d.openAlloc()
			if err != nil {
				return nil, nil, err
			}
			return allocdir.NewBeneathFS(fd), func() { unix.Close(fd) }, nil
		},
	}
}

// List implements allocdir.FS.
func (d *AllocDir) List(p string) ([]*allocdir.FileInfo, error) { return d.readSide().List(p) }

// Stat implements allocdir.FS.
func (d *AllocDir) Stat(p string) (*allocdir.FileInfo, error) { return d.readSide().Stat(p) }

// ReadAt implements allocdir.FS.
func (d *AllocDir) ReadAt(p string, offset int64) (io.ReadCloser, error) {
	return d.readSide().ReadAt(p, offset)
}

// BlockUntilExists implements allocdir.FS.
func (d *AllocDir) BlockUntilExists(ctx context.Context, p string) (chan error, error) {
	return d.readSide().BlockUntilExists(ctx, p)
}

// ChangeEvents implements allocdir.FS.
func (d *AllocDir) ChangeEvents(ctx context.Context, p string, curOffset int64) (*allocdir.FileChanges, error) {
	return d.readSide().ChangeEvents(ctx, p, curOffset)
}
