//go:build linux

package snapshot

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/allocfs/allocfs/allocdir"
	"golang.org/x/sys/unix"
)

// Limits applied by Extract when ExtractOptions leaves them zero.
const (
	// DefaultMaxBytes caps the total size of the regular files of one
	// snapshot (64 GiB).
	DefaultMaxBytes int64 = 64 << 30
	// DefaultMaxEntries caps the number of entries of one snapshot. It
	// also bounds what extraction keeps in memory: about 130 bytes per
	// directory entry (its metadata, by inode number), whatever the
	// names, so at most some 130 MiB.
	DefaultMaxEntries = 1 << 20
)

const (
	// maxErrorBody caps how much of a sender's error entry is read: it
	// ends up in an error message and in logs.
	maxErrorBody = 64 << 10
	// maxNameLen caps an entry's name. PATH_MAX does not bound a tree: a
	// task makes one as deep as it likes by relative paths, and a volume
	// snapshots it whole (the extractor opens such paths in steps). The
	// cap holds some 250 levels of 255-byte names, and bounds what one
	// entry keeps in memory while it is extracted.
	maxNameLen = 64 << 10
	// maxLinkLen is the kernel's limit on a symbolic link's target.
	maxLinkLen = unix.PathMax - 1
	// trailerSize is the end-of-archive marker: two zero blocks.
	trailerSize = 2 * 512
)

// ExtractOptions tunes Extract.
type ExtractOptions struct {
	// MaxBytes caps the sum of the sizes of regular files; 0 (or less)
	// means DefaultMaxBytes.
	MaxBytes int64
	// MaxEntries caps the number of entries; 0 (or less) means
	// DefaultMaxEntries.
	MaxEntries int
	// Chown restores the numeric owner and group from the headers; it
	// needs CAP_CHOWN. Without it everything belongs to the caller.
	Chown bool
}

// ExtractStats counts what Extract read and created.
type ExtractStats struct {
	// Entries is the number of headers read, skipped ones included.
	Entries int
	// Dirs, Files and Symlinks count what was created from an entry;
	// directories created only as parents are not counted.
	Dirs, Files, Symlinks int
	// Skipped counts entries that were read but create nothing (global
	// headers).
	Skipped int
	// Bytes is the total size of the regular files written.
	Bytes int64
}

// ErrEntryType is wrapped, with allocdir.ErrArchive, by the refusal of an
// entry of a type that no snapshot writer produces.
var ErrEntryType = errors.New("entry type never found in a snapshot")

