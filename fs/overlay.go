package fs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// overlay is a volume with read-only lower layers under its writable
// upper one. roots[0] is the upper layer, roots[1:] the lowers, top first.
type overlay struct {
	roots []string
	// logger hears of errors the errno boundary cannot map.
	logger hclog.Logger
}

// visible computes where rel, inside a directory visible in dirLayers, is
// visible: the layers holding it, the shown one first. For a directory
// the rest are the lower directories merged under it, down to the first
// opaque one; a non-directory is shown from one layer only. A whiteout,
// or a non-directory under a directory, hides everything below it.
func (o *overlay) visible(rel string, dirLayers []int) ([]int, syscall.Stat_t, syscall.Errno) {
	var layers []int
	var shown syscall.Stat_t
	for _, i := range dirLayers {
		var st syscall.Stat_t
		p := filepath.Join(o.roots[i], rel)
		if err := syscall.Lstat(p, &st); err != nil {
			if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
				continue
			}
			return nil, shown, toErrno(o.logger, err)
		}
		if layer.IsWhiteout(&st) || (len(layers) > 0 && !layer.IsDir(&st)) {
			break
		}
		if len(layers) == 0 {
			shown = st
		}
		layers = append(layers, i)
		if !layer.IsDir(&st) || layer.IsOpaque(p) {
			break
		}
	}
	if len(layers) == 0 {
		return nil, shown, syscall.ENOENT
	}
	return layers, shown, 0
}

// list returns the merged entries of the directory rel visible in
// dirLayers: upper names first, whiteouts and names already seen left
// out.
func (o *overlay) list(rel string, dirLayers []int) ([]fuse.DirEntry, syscall.Errno) {
	seen := make(map[string]bool)
	var out []fuse.DirEntry
	for _, i := range dirLayers {
		f, err := os.Open(filepath.Join(o.roots[i], rel))
		if err != nil {
			return nil, toErrno(o.logger, err)
		}
		entries, err := f.ReadDir(-1)
		f.Close()
		if err != nil {
			return nil, toErrno(o.logger, err)
		}
		for _, e := range entries {
			name := e.Name()
			if seen[name] {
				continue
			}
			seen[name] = true
			if e.Type()&os.ModeCharDevice != 0 {
				if fi, err := e.Info(); err == nil {
					if st, ok := fi.Sys().(*syscall.Stat_t); ok && layer.IsWhiteout(st) {
						continue
					}
				}
			}
			out = append(out, fuse.DirEntry{Name: name, Mode: fileTypeBits(e.Type())})
		}
	}
	return out, 0
}

// fileTypeBits turns a directory entry's type into st_mode type bits.
func fileTypeBits(t os.FileMode) uint32 {
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

// rel is the node's path inside its volume ("" for the root).
func (n *volNode) rel() string {
	return n.EmbeddedInode().Path(n.RootData.RootNode.EmbeddedInode())
}

// nodeLayers returns where the node is visible; for a node of a volume
// without lowers, the upper layer.
func (n *volNode) nodeLayers() []int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.layers
}

// lowerOnly reports whether the node's entry is shown from a lower layer:
// it has not been copied up.
func (n *volNode) lowerOnly() bool {
	if n.ovl == nil {
		return false
	}
	l := n.nodeLayers()
	return len(l) > 0 && l[0] != 0
}

// shownPath is the backing path of the layer the node is shown from.
func (n *volNode) shownPath() string {
	return filepath.Join(n.ovl.roots[n.nodeLayers()[0]], n.rel())
}

// openShown opens the node's entry in the layer it is shown from, never
// following a symbolic link on the way: a task that swaps a directory for
// a link to /etc between lookup and open gets an error, not /etc.
func (n *volNode) openShown(flags int) (int, error) {
	return openInLayer(n.ovl.roots[n.nodeLayers()[0]], n.rel(), flags)
}

