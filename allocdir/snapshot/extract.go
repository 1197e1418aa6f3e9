//go:build linux

package snapshot

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"

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

// readError classifies a failure of the tar reader: a failing source is
// the transport's fault, anything else is the archive's.
func readError(cr *countingReader, name string, err error) error {
	if cr.err != nil && cr.err != io.EOF {
		if name == "" {
			return fmt.Errorf("failed to read snapshot: %w", err)
		}
		return fmt.Errorf("failed to read snapshot entry %q: %w", shortName(name), err)
	}
	what := "corrupt archive"
	if errors.Is(err, io.ErrUnexpectedEOF) {
		what = "archive truncated"
	}
	if name == "" {
		return fmt.Errorf("%w: %s: %w", allocdir.ErrArchive, what, err)
	}
	return fmt.Errorf("%w: entry %q: %s: %w", allocdir.ErrArchive, shortName(name), what, err)
}

// shortName is an entry's name as error messages show it: whole up to
// 256 bytes, longer names (they may run to maxNameLen) by their two ends.
func shortName(name string) string {
	const end = 120
	if len(name) <= 2*end+16 {
		return name
	}
	return fmt.Sprintf("%s...[%d bytes]...%s", name[:end], len(name)-2*end, name[len(name)-end:])
}

func refuse(name, format string, args ...any) error {
	return fmt.Errorf("%w: entry %q: %s", allocdir.ErrArchive, shortName(name), fmt.Sprintf(format, args...))
}

func refuseType(name, what string) error {
	return fmt.Errorf("%w: entry %q: %w: %s", allocdir.ErrArchive, shortName(name), ErrEntryType, what)
}

func refuseDuplicate(name string, err error) error {
	return fmt.Errorf("%w: entry %q: duplicate entry (the name was already extracted): %w", allocdir.ErrArchive, shortName(name), err)
}

// paxSparsePrefix starts the PAX records of every GNU sparse format
// (0.0, 0.1 and 1.0).
const paxSparsePrefix = "GNU.sparse."

// checkType refuses what no snapshot writer produces. Nomad's writer and
// Write only ever write directories, regular files and symbolic
// links, each name as itself.
func checkType(name string, hdr *tar.Header) error {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, paxSparsePrefix) {
			return refuseType(name, fmt.Sprintf("sparse file (PAX record %q)", k))
		}
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink:
		return nil
	case tar.TypeGNUSparse:
		return refuseType(name, "sparse file (GNU format)")
	case tar.TypeLink:
		return refuseType(name, fmt.Sprintf("hard link to %q", hdr.Linkname))
	case tar.TypeFifo:
		return refuseType(name, "FIFO")
	case tar.TypeChar, tar.TypeBlock:
		return refuseType(name, "device node")
	}
	return refuseType(name, fmt.Sprintf("type %q", hdr.Typeflag))
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

// validID admits what a uid_t holds, except -1, which chown reads as
// "leave it alone".
func validID(id int) bool { return id >= 0 && id < math.MaxUint32 }

func isErrorEntryName(name string) bool {
	return len(name) >= len("NOMAD--ERROR.log") &&
		strings.HasPrefix(name, "NOMAD-") && strings.HasSuffix(name, "-ERROR.log")
}

// senderError turns the sender's error entry into the refusal it means.
func senderError(tr *tar.Reader, name string) error {
	body, err := io.ReadAll(io.LimitReader(tr, maxErrorBody))
	if err != nil {
		return fmt.Errorf("%w: entry %q: sender reported an error that could not be read: %w", allocdir.ErrArchive, shortName(name), err)
	}
	msg := strings.TrimSpace(strings.ToValidUTF8(string(body), string(utf8.RuneError)))
	return refuse(name, "sender reported: %s", msg)
}

// cleanEntryName checks a raw entry name and returns it cleaned. A ".."
// is refused wherever it appears, even where it would clean away: such a
// name is never produced by a sender, only crafted.
func cleanEntryName(raw string) (string, error) {
	switch {
	case raw == "":
		return "", errors.New("empty name")
	case len(raw) > maxNameLen:
		return "", fmt.Errorf("name longer than %d bytes", maxNameLen)
	case strings.IndexByte(raw, 0) >= 0:
		return "", errors.New("name contains NUL")
	case strings.HasPrefix(raw, "/"):
		return "", errors.New("absolute name")
	}
	for _, c := range strings.Split(raw, "/") {
		if c == ".." {
			return "", errors.New(`name contains ".."`)
		}
	}
	name := path.Clean(raw)
	if name == "." {
		return "", errors.New("name is the archive root")
	}
	return name, nil
}