// Extract unpacks a snapshot written by [Write] (or by Nomad) from r into
// dest, which must not exist and whose parent must. It is the only way a
// snapshot from another node should ever be unpacked: the sender may be
// compromised, so every entry is checked and nothing is written outside
// dest, through a symbolic link, or at all unless the whole archive was
// accepted.
//
// The archive is unpacked into a fresh directory next to dest (mode 0700
// while it is being filled) that is renamed to dest, with mode 0755, only
// once the end-of-archive trailer was read. On any error that directory
// is removed and dest is not created.
//
// An archive is refused with an error wrapping [allocdir.ErrArchive] when:
//   - it carries a sender's error entry (a top-level regular file named
//     NOMAD-<id>-ERROR.log); its text is part of the error;
//   - a name is empty, absolute, contains NUL or a ".." component, names
//     the root, or lies outside Nomad's snapshot layout (alloc,
//     alloc/data/..., <task>, <task>/local/...);
//   - a name appears twice, or one of its parents is not a directory
//     created from this archive (so nothing is ever written through a
//     symbolic link);
//   - a symbolic link is absolute or leads above the root, lexically or
//     through the archive's other links;
//   - an entry is of a type no snapshot writer produces (also wrapping
//     [ErrEntryType]): a hard link, a FIFO, a character or block device,
//     a sparse file in the old GNU form or in the PAX form (GNU.sparse.*
//     records, which archive/tar reports as a regular file), or a type
//     unknown here. Nomad's writer and Write archive every name as a
//     full file, so a hard link or a sparse map can only be crafted,
//     and a sparse map would turn a few bytes on the wire into any amount
//     of zeros on disk;
//   - it exceeds MaxBytes or MaxEntries;
//   - it is corrupt or ends without its trailer (a stream cut at an entry
//     boundary is otherwise indistinguishable from a complete one).
//
// Global headers are skipped. Permission and sticky bits are restored;
// setuid and setgid are dropped, because the sender is remote and must
// not be able to plant a set-id program on this node. Owners are restored
// only with Chown. Modification times of files, directories and links are
// restored.
//
// What the extraction remembers does not grow with the names the archive
// holds: the directory being filled is private and fresh, so the disk
// itself says what exists (every create is exclusive and refuses links on
// the way), and only the metadata of the directories named by an entry is
// kept, by inode number, until a last pass over the tree applies it and
// checks the links that climb.
//
// Errors that are not the archive's fault (reading r, a full disk) are
// returned wrapped but do not wrap allocdir.ErrArchive.
func Extract(r io.Reader, dest string, opts ExtractOptions) (stats ExtractStats, err error) {
	dest = filepath.Clean(dest)
	parent, base := filepath.Dir(dest), filepath.Base(dest)
	if base == "/" || base == "." || base == ".." {
		return stats, fmt.Errorf("failed to extract snapshot: invalid destination %q", dest)
	}
	if _, err := os.Lstat(dest); err == nil {
		return stats, fmt.Errorf("failed to extract snapshot into %q: %w", dest, fs.ErrExist)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return stats, fmt.Errorf("failed to extract snapshot into %q: %w", dest, err)
	}
	if fi, err := os.Stat(parent); err != nil {
		return stats, fmt.Errorf("failed to extract snapshot into %q: %w", dest, err)
	} else if !fi.IsDir() {
		return stats, fmt.Errorf("failed to extract snapshot into %q: parent %q is not a directory", dest, parent)
	}

	tmp, err := os.MkdirTemp(parent, "."+base+".extract-*")
	if err != nil {
		return stats, fmt.Errorf("failed to extract snapshot into %q: %w", dest, err)
	}
	defer func() {
		if err != nil {
			_ = allocdir.RemoveAll(tmp)
		}
	}()

	x, err := newExtractor(tmp, opts)
	if err != nil {
		return stats, fmt.Errorf("failed to extract snapshot into %q: %w", dest, err)
	}
	err = x.run(r)
	if err == nil {
		// The root stays private until the archive was accepted.
		if cerr := unix.Fchmod(x.rootfd, uint32(allocdir.AllocDirMode.Perm())); cerr != nil {
			err = fmt.Errorf("failed to chmod %q: %w", tmp, cerr)
		}
	}
	x.close()
	stats = x.stats
	if err != nil {
		return stats, fmt.Errorf("failed to extract snapshot into %q: %w", dest, err)
	}
	// NOREPLACE: whatever appeared at dest since the check above is not
	// ours to overwrite.
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dest, unix.RENAME_NOREPLACE); err != nil {
		return stats, fmt.Errorf("failed to rename %q to %q: %w", tmp, dest, err)
	}
	return stats, nil
}

// dirMeta is what an explicit directory entry asks for, applied once
// everything below the directory exists. It holds no name: the final pass
// finds it again by inode number.
type dirMeta struct {
	mode         uint32
	uid, gid     uint32
	atime, mtime unix.Timespec
}

type extractor struct {
	rootfd     int
	rootPath   string
	chown      bool
	maxBytes   int64
	maxEntries int
	// explicit holds the directories an archive entry named, by inode
	// number; a directory created only as a parent is not in it, which
	// is how a directory entry arriving after its content is told from
	// the same directory named twice.
	explicit map[uint64]dirMeta
	stats    ExtractStats
	buf      []byte
	linkBuf  []byte
	// One directory fd is kept open because consecutive entries nearly
	// always share their parent.
	cachedDir string
	cachedFd  int
	// newFiles is what a file gets when it is created: its mode from the
	// umask, its owner from the credentials and the root. It lets file
	// skip the chmod and chown that would change nothing, which are two
	// of the few syscalls a small file costs.
	newFiles newFileAttrs
}