// openInLayer opens rel beneath the layer root with openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS.
func openInLayer(root, rel string, flags int) (int, error) {
	dir, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dir)
	if rel == "" {
		rel = "."
	}
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC | unix.O_NOFOLLOW), Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
	for {
		fd, err := unix.Openat2(dir, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// ovlLookup finds name in a directory of an overlay volume.
func (n *volNode) ovlLookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	layers, st, errno := n.ovl.visible(filepath.Join(n.rel(), name), n.nodeLayers())
	if errno != 0 {
		return nil, errno
	}
	if layers[0] == 0 {
		// In the upper layer: the loopback's lookup gives the node the
		// identity (inode number and generation) its creation gave it, so
		// an open file and its name stay one inode for the kernel.
		ch, errno := n.LoopbackNode.Lookup(ctx, name, out)
		if errno != 0 {
			return nil, errno
		}
		if c, ok := ch.Operations().(*volNode); ok {
			c.mu.Lock()
			c.layers = layers
			c.mu.Unlock()
		}
		return ch, 0
	}
	out.Attr.FromStat(&st)
	ino := st.Ino ^ n.slot<<viewShift
	out.Attr.Ino = ino
	child := &volNode{LoopbackNode: &gofs.LoopbackNode{RootData: n.RootData}, m: n.m, slot: n.slot, ro: n.ro, ovl: n.ovl, layers: layers}
	return n.NewInode(ctx, child, gofs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: ino}), 0
}

// ovlOpendir lists a directory of an overlay volume.
func (n *volNode) ovlOpendir() (gofs.FileHandle, uint32, syscall.Errno) {
	entries, errno := n.ovl.list(n.rel(), n.nodeLayers())
	if errno != 0 {
		return nil, 0, errno
	}
	return &listDir{entries: withDots(n.EmbeddedInode(), entries)}, 0, 0
}

// copyUp makes the node's entry exist in the upper layer, copying it
// (and its parents) from the lower layer it is shown from. A directory
// copied up still merges with its lowers; a file is cloned where the
// backing filesystem can (FICLONE), copied otherwise, into a temporary
// name that is renamed into place, so a crash never leaves half a file
// under the real name.
func (n *volNode) copyUp() syscall.Errno {
	if !n.lowerOnly() {
		return 0
	}
	if _, parent := n.Parent(); parent != nil {
		if p, ok := parent.Operations().(*volNode); ok && p.ovl == n.ovl {
			if errno := p.copyUp(); errno != 0 {
				return errno
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.layers) > 0 && n.layers[0] == 0 {
		return 0 // copied up while we waited
	}
	rel := n.rel()
	src := filepath.Join(n.ovl.roots[n.layers[0]], rel)
	dst := filepath.Join(n.ovl.roots[0], rel)
	if err := copyEntry(n.ovl.roots[n.layers[0]], rel, dst); err != nil {
		n.m.logger.Error("copy-up failed", "from", src, "to", dst, "error", err)
		return toErrno(n.m.logger, err)
	}
	if isDirPath(dst) {
		n.layers = append([]int{0}, n.layers...)
	} else {
		n.layers = []int{0}
	}
	return 0
}

func isDirPath(p string) bool {
	var st syscall.Stat_t
	return syscall.Lstat(p, &st) == nil && layer.IsDir(&st)
}

// copyEntry copies one entry (not a directory's content) from src to dst,
// with its mode, owner and times. An entry already at dst is kept: it was
// copied up by an earlier call.
func copyEntry(srcRoot, rel, dst string) error {
	src := filepath.Join(srcRoot, rel)
	var st syscall.Stat_t
	if err := syscall.Lstat(src, &st); err != nil {
		return err
	}
	var dstSt syscall.Stat_t
	if err := syscall.Lstat(dst, &dstSt); err == nil && !layer.IsWhiteout(&dstSt) {
		return nil
	} else if err == nil {
		if err := syscall.Unlink(dst); err != nil {
			return err
		}
	}
	perm := st.Mode & 07777
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		if err := syscall.Mkdir(dst, perm); err != nil {
			return err
		}
	case syscall.S_IFREG:
		if err := copyFile(srcRoot, rel, dst, perm); err != nil {
			return err
		}
	case syscall.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
	default:
		if err := syscall.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		// chown cleared set-id bits: put the mode back.
		if err := syscall.Chmod(dst, perm); err != nil {
			return err
		}
	}
	// After the chown, which would drop security.capability.
	if err := layer.CopyXattrs(src, dst); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// copyFile copies a regular file's bytes into an unnamed file (O_TMPFILE)
// in dst's directory and links it in under dst only once complete, so a
// crash never leaves a partial file, or a temporary name, behind. Where
// the filesystem has no O_TMPFILE it falls back to a temporary name that
// is renamed into place.
func copyFile(srcRoot, rel, dst string, perm uint32) (err error) {
	fd, err := openInLayer(srcRoot, rel, unix.O_RDONLY)
	if err != nil {
		return err
	}
	in := os.NewFile(uintptr(fd), filepath.Join(srcRoot, rel))
	defer in.Close()
	fill := func(out *os.File) error {
		if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) != nil {
			return copySparse(out, in)
		}
		return nil
	}
	tfd, err := unix.Open(filepath.Dir(dst), unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, perm&0o777)
	if err == nil {
		out := os.NewFile(uintptr(tfd), dst)
		defer out.Close()
		if err := fill(out); err != nil {
			return err
		}
		return unix.Linkat(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", tfd), unix.AT_FDCWD, dst, unix.AT_SYMLINK_FOLLOW)
	}
	if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EISDIR) {
		return err
	}
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(dst), ".allocfs-copyup-"+hex.EncodeToString(suffix[:]))
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, os.FileMode(perm&0o777))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if err := fill(out); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
}

