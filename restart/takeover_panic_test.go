package restart

import (
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestBridgePanicsAreRecognised pins the text of the go-fuse panics that
// a daemon which took a connection over turns into a node to resolve
// (unknownNode): a request naming a node the bridge does not know, and
// the release of a handle of such a node. A go-fuse upgrade that rewords
// either fails here, instead of turning every inherited node into EIO.
func TestBridgePanicsAreRecognised(t *testing.T) {
	const id = 123456789
	for _, c := range []struct {
		name string
		op   func(raw fuse.RawFileSystem)
	}{
		{"getattr", func(raw fuse.RawFileSystem) {
			var out fuse.AttrOut
			raw.GetAttr(nil, &fuse.GetAttrIn{InHeader: fuse.InHeader{NodeId: id}}, &out)
		}},
		{"lookup", func(raw fuse.RawFileSystem) {
			var out fuse.EntryOut
			raw.Lookup(nil, &fuse.InHeader{NodeId: id}, "x", &out)
		}},
		{"release", func(raw fuse.RawFileSystem) {
			raw.Release(nil, &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: id}, Fh: 7})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := gofs.NewNodeFS(&gofs.Inode{}, &gofs.Options{})
			defer func() {
				// try passes on a panic it does not recognise.
				if r := recover(); r != nil {
					t.Errorf("go-fuse's bridge over unknown node %d panicked with %q, which takeover does not recognise (unknownNode)", id, r)
				}
			}()
			got, ok := try(func() { c.op(raw) })
			if !ok || got != id {
				t.Errorf("go-fuse's bridge over unknown node %d: takeover read node %d (recognised: %v); its panic text changed, see unknownNode", id, got, ok)
			}
		})
	}
}

// TestForgetOfANodeNeverResolved: the kernel forgetting an inherited node
// this daemon never resolved is told to Forgotten, so that what was kept
// for it goes before its inode number is another file's; a node the
// bridge knows is not.
func TestForgetOfANodeNeverResolved(t *testing.T) {
	const id = 123456789
	raw := gofs.NewNodeFS(&gofs.Inode{}, &gofs.Options{})
	tfs := NewTakeoverFS(raw, nil, 1, nil)
	var told []uint64
	tfs.Forgotten = func(n uint64) { told = append(told, n) }
	tfs.Forget(id, 3)
	tfs.Forget(fuse.FUSE_ROOT_ID, 1)
	if len(told) != 1 || told[0] != id {
		t.Errorf("Forgotten was told %v, want [%d]", told, id)
	}
}