// newFileAttrs predicts the mode and owner of a file the extractor creates.
type newFileAttrs struct {
	// umask is the process's file mode creation mask; umaskKnown is false
	// when it could not be read, and every file is then chmod-ed.
	umask      uint32
	umaskKnown bool
	// ownerKnown says that every file created below the root belongs to
	// uid:gid (see newExtractor).
	ownerKnown bool
	uid, gid   int
}

// createMode returns the mode to create a file with for the permission
// bits perm (fileMode's result), and whether the file will have exactly
// perm once created. The sticky bit is never passed to open.
func (a newFileAttrs) createMode(perm uint32) (uint32, bool) {
	m := perm & 0o777
	return m, a.umaskKnown && m == perm && m&a.umask == 0
}

// owns reports whether a new file already has the owner uid:gid.
func (a newFileAttrs) owns(uid, gid int) bool {
	return a.ownerKnown && a.uid == uid && a.gid == gid
}

func newExtractor(dir string, opts ExtractOptions) (*extractor, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	x := &extractor{
		rootfd:     fd,
		rootPath:   dir,
		chown:      opts.Chown,
		maxBytes:   opts.MaxBytes,
		maxEntries: opts.MaxEntries,
		explicit:   make(map[uint64]dirMeta),
		buf:        make([]byte, copyBufSize),
		linkBuf:    make([]byte, maxLinkLen+1),
		cachedFd:   -1,
	}
	if x.maxBytes <= 0 {
		x.maxBytes = DefaultMaxBytes
	}
	if x.maxEntries <= 0 {
		x.maxEntries = DefaultMaxEntries
	}
	x.newFiles.umask, x.newFiles.umaskKnown = readUmask()
	if hasDefaultACL(fd) {
		// A default ACL, not the umask, trims the mode of what is
		// created below the root (which inherits it from its parent):
		// the mode is not predicted, every file is chmod-ed.
		x.newFiles.umaskKnown = false
	}
	// A new file belongs to the caller's fsuid (its euid: Go never calls
	// setfsuid) and to either its egid or, under a setgid directory or
	// the grpid mount option, its directory's group. Every directory
	// below the root is created here, with its parent's group or the
	// egid, so when the root's group is the egid both rules give the
	// egid, all the way down; otherwise nothing is predicted.
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		x.close()
		return nil, &fs.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if egid := unix.Getegid(); int(st.Gid) == egid {
		x.newFiles.ownerKnown, x.newFiles.uid, x.newFiles.gid = true, unix.Geteuid(), egid
	}
	return x, nil
}

// hasDefaultACL reports whether the directory fd carries a default POSIX
// ACL, or might (the question failed for another reason than its absence).
func hasDefaultACL(fd int) bool {
	_, err := unix.Fgetxattr(fd, "system.posix_acl_default", nil)
	return err == nil || (err != unix.ENODATA && err != unix.EOPNOTSUPP)
}

// readUmask reads the process's umask from /proc/self/status (Linux 4.7
// and later); umask(2) cannot read it without setting it, which would
// race with every other goroutine that creates a file.
func readUmask() (uint32, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(b)) {
		v, ok := strings.CutPrefix(line, "Umask:")
		if !ok {
			continue
		}
		m, err := strconv.ParseUint(strings.TrimSpace(v), 8, 32)
		if err != nil || m&^0o777 != 0 {
			return 0, false
		}
		return uint32(m), true
	}
	return 0, false
}

func (x *extractor) dropCache() {
	if x.cachedFd >= 0 {
		unix.Close(x.cachedFd)
		x.cachedFd = -1
		x.cachedDir = ""
	}
}

func (x *extractor) close() {
	x.dropCache()
	if x.rootfd >= 0 {
		unix.Close(x.rootfd)
		x.rootfd = -1
	}
}