// copySparse copies in's bytes into out, the empty file of a copy-up,
// segment by segment between holes (SEEK_DATA, SEEK_HOLE), so that a
// sparse file stays sparse and the copy costs what the file holds, not
// its size; the size is set at the end, which keeps a trailing hole.
// Segments go by copy_file_range, which the filesystem may turn into a
// copy without reading the data through user space.
func copySparse(out, in *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			// No SEEK_DATA here: everything is data.
			data = off
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = size
		}
		if err := copyRange(ofd, ifd, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyRange copies n bytes at off of ifd to the same offset of ofd, by
// copy_file_range where the kernel can, else through a buffer.
func copyRange(ofd, ifd int, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(ifd, &roff, ofd, &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeBuffered(ofd, ifd, roff, n)
			}
			return err
		}
		if c == 0 {
			return io.ErrUnexpectedEOF // the file shrank under the copy
		}
		n -= int64(c)
	}
	return nil
}

func copyRangeBuffered(ofd, ifd int, off, n int64) error {
	buf := make([]byte, min(n, 1<<20))
	for n > 0 {
		r, err := unix.Pread(ifd, buf[:min(n, int64(len(buf)))], off)
		if err != nil {
			return err
		}
		if r == 0 {
			return io.ErrUnexpectedEOF
		}
		if _, err := unix.Pwrite(ofd, buf[:r], off); err != nil {
			return err
		}
		off += int64(r)
		n -= int64(r)
	}
	return nil
}

// copyUpTree copies a directory up with everything its lowers show in
// it, and makes it opaque: after a rename it no longer sits over the same
// lower paths, so it must not merge with anything below. Live child nodes
// are told their entries are in the upper layer now.
func (n *volNode) copyUpTree() syscall.Errno {
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	layers := n.nodeLayers()
	if len(layers) <= 1 {
		return 0
	}
	rel := n.rel()
	if err := n.ovl.materialize(rel, layers); err != nil {
		n.m.logger.Error("copy-up of a directory tree failed", "path", rel, "error", err)
		return toErrno(n.m.logger, err)
	}
	n.mu.Lock()
	n.layers = []int{0}
	n.mu.Unlock()
	var reset func(in *gofs.Inode)
	reset = func(in *gofs.Inode) {
		for _, ch := range in.Children() {
			if c, ok := ch.Operations().(*volNode); ok && c.ovl == n.ovl {
				c.mu.Lock()
				c.layers = []int{0}
				c.mu.Unlock()
				reset(ch)
			}
		}
	}
	reset(n.EmbeddedInode())
	return 0
}