// checkLayout admits only what a snapshot can hold: alloc/data and every
// task's local/, plus the directories above them.
func checkLayout(comps []string) error {
	top := comps[0]
	if top == allocdir.SharedAllocName {
		if len(comps) == 1 || comps[1] == allocdir.SharedDataName {
			return nil
		}
		return fmt.Errorf("outside %s/%s", allocdir.SharedAllocName, allocdir.SharedDataName)
	}
	if err := allocdir.ValidName(top); err != nil {
		return err
	}
	if len(comps) == 1 || comps[1] == allocdir.TaskLocal {
		return nil
	}
	return fmt.Errorf("outside %s/%s", top, allocdir.TaskLocal)
}

// fsError classifies a failed filesystem call: a link or a non-directory
// in the way can only come from the archive, anything else (ENOSPC, EIO,
// EPERM) is this node's problem.
func fsError(entry string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return fmt.Errorf("%w: entry %q: path runs through a symbolic link: %w", allocdir.ErrArchive, shortName(entry), err)
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("%w: entry %q: parent is not a directory: %w", allocdir.ErrArchive, shortName(entry), err)
	case errors.Is(err, unix.EEXIST):
		return refuseDuplicate(entry, err)
	}
	return fmt.Errorf("failed to extract entry %q: %w", shortName(entry), err)
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

// fileMode keeps the permission and sticky bits of a header mode and
// drops setuid and setgid (see Extract).
func fileMode(m int64) uint32 { return uint32(m) & (0o777 | unix.S_ISVTX) }

func (x *extractor) dir(name string, comps []string, hdr *tar.Header) error {
	pfd, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	base := comps[len(comps)-1]
	existed := false
	if err := unix.Mkdirat(pfd, base, 0o700); errors.Is(err, unix.EEXIST) {
		existed = true
	} else if err != nil {
		return fsError(name, &fs.PathError{Op: "mkdirat", Path: name, Err: err})
	}
	fd, err := allocdir.OpenBeneath(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		if existed {
			// A file or a link of that name came first.
			return refuseDuplicate(name, err)
		}
		return fsError(name, err)
	}
	var st unix.Stat_t
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("failed to stat %q: %w", name, err)
	}
	if _, dup := x.explicit[st.Ino]; dup {
		return refuseDuplicate(name, unix.EEXIST)
	}
	x.explicit[st.Ino] = dirMeta{
		mode:  fileMode(hdr.Mode),
		uid:   uint32(hdr.Uid),
		gid:   uint32(hdr.Gid),
		atime: timespec(hdr.AccessTime),
		mtime: timespec(hdr.ModTime),
	}
	x.stats.Dirs++
	return nil
}

func (x *extractor) file(tr *tar.Reader, name string, comps []string, hdr *tar.Header) error {
	if hdr.Size > x.maxBytes-x.stats.Bytes {
		return refuse(name, "archive holds more than %d bytes of file content", x.maxBytes)
	}
	pfd, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	base := comps[len(comps)-1]
	// Created with its final permissions, which the private root keeps
	// from anyone else until the archive is accepted; a write-protected
	// mode does not stop this fd from writing.
	perm := fileMode(hdr.Mode)
	createMode, exact := x.newFiles.createMode(perm)
	fd, err := allocdir.OpenBeneath(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, createMode)
	if err != nil {
		return fsError(name, err)
	}
	err = x.fillFile(fd, tr, name, hdr, perm, exact)
	if cerr := unix.Close(fd); cerr != nil && err == nil {
		err = fmt.Errorf("failed to write %q: %w", name, cerr)
	}
	if err != nil {
		return err
	}
	x.stats.Files++
	return nil
}

// fillFile writes the body of a file just created as fd, then its owner,
// mode and times, all through fd: nothing is resolved by name again.
func (x *extractor) fillFile(fd int, tr *tar.Reader, name string, hdr *tar.Header, perm uint32, exact bool) error {
	n, err := x.copyBody(fd, tr, name)
	x.stats.Bytes += n
	if err != nil {
		return err
	}
	if x.chown && !x.newFiles.owns(hdr.Uid, hdr.Gid) {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("failed to chown %q: %w", name, err)
		}
		// chown may have dropped bits fchmod is asked to set.
		exact = false
	}
	if !exact {
		if err := unix.Fchmod(fd, perm); err != nil {
			return fmt.Errorf("failed to chmod %q: %w", name, err)
		}
	}
	// Last: every write before it would move the mtime.
	if err := futimens(fd, hdr.AccessTime, hdr.ModTime); err != nil {
		return fmt.Errorf("failed to set times of %q: %w", name, err)
	}
	return nil
}

