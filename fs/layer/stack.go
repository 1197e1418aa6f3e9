package layer

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Stack is a volume's layers by root path: Roots[0] is the upper layer,
// the rest are the read-only lowers, top first. All of them live on the
// data dir's one filesystem.
type Stack struct {
	Roots []string
	// Cache, when set, keeps the roots' descriptors between calls.
	Cache *RootCache
	// Dirs, when set, keeps descriptors of the directories entries are
	// named in (Loc) between calls; not for a host layer or a held root.
	// Whoever moves or removes a directory of these layers forgets them.
	Dirs *DirCache
	// Links, when set, keeps a lower file's names one file across its
	// copy-up.
	Links *Links
	// Ctimes, when set, hides allocfs's own changes from the change
	// times of upper entries.
	Ctimes *Ctimes
	// CopyUps, when set, is told of every entry copied up.
	CopyUps CopyUpObserver
	// Host, when set, makes the last layer a host layer (host.go): its
	// root, Roots' last, is Host.Skeleton.
	Host *HostLayer
	// Identity, when set, is the inode number the entry rel of the
	// layer at position i, whose lstat is st, is shown with, which its
	// copy-up records as its origin; st.Ino when nil. The tree sets it
	// to number a host layer's entries apart from the data dir's files,
	// and from each other.
	Identity func(i int, rel string, st *syscall.Stat_t) uint64
	// Salts, when set, are mixed into the inode numbers of each layer's
	// entries (Salted), one per root: on btrfs every layer is a
	// subvolume, and subvolumes number their inodes alike.
	Salts []uint64
	// Held, when set, gives the descriptor of the upper layer's root,
	// Roots[0] being then only its name: a detached mount (a memory
	// volume's tmpfs) has no path, and the /proc/self/fd name of its
	// descriptor would name another file once that is closed.
	Held HeldRoot
}

// HeldRoot gives a root that is reached by descriptor only.
type HeldRoot interface {
	// Root returns a descriptor of the root, valid until release is
	// called, or an error once the root is gone.
	Root() (fd int, release func(), err error)
}

// CopyUpObserver is told of each entry a stack copied up into its upper
// layer: its type (the S_IFMT bits of st_mode), the bytes of a regular
// file's data (its size: a clone or a sparse copy may move fewer), and
// how long the copy took, metadata and naming included. A file's other
// names, linked to the copy, are not copies of their own. It runs on the
// goroutine that copied, inside the FUSE request that caused the copy,
// so it must not block.
type CopyUpObserver interface {
	CopiedUp(mode uint32, bytes int64, d time.Duration)
}

// SaltShift is where a layer's salt sits in the inode numbers of its
// entries: a salted layer shows inode numbers below 1<<SaltShift only.
const SaltShift = 32

// Salted is the inode number an entry of layer i whose backing inode
// number is ino is shown with, and false where ino does not fit beside
// the salt.
func (s *Stack) Salted(i int, ino uint64) (uint64, bool) {
	if i >= len(s.Salts) || s.Salts[i] == 0 {
		return ino, true
	}
	return ino | s.Salts[i], ino < 1<<SaltShift
}

// Entry is one name of a merged directory listing.
type Entry struct {
	Name string
	// Mode holds the st_mode type bits.
	Mode uint32
}

// All returns the positions of every layer of the stack, for the root of
// the volume, which every layer holds.
func (s *Stack) All() []int {
	all := make([]int, len(s.Roots))
	for i := range all {
		all[i] = i
	}
	return all
}

// Path is rel's backing path in the layer at position i, for errors and
// logs: entries are reached through Loc and Open, never by path.
func (s *Stack) Path(i int, rel string) string { return filepath.Join(s.Roots[i], rel) }

// Visible computes where rel, inside a directory visible in dirLayers, is
// visible: the layers holding it, the shown one first, and its lstat in
// that one. For a directory the rest are the lower directories merged
// under it, down to the first opaque one; a non-directory is shown from
// one layer only. A whiteout, or a non-directory under a directory, hides
// everything below it. A name visible nowhere gives ENOENT.
func (s *Stack) Visible(rel string, dirLayers []int) ([]int, syscall.Stat_t, error) {
	var layers []int
	var shown syscall.Stat_t
	for _, i := range dirLayers {
		if s.removed(i, rel) {
			continue
		}
		var st syscall.Stat_t
		l, err := s.Loc(i, rel)
		if err == nil {
			err = l.Lstat(&st)
		}
		if err != nil {
			l.Close()
			if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
				continue
			}
			return nil, shown, err
		}
		stop := IsWhiteoutAt(l, &st) || (len(layers) > 0 && !IsDir(&st))
		if !stop {
			if len(layers) == 0 {
				shown = st
			}
			layers = append(layers, i)
			stop = !IsDir(&st) || IsOpaque(l)
		}
		l.Close()
		if stop {
			break
		}
	}
	if len(layers) == 0 {
		return nil, shown, syscall.ENOENT
	}
	return layers, shown, nil
}