// materialize copies into the upper layer every entry visible at rel
// (a directory present in the upper layer and merged over layers[1:]),
// recursively, and marks each directory opaque.
func (o *overlay) materialize(rel string, layers []int) error {
	entries, errno := o.list(rel, layers)
	if errno != 0 {
		return errno
	}
	for _, e := range entries {
		childRel := filepath.Join(rel, e.Name)
		childLayers, _, errno := o.visible(childRel, layers)
		if errno != 0 {
			return errno
		}
		if childLayers[0] != 0 {
			if err := copyEntry(o.roots[childLayers[0]], childRel, filepath.Join(o.roots[0], childRel)); err != nil {
				return err
			}
			if e.Mode == syscall.S_IFDIR {
				childLayers = append([]int{0}, childLayers...)
			}
		}
		if e.Mode == syscall.S_IFDIR && len(childLayers) > 1 {
			if err := o.materialize(childRel, childLayers); err != nil {
				return err
			}
		}
	}
	return layer.MarkOpaque(filepath.Join(o.roots[0], rel))
}

// inLowers reports whether name in the directory n is visible from a
// lower layer, so that removing or renaming it needs a whiteout.
func (n *volNode) inLowers(name string) bool {
	var lowers []int
	for _, i := range n.nodeLayers() {
		if i != 0 {
			lowers = append(lowers, i)
		}
	}
	if len(lowers) == 0 {
		return false
	}
	_, _, errno := n.ovl.visible(filepath.Join(n.rel(), name), lowers)
	return errno == 0
}

// whiteout hides name of the directory n (copied up) in the lower layers.
func (n *volNode) whiteout(name string) syscall.Errno {
	p := filepath.Join(n.ovl.roots[0], n.rel(), name)
	if err := syscall.Mknod(p, syscall.S_IFCHR, 0); err != nil {
		return toErrno(n.m.logger, err)
	}
	return 0
}

// clearWhiteout removes a whiteout at name of the directory n before an
// entry is created there, and reports whether there was one.
func (n *volNode) clearWhiteout(name string) (bool, syscall.Errno) {
	p := filepath.Join(n.ovl.roots[0], n.rel(), name)
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil || !layer.IsWhiteout(&st) {
		return false, 0
	}
	if err := syscall.Unlink(p); err != nil {
		return false, toErrno(n.m.logger, err)
	}
	return true, 0
}

// prepareCreate readies the directory n of an overlay volume for a new
// entry at name: the directory is copied up and a whiteout there is
// removed. It reports whether the name hid something in a lower layer.
func (n *volNode) prepareCreate(name string) (bool, syscall.Errno) {
	if errno := n.copyUp(); errno != 0 {
		return false, errno
	}
	hidden, errno := n.clearWhiteout(name)
	if errno != 0 {
		return false, errno
	}
	return hidden || n.inLowers(name), 0
}

