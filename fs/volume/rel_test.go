package volume

import (
	"context"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/allocfs/allocfs/fs/layer"

	gofs "github.com/hanwen/go-fuse/v2/fs"
)

// TestRelUnderARootMadeAnew builds, without a mount, what go-fuse holds
// when the kernel forgot a volume root before a directory below it and
// looked the directory up again through a root made anew: the old node
// under the new root's parents. Its path is the one below the new root,
// and a seal of the new root freezes it; under a root of other layers it
// is no path of the volume.
func TestRelUnderARootMadeAnew(t *testing.T) {
	ctx := context.Background()
	top := &gofs.Inode{}
	gofs.NewNodeFS(top, &gofs.Options{})
	ino := uint64(10)
	dir := func(parent *gofs.Inode, name string, n *Node) *Node {
		ino++
		ch := parent.NewInode(ctx, n, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino})
		if !parent.AddChild(name, ch, true) {
			t.Fatalf("%s not added", name)
		}
		return n
	}
	root := func(roots ...string) *Node {
		r := &Node{st: &layer.Stack{Roots: roots}, slot: 1, alloc: "a1", ro: new(atomic.Bool)}
		r.vroot = r.EmbeddedInode()
		return dir(top, "box", r)
	}
	child := func(parent *Node, name string) *Node {
		return dir(parent.EmbeddedInode(), name, parent.newChild([]int{1}))
	}

	old := root("/upper", "/host")
	g := child(child(old, "usr"), "share")
	if got := g.rel(); got != "usr/share" {
		t.Fatalf("rel under its own root: %q", got)
	}

	// The kernel forgot the root first: the next lookups make a new
	// one (a new stack of the same layers), and go-fuse gives the old
	// node of share to the new usr.
	again := root("/upper", "/host")
	usr := child(again, "usr")
	if !usr.AddChild("share", g.EmbeddedInode(), true) {
		t.Fatal("share not moved")
	}
	if got := g.rel(); got != "usr/share" {
		t.Errorf("rel under a root made anew: %q, want usr/share", got)
	}
	again.Freeze()
	g.rel()
	if !g.ReadOnly() {
		t.Error("a seal of the new root left the old node writable")
	}

	// Under a root of other layers, no path of the volume.
	other := root("/other", "/host")
	if !child(other, "usr").AddChild("share", g.EmbeddedInode(), true) {
		t.Fatal("share not moved")
	}
	if got := g.rel(); got == "usr/share" || !strings.Contains(got, "deleted") {
		t.Errorf("rel under a root of other layers: %q, want go-fuse's orphan path", got)
	}
}
