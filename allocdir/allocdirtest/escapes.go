//go:build linux

package allocdirtest

import (
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// escapeOp runs one read-side operation on a path and reports its error
// and whether it handed anything back.
type escapeOp struct {
	name string
	run  func(ctx context.Context, a allocdir.FS, p string) (returned bool, err error)
}

// escapeOps are the five path-taking read operations. BlockUntilExists
// must refuse synchronously; a channel it hands back instead counts as
// something returned.
var escapeOps = []escapeOp{
	{"List", func(_ context.Context, a allocdir.FS, p string) (bool, error) {
		infos, err := a.List(p)
		return len(infos) > 0, err
	}},
	{"Stat", func(_ context.Context, a allocdir.FS, p string) (bool, error) {
		fi, err := a.Stat(p)
		return fi != nil, err
	}},
	{"ReadAt", func(_ context.Context, a allocdir.FS, p string) (bool, error) {
		rc, err := a.ReadAt(p, 0)
		if rc != nil {
			rc.Close()
		}
		return rc != nil, err
	}},
	{"BlockUntilExists", func(ctx context.Context, a allocdir.FS, p string) (bool, error) {
		ch, err := a.BlockUntilExists(ctx, p)
		return ch != nil, err
	}},
	{"ChangeEvents", func(ctx context.Context, a allocdir.FS, p string) (bool, error) {
		c, err := a.ChangeEvents(ctx, p, 0)
		return c != nil, err
	}},
}

// testEscapes checks that no read operation leaves the allocation, by
// "..", by a link out (absolute, relative or at the end of a chain) or by
// a link loop, and that an absolute request means the allocation root.
func testEscapes(t *testing.T, h *harness) {
	a := h.built(t, allocA, "web")
	outside := t.TempDir()
	apply(t, outside, file("secret.txt", "OUTSIDE", 0o644))
	apply(t, a.AllocDirPath(),
		file("alloc/data/f", "inside", 0o644),
		symlink("alloc/data/etc", "/etc"),
		symlink("alloc/data/up", "../../../../../etc/passwd"),
		symlink("alloc/data/out", filepath.Join(outside, "secret.txt")),
		symlink("alloc/data/outdir", outside),
		// A chain of links that stays inside until its last hop.
		symlink("alloc/data/c1", "../tmp/c2"),
		symlink("alloc/tmp/c2", "../../web/local/c3"),
		symlink("web/local/c3", outside),
		symlink("alloc/data/r1", "../logs/r2"),
		symlink("alloc/logs/r2", "../../web/local/r3"),
		symlink("web/local/r3", "../../../"+filepath.Base(outside)),
		symlink("alloc/data/loop1", "loop2"),
		symlink("alloc/data/loop2", "loop1"),
		symlink("alloc/data/self", "self"),
	)

	// Every operation on an escaping path fails with ErrEscapes and hands
	// nothing back.
	for _, c := range []struct{ name, path string }{
		{"DotDot", "../x"},
		{"DotDotAfterDir", "alloc/../../x"},
		{"RootDotDot", "/../x"},
		{"DeepDotDot", "alloc/data/../../../etc/passwd"},
		{"LinkToEtc", "alloc/data/etc/passwd"},
		{"LinkToEtcItself", "alloc/data/etc"},
		{"LinkToEtcMissing", "alloc/data/etc/allocfs-no-such-file"},
		{"RelativeClimb", "alloc/data/up"},
		{"AbsoluteLinkOut", "alloc/data/out"},
		{"AbsoluteDirLinkOut", "alloc/data/outdir/secret.txt"},
		{"ChainOut", "alloc/data/c1/secret.txt"},
		{"ChainClimb", "alloc/data/r1/secret.txt"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, op := range escapeOps {
				ctx, cancel := context.WithCancel(context.Background())
				var returned bool
				var err error
				ok := within(hangTimeout, func() { returned, err = op.run(ctx, a, c.path) })
				cancel()
				switch {
				case !ok:
					t.Errorf("%s(%q) still running after %v", op.name, c.path, hangTimeout)
				case !errors.Is(err, allocdir.ErrEscapes):
					t.Errorf("%s(%q): got error %v, want one wrapping ErrEscapes", op.name, c.path, err)
				}
				if returned {
					t.Errorf("%s(%q): got a result, want nothing returned", op.name, c.path)
				}
			}
		})
	}

	// A link loop is an error, not a hang; nothing is handed back except,
	// for BlockUntilExists, a channel that delivers the error.
	for _, c := range []struct{ name, path string }{
		{"Loop", "alloc/data/loop1"},
		{"SelfLoop", "alloc/data/self"},
		{"LoopMidPath", "alloc/data/loop1/x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, op := range escapeOps {
				ctx, cancel := context.WithCancel(context.Background())
				var returned bool
				var err error
				ok := within(hangTimeout, func() { returned, err = op.run(ctx, a, c.path) })
				if !ok {
					t.Errorf("%s(%q) still running after %v", op.name, c.path, hangTimeout)
					cancel()
					continue
				}
				if op.name == "BlockUntilExists" && err == nil {
					err = loopChannelError(t, a, ctx, c.path)
					returned = false
				}
				cancel()
				if err == nil {
					t.Errorf("%s(%q): got no error, want one", op.name, c.path)
				}
				if returned {
					t.Errorf("%s(%q): got a result, want nothing returned", op.name, c.path)
				}
			}
		})
	}

	// An absolute request path means the allocation root, not the host's.
	t.Run("AbsoluteIsAllocRoot", func(t *testing.T) {
		mustRead(t, a, "/alloc/data/f", "inside")
		if fi, err := a.Stat("/alloc/data/f"); err != nil || fi.Size != 6 {
			t.Errorf("Stat(/alloc/data/f): got (%s, %v), want size 6", describe(fi), err)
		}
		if infos, err := a.List("/alloc/data"); err != nil || !slices.Contains(names(infos), "f") {
			t.Errorf("List(/alloc/data): got (%v, %v), want a listing with f", names(infos), err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := a.BlockUntilExists(ctx, "/alloc/data/f")
		if err != nil {
			t.Errorf("BlockUntilExists(/alloc/data/f): %v", err)
		} else if got, ok := receive(ch, eventTimeout); !ok || got != nil {
			t.Errorf("BlockUntilExists(/alloc/data/f): got (%v, received %v), want nil received", got, ok)
		}
		if c, err := a.ChangeEvents(ctx, "/alloc/data/f", 6); err != nil || c == nil {
			t.Errorf("ChangeEvents(/alloc/data/f): got (%v, %v), want changes", c, err)
		}
		if got, err := readAt(t, a, "/etc/passwd", 0); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("ReadAt(/etc/passwd): got (%q, %v), want fs.ErrNotExist (it means <alloc>/etc/passwd)", got, err)
		}
	})
}

// loopChannelError waits for the value a BlockUntilExists channel gives on
// a link loop; it must be an error, delivered promptly.
func loopChannelError(t *testing.T, a allocdir.FS, ctx context.Context, p string) error {
	t.Helper()
	ch, err := a.BlockUntilExists(ctx, p)
	if err != nil {
		return err
	}
	got, ok := receive(ch, eventTimeout)
	if !ok {
		t.Errorf("BlockUntilExists(%q) on a loop: nothing received within %v, want an error", p, eventTimeout)
		return errors.New("no value")
	}
	return got
}