// removeEntry deletes name from the directory n of an overlay volume:
// from the upper layer if it is there, and with a whiteout if a lower
// layer shows it too. rmdir refuses a directory whose merged view is not
// empty.
func (n *volNode) removeEntry(name string, dir bool) syscall.Errno {
	rel := filepath.Join(n.rel(), name)
	layers, st, errno := n.ovl.visible(rel, n.nodeLayers())
	if errno != 0 {
		return errno
	}
	if dir != layer.IsDir(&st) {
		if dir {
			return syscall.ENOTDIR
		}
		return syscall.EISDIR
	}
	if dir {
		entries, errno := n.ovl.list(rel, layers)
		if errno != 0 {
			return errno
		}
		if len(entries) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	if errno := n.copyUp(); errno != 0 {
		return errno
	}
	lower := n.inLowers(name)
	if layers[0] == 0 {
		upper := filepath.Join(n.ovl.roots[0], rel)
		var err error
		if dir {
			// Only whiteouts can be left in a merged-empty directory.
			if err = clearDir(upper); err == nil {
				err = syscall.Rmdir(upper)
			}
		} else {
			err = syscall.Unlink(upper)
		}
		if err != nil {
			return toErrno(n.m.logger, err)
		}
	}
	if lower {
		return n.whiteout(name)
	}
	return 0
}

// clearDir removes the whiteouts left in an upper directory.
func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// ovlRename renames within an overlay volume: the source is copied up
// (a directory with everything its lowers show, and made opaque), the
// target directory is copied up, the rename happens in the upper layer,
// and the old name is whited out if a lower layer still shows it.
func (n *volNode) ovlRename(ctx context.Context, name string, dst *volNode, newName string, flags uint32) syscall.Errno {
	child := n.GetChild(name)
	if child == nil {
		var out fuse.EntryOut
		var errno syscall.Errno
		if child, errno = n.ovlLookup(ctx, name, &out); errno != 0 {
			return errno
		}
	}
	src, ok := child.Operations().(*volNode)
	if !ok {
		return syscall.EXDEV
	}
	if errno := dst.checkRename(src, newName, flags); errno != 0 {
		return errno
	}
	if dst == n && newName == name {
		return 0 // renamed onto itself: nothing to do, as rename(2) says
	}
	if errno := src.copyUpTree(); errno != 0 {
		return errno
	}
	if flags&renameExchange != 0 {
		other := dst.GetChild(newName)
		if other == nil {
			var out fuse.EntryOut
			var errno syscall.Errno
			if other, errno = dst.ovlLookup(ctx, newName, &out); errno != 0 {
				return errno
			}
		}
		if o, ok := other.Operations().(*volNode); ok {
			if errno := o.copyUpTree(); errno != 0 {
				return errno
			}
		}
		return n.backingRename(name, dst, newName, flags)
	}
	if errno := dst.copyUp(); errno != 0 {
		return errno
	}
	// A target that a lower layer shows: a directory must be empty in
	// the merged view, and whatever is replaced is hidden by the renamed
	// entry (a directory is opaque after copyUpTree).
	if layers, st, errno := dst.ovl.visible(filepath.Join(dst.rel(), newName), dst.nodeLayers()); errno == 0 && layer.IsDir(&st) {
		entries, errno := dst.ovl.list(filepath.Join(dst.rel(), newName), layers)
		if errno != 0 {
			return errno
		}
		if len(entries) > 0 {
			return syscall.ENOTEMPTY
		}
		if layers[0] == 0 {
			if err := clearDir(filepath.Join(dst.ovl.roots[0], dst.rel(), newName)); err != nil {
				return toErrno(n.m.logger, err)
			}
		}
	}
	if _, errno := dst.clearWhiteout(newName); errno != 0 {
		return errno
	}
	oldLower := n.inLowers(name)
	if errno := n.backingRename(name, dst, newName, flags); errno != 0 {
		return errno
	}
	if oldLower {
		return n.whiteout(name)
	}
	return 0
}

// checkRename answers, before anything is copied up, every error a rename
// of src onto newName in this directory can get from the target, with
// ext4's errnos: a failing rename must change nothing.
func (n *volNode) checkRename(src *volNode, newName string, flags uint32) syscall.Errno {
	rel := filepath.Join(n.rel(), newName)
	layers, st, errno := n.ovl.visible(rel, n.nodeLayers())
	exists := errno == 0
	if errno != 0 && errno != syscall.ENOENT {
		return errno
	}
	switch {
	case flags&renameNoReplace != 0 && exists:
		return syscall.EEXIST
	case flags&renameExchange != 0 && !exists:
		return syscall.ENOENT
	case flags&renameExchange != 0 || !exists:
		return 0
	}
	srcDir := src.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR
	switch {
	case srcDir && !layer.IsDir(&st):
		return syscall.ENOTDIR
	case !srcDir && layer.IsDir(&st):
		return syscall.EISDIR
	case srcDir && src.EmbeddedInode() != n.GetChild(newName):
		entries, errno := n.ovl.list(rel, layers)
		if errno != 0 {
			return errno
		}
		if len(entries) > 0 {
			return syscall.ENOTEMPTY
		}
	}
	return 0
}

// backingRename renames name in this directory to newName in dst on the
// upper layer, where copyUp has put both. go-fuse's loopback would do it
// for a rename with flags through fds of the two directories, after
// checking that their inode numbers are still the nodes' own; a node
// shown from a lower layer keeps the lower inode's number after its
// copy-up, so that check answered EBUSY.
func (n *volNode) backingRename(name string, dst *volNode, newName string, flags uint32) syscall.Errno {
	err := unix.Renameat2(unix.AT_FDCWD, filepath.Join(n.backingPath(), name),
		unix.AT_FDCWD, filepath.Join(dst.backingPath(), newName), uint(flags))
	return toErrno(n.m.logger, err)
}