// copyBody copies the current entry's body into fd, telling a short or
// broken archive (the sender's fault) from a failed write (ours). The fd
// is written directly: an *os.File would cost an fcntl per file.
func (x *extractor) copyBody(fd int, tr *tar.Reader, name string) (int64, error) {
	var written int64
	for {
		n, rerr := tr.Read(x.buf)
		if n > 0 {
			if err := writeAll(fd, x.buf[:n]); err != nil {
				return written, fmt.Errorf("failed to write %q: %w", name, err)
			}
			written += int64(n)
		}
		if rerr == io.EOF {
			return written, nil
		}
		if rerr != nil {
			if errors.Is(rerr, io.ErrUnexpectedEOF) {
				return written, fmt.Errorf("%w: entry %q: archive truncated: body shorter than %d bytes: %w", allocdir.ErrArchive, name, written, rerr)
			}
			return written, fmt.Errorf("failed to read body of entry %q: %w", name, rerr)
		}
	}
}

// writeAll writes b to the blocking fd, retrying short writes and EINTR.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrShortWrite
		}
		b = b[n:]
	}
	return nil
}

func (x *extractor) symlink(name string, comps []string, hdr *tar.Header) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return refuse(name, "symbolic link with empty target")
	case len(target) > maxLinkLen:
		return refuse(name, "symbolic link target longer than %d bytes", maxLinkLen)
	case strings.IndexByte(target, 0) >= 0:
		return refuse(name, "symbolic link target contains NUL")
	case path.IsAbs(target):
		return refuse(name, "symbolic link to absolute path %q", target)
	}
	if j := path.Join(path.Dir(name), target); j == ".." || strings.HasPrefix(j, "../") {
		return refuse(name, "symbolic link target %q leads outside the archive root", target)
	}
	pfd, err := x.parent(name, comps)
	if err != nil {
		return err
	}
	base := comps[len(comps)-1]
	if err := unix.Symlinkat(target, pfd, base); err != nil {
		return fsError(name, &fs.PathError{Op: "symlinkat", Path: name, Err: err})
	}
	if x.chown {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("failed to chown %q: %w", name, err)
		}
	}
	if err := setTimes(pfd, base, hdr.AccessTime, hdr.ModTime); err != nil {
		return fmt.Errorf("failed to set times of %q: %w", name, err)
	}
	x.stats.Symlinks++
	return nil
}

// walkBatch is how many entries the final pass reads from a directory at
// a time. The pass holds, per level of depth, one open directory and one
// batch, whatever a directory holds: at most PATH_MAX/2 levels of a few
// KiB each.
const walkBatch = 16

// finish walks the extracted tree depth first. It checks, through the
// archive's own links, every link whose target climbs: the lexical check
// of each link alone misses a chain such as a/s -> ../.. (the root, fine)
// and a/t -> s/../../x (fine lexically, but the kernel climbs from where s
// leads, which is out). Links without ".." only descend from where their
// parent really is, so they stay inside when every link they pass through
// does; a loop is not an escape, the kernel gives up on it too. It also
// sets the mode, owner and times of every directory once nothing more
// will be created in it (creating an entry changes the parent's mtime,
// and a read-only mode would stop a non-root caller from filling it):
// children first, so that no parent is locked before they are done.
func (x *extractor) finish() error {
	fd, err := allocdir.OpenBeneath(x.rootfd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("failed to open the extracted tree: %w", err)
	}
	res := allocdir.Resolver{Readlink: func(p string) (string, bool, error) {
		return allocdir.ReadlinkBeneath(x.rootfd, p)
	}}
	return x.walk(fd, "", res)
}

