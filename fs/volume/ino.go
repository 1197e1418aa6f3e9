package volume

import (
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

const (
	// MaxNameLen is NAME_MAX of the backing filesystems we support; the
	// kernel only checks 1024 bytes, so every name-taking handler checks.
	MaxNameLen = 255

	// ViewShift places the slot of the place a volume is shown (the
	// tree's identity.go) in the high bits of the inode numbers it shows,
	// so that one backing inode shown in two places is two nodes.
	ViewShift = 48
)

// RootIno is the mount root's inode number, FUSE's root node ID.
const RootIno = fuse.FUSE_ROOT_ID

// InoOf is the inode number stat shows for n.
func InoOf(n *gofs.Inode) uint64 {
	if n.IsRoot() {
		return RootIno
	}
	return n.StableAttr().Ino
}

// WithDots puts "." and ".." before entries, the directory n's own and
// its parent's, as every listing of a local filesystem has them: tools
// that count a directory's entries, or walk by "..", expect them.
func WithDots(n *gofs.Inode, entries []fuse.DirEntry) []fuse.DirEntry {
	self := InoOf(n)
	parent := self
	if _, p := n.Parent(); p != nil {
		parent = InoOf(p)
	}
	return append([]fuse.DirEntry{
		{Name: ".", Mode: syscall.S_IFDIR, Ino: self},
		{Name: "..", Mode: syscall.S_IFDIR, Ino: parent},
	}, entries...)
}