// Lowers is dirLayers without the upper layer.
func Lowers(dirLayers []int) []int {
	var lowers []int
	for _, i := range dirLayers {
		if i != 0 {
			lowers = append(lowers, i)
		}
	}
	return lowers
}

// InLowers reports whether rel, in a directory visible in dirLayers, is
// visible from a lower layer, so that removing or renaming it needs a
// whiteout.
func (s *Stack) InLowers(rel string, dirLayers []int) bool {
	lowers := Lowers(dirLayers)
	if len(lowers) == 0 {
		return false
	}
	_, _, err := s.Visible(rel, lowers)
	return err == nil
}

// List returns the merged entries of the directory rel visible in
// dirLayers: upper names first, whiteouts and names already seen left
// out.
func (s *Stack) List(rel string, dirLayers []int) ([]Entry, error) {
	seen := make(map[string]bool)
	var out []Entry
	for _, i := range dirLayers {
		if s.IsHost(i) && !s.Host.On() {
			// A host layer turned off shows nothing, below its root
			// too: a directory a node was looked up in while it was
			// on lists the other layers alone.
			continue
		}
		var hidden func(string) bool
		if s.IsHost(i) && s.Host.Removed != nil {
			if s.Host.Removed.Hides(rel) {
				continue
			}
			hidden = s.Host.Removed.HiddenIn(rel)
		}
		f, err := s.openDir(i, rel)
		if err != nil {
			return nil, err
		}
		entries, err := f.ReadDir(-1)
		if err != nil {
			f.Close()
			return nil, err
		}
		dir := Loc{Dir: int(f.Fd()), path: f.Name()}
		for _, e := range entries {
			name := e.Name()
			if seen[name] || (hidden != nil && hidden(name)) {
				continue
			}
			seen[name] = true
			if e.Type()&os.ModeCharDevice != 0 {
				var st syscall.Stat_t
				at := dir.child(name)
				if at.Lstat(&st) == nil && IsWhiteoutAt(at, &st) {
					continue
				}
			}
			out = append(out, Entry{Name: name, Mode: FileTypeBits(e.Type())})
		}
		f.Close()
	}
	return out, nil
}

// FileTypeBits turns a directory entry's type into st_mode type bits.
func FileTypeBits(t os.FileMode) uint32 {
	switch {
	case t.IsDir():
		return syscall.S_IFDIR
	case t&os.ModeSymlink != 0:
		return syscall.S_IFLNK
	case t&os.ModeNamedPipe != 0:
		return syscall.S_IFIFO
	case t&os.ModeSocket != 0:
		return syscall.S_IFSOCK
	case t&os.ModeCharDevice != 0:
		return syscall.S_IFCHR
	case t&os.ModeDevice != 0:
		return syscall.S_IFBLK
	}
	return syscall.S_IFREG
}

// Whiteout hides rel in the lower layers: rel's directory must be in the
// upper layer.
func (s *Stack) Whiteout(rel string) error {
	l, err := s.Loc(0, rel)
	if err != nil {
		return err
	}
	defer l.Close()
	return l.Mknod(syscall.S_IFCHR, 0)
}

// ClearWhiteout removes a whiteout at rel in the upper layer before an
// entry is made there, and reports whether there was one.
func (s *Stack) ClearWhiteout(rel string) (bool, error) {
	l, err := s.Loc(0, rel)
	if err != nil {
		return false, nil
	}
	defer l.Close()
	var st syscall.Stat_t
	if err := l.Lstat(&st); err != nil || !IsWhiteoutAt(l, &st) {
		return false, nil
	}
	if err := l.Unlink(); err != nil {
		return false, err
	}
	return true, nil
}

// ClearDir removes what is left in the upper directory rel whose merged
// view is empty: only whiteouts can be.
func (s *Stack) ClearDir(rel string) error {
	f, err := s.openDir(0, rel)
	if err != nil {
		return err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	dir := Loc{Dir: int(f.Fd()), path: f.Name()}
	for _, name := range names {
		if err := dir.child(name).Unlink(); err != nil {
			return err
		}
	}
	return nil
}

// openDir opens the directory rel of the layer at position i for listing,
// never anything else: a FIFO swapped in for it would block the open
// until a writer came, and a symbolic link could lead out of the layer.
func (s *Stack) openDir(i int, rel string) (*os.File, error) {
	fd, err := s.Open(i, rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NONBLOCK)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), s.Path(i, rel)), nil
}