// walk visits the directory fd (named rel, "" for the root), which it
// closes.
func (x *extractor) walk(fd int, rel string, res allocdir.Resolver) error {
	// Named by its host path: where the filesystem does not report entry
	// types, ReadDir lstats each entry by that name. Every component of
	// it was opened without following links.
	d := os.NewFile(uintptr(fd), filepath.Join(x.rootPath, rel))
	defer d.Close()
	for {
		entries, rerr := d.ReadDir(walkBatch)
		for _, e := range entries {
			child := e.Name()
			if rel != "" {
				child = rel + "/" + child
			}
			switch typ := e.Type(); {
			case typ.IsDir():
				cfd, err := allocdir.OpenBeneath(fd, e.Name(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
				if err != nil {
					return fsError(child, err)
				}
				if err := x.walk(cfd, child, res); err != nil {
					return err
				}
			case typ&fs.ModeSymlink != 0:
				if err := x.checkClimb(fd, e.Name(), child, res); err != nil {
					return err
				}
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return fmt.Errorf("failed to list %q: %w", rel, rerr)
		}
	}
	if rel == "" {
		// The root's mode is Extract's to set, once accepted.
		return nil
	}
	return x.applyDirMeta(fd, rel)
}

// checkClimb refuses the link name (in dirfd, named child from the root)
// if its target climbs out of the root through the archive's links.
func (x *extractor) checkClimb(dirfd int, name, child string, res allocdir.Resolver) error {
	n, err := unix.Readlinkat(dirfd, name, x.linkBuf)
	if err != nil {
		return fmt.Errorf("failed to read link %q: %w", child, err)
	}
	target := string(x.linkBuf[:n])
	if !slices.Contains(strings.Split(target, "/"), "..") {
		return nil
	}
	if _, err := res.Resolve(child, true); errors.Is(err, allocdir.ErrEscapes) {
		return refuse(child, "symbolic link target %q leads outside the archive root through other links", target)
	}
	return nil
}

// applyDirMeta gives the directory fd what its entry asked for, or, for a
// directory created only as a parent, the layout's mode.
func (x *extractor) applyDirMeta(fd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("failed to stat %q: %w", name, err)
	}
	m, explicit := x.explicit[st.Ino]
	if !explicit {
		if err := unix.Fchmod(fd, uint32(allocdir.AllocDirMode.Perm())); err != nil {
			return fmt.Errorf("failed to chmod %q: %w", name, err)
		}
		return nil
	}
	delete(x.explicit, st.Ino)
	if x.chown {
		if err := unix.Fchown(fd, int(m.uid), int(m.gid)); err != nil {
			return fmt.Errorf("failed to chown %q: %w", name, err)
		}
	}
	if err := unix.Fchmod(fd, m.mode); err != nil {
		return fmt.Errorf("failed to chmod %q: %w", name, err)
	}
	if m.atime.Nsec == unix.UTIME_OMIT && m.mtime.Nsec == unix.UTIME_OMIT {
		return nil
	}
	if err := unix.UtimesNanoAt(fd, ".", []unix.Timespec{m.atime, m.mtime}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("failed to set times of %q: %w", name, err)
	}
	return nil
}

// setTimes sets the times of name in dirfd without following a link. A
// zero time is left alone rather than set to year 1.
func setTimes(dirfd int, name string, atime, mtime time.Time) error {
	if atime.IsZero() && mtime.IsZero() {
		return nil
	}
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// futimens sets the times of the open file fd, leaving a zero time alone.
func futimens(fd int, atime, mtime time.Time) error {
	if atime.IsZero() && mtime.IsZero() {
		return nil
	}
	ts := [2]unix.Timespec{timespec(atime), timespec(mtime)}
	// utimensat with a NULL path is futimens: it acts on fd itself.
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Nsec: unix.UTIME_OMIT}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// countingReader counts what the tar reader consumed, keeps the last
// trailerSize bytes of it and remembers the source's first error, which
// is what makes a missing trailer and a failing source detectable.
type countingReader struct {
	r    io.Reader
	n    int64
	tail []byte
	err  error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n += int64(n)
		c.remember(p[:n])
	}
	if err != nil && c.err == nil {
		c.err = err
	}
	return n, err
}

func (c *countingReader) remember(b []byte) {
	if len(b) >= trailerSize {
		c.tail = append(c.tail[:0], b[len(b)-trailerSize:]...)
		return
	}
	if keep := trailerSize - len(b); len(c.tail) > keep {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-keep:]...)
	}
	c.tail = append(c.tail, b...)
}

func (c *countingReader) tailIsZero() bool {
	return len(c.tail) == trailerSize && bytes.Count(c.tail, []byte{0}) == trailerSize
}