// run reads the whole archive, then applies what had to wait for it.
func (x *extractor) run(r io.Reader) error {
	cr := &countingReader{r: r}
	tr := tar.NewReader(cr)
	for {
		before := cr.n
		hdr, err := tr.Next()
		if err == io.EOF {
			// Bodies are always read to their end before Next, so all
			// this call can have read is the last entry's padding and
			// the trailer. Less than that means the stream stopped at an
			// entry boundary, which archive/tar also reports as io.EOF.
			if cr.n-before < trailerSize || !cr.tailIsZero() {
				if cr.err != nil && cr.err != io.EOF {
					return fmt.Errorf("failed to read snapshot: %w", cr.err)
				}
				return fmt.Errorf("%w: archive truncated: no end-of-archive trailer", allocdir.ErrArchive)
			}
			break
		}
		if err != nil && !errors.Is(err, tar.ErrInsecurePath) {
			return readError(cr, "", err)
		}
		// ErrInsecurePath (GODEBUG tarinsecurepath=0) still comes with
		// the header; the name checks below refuse it with context.
		if err := x.entry(tr, hdr); err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, tr); err != nil {
			return readError(cr, hdr.Name, err)
		}
	}
	x.dropCache()
	return x.finish()
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	x.stats.Entries++
	if x.stats.Entries > x.maxEntries {
		return refuse(hdr.Name, "archive has more than %d entries", x.maxEntries)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		x.stats.Skipped++
		return nil
	}
	name, err := cleanEntryName(hdr.Name)
	if err != nil {
		return refuse(hdr.Name, "%v", err)
	}
	comps := strings.Split(name, "/")
	if len(comps) == 1 && hdr.Typeflag == tar.TypeReg && isErrorEntryName(name) {
		return senderError(tr, name)
	}
	if err := checkLayout(comps); err != nil {
		return refuse(name, "%v", err)
	}
	if err := checkType(name, hdr); err != nil {
		return err
	}
	if x.chown && (!validID(hdr.Uid) || !validID(hdr.Gid)) {
		return refuse(name, "owner %d:%d out of range", hdr.Uid, hdr.Gid)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return x.dir(name, comps, hdr)
	case tar.TypeSymlink:
		return x.symlink(name, comps, hdr)
	}
	return x.file(tr, name, comps, hdr)
}

// parent returns an fd for the directory that holds the last component
// of comps, creating missing parents. The fd belongs to the cache:
// callers must not close it and must not hold it across another parent.
// Every open refuses symbolic links and the directory is private and
// fresh, so whatever the open finds was created from this archive; a
// parent that is a link or a file fails the open.
func (x *extractor) parent(entry string, comps []string) (int, error) {
	dirs := comps[:len(comps)-1]
	// entry is comps joined by "/", so its parent is a prefix of it: no
	// copy for the cache's comparison, which nearly always hits.
	dir := ""
	if len(dirs) > 0 {
		dir = entry[:strings.LastIndexByte(entry, '/')]
	}
	if x.cachedFd >= 0 && x.cachedDir == dir {
		return x.cachedFd, nil
	}
	fd, err := allocdir.OpenBeneath(x.rootfd, dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) && len(dirs) > 0 {
		fd, err = x.makeParents(dirs)
	}
	if err != nil {
		return -1, fsError(entry, err)
	}
	x.dropCache()
	x.cachedDir, x.cachedFd = dir, fd
	return fd, nil
}

// makeParents creates the missing directories of dirs (at least one), one
// component at a time, and returns an fd of the last.
func (x *extractor) makeParents(dirs []string) (int, error) {
	cur := x.rootfd
	for i, c := range dirs {
		if err := unix.Mkdirat(cur, c, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			if cur != x.rootfd {
				unix.Close(cur)
			}
			return -1, &fs.PathError{Op: "mkdirat", Path: strings.Join(dirs[:i+1], "/"), Err: err}
		}
		next, err := allocdir.OpenBeneath(cur, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if cur != x.rootfd {
			unix.Close(cur)
		}
		if err != nil {
			return -1, err
		}
		cur = next
	}
	return cur, nil
}
