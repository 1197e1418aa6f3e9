//go:build linux

package allocdirtest

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/internal/mountinfo"
)

// movePrev builds a previous allocation with tasks web and old, data,
// local content, logs and a secret.
func movePrev(t *testing.T, h *harness, id string) allocdir.Interface {
	t.Helper()
	prev := h.built(t, id, "web", "old")
	apply(t, prev.AllocDirPath(),
		file("alloc/data/test.txt", "data", 0o644),
		file("alloc/data/sub/deep", "deep", 0o600),
		file("web/local/conf", "conf", 0o644),
		file("old/local/keep", "keep", 0o644),
		file("alloc/logs/web.stderr.0", "log", 0o644),
		file("web/secrets/s", "secret", 0o600),
	)
	return prev
}

// testMove checks Move: data and local move, logs and everything else
// stay with the previous allocation (nomad#18034), ErrNotBuilt, tasks
// only on one side.
func testMove(t *testing.T, h *harness) {
	// Nomad's order: the new allocation is built and its tasks registered,
	// Move runs, then the task dirs are built over what moved.
	t.Run("Moves", func(t *testing.T) {
		prev := movePrev(t, h, allocA)
		dest := h.alloc(t, allocB)
		if err := dest.Build(); err != nil {
			t.Fatalf("Build: %v", err)
		}
		web := dest.NewTaskDir(allocdir.Task{Name: "web"})
		fresh := dest.NewTaskDir(allocdir.Task{Name: "new"})
		if err := dest.Move(prev, []string{"web", "new"}); err != nil {
			t.Fatalf("Move: %v", err)
		}
		for _, td := range []*allocdir.TaskDir{web, fresh} {
			if err := td.Build(); err != nil {
				t.Fatalf("TaskDir.Build(%s) after Move: %v", td.Task.Name, err)
			}
		}

		// The destination has the data and web's local/.
		mustRead(t, dest, "alloc/data/test.txt", "data")
		mustRead(t, dest, "alloc/data/sub/deep", "deep")
		mustRead(t, dest, "web/local/conf", "conf")
		wantMode(t, host(dest, "alloc/data"), fs.ModeDir|0o777)
		wantMode(t, host(dest, "web/local"), fs.ModeDir|0o777)

		// The previous allocation keeps its logs, secrets and the local/ of
		// tasks that were not moved.
		mustRead(t, prev, "alloc/logs/web.stderr.0", "log")
		mustRead(t, prev, "old/local/keep", "keep")
		if infos, err := prev.List("web/secrets"); err != nil || find(infos, "s") == nil {
			t.Errorf("List(web/secrets) of prev: got (%v, %v), want s still there", names(infos), err)
		}

		// What moved is gone from the previous allocation.
		wantNotExist(t, prev, "alloc/data/test.txt")
		wantNotExist(t, prev, "web/local/conf")

		// Nothing else came along.
		wantNotExist(t, dest, "alloc/logs/web.stderr.0")
		wantNotExist(t, dest, "old/local/keep")
		wantNotExist(t, dest, "web/secrets/s")

		// A task new in the destination starts with an empty local/.
		if infos, err := dest.List("new/local"); err != nil || len(infos) != 0 {
			t.Errorf("List(new/local): got (%v, %v), want an empty directory", names(infos), err)
		}

		// The moved data is the destination's own: it can be written and
		// survives the previous allocation's Destroy.
		apply(t, dest.AllocDirPath(), file("alloc/data/after", "after", 0o644))
		if err := prev.Destroy(); err != nil {
			t.Errorf("Destroy of prev: %v", err)
		}
		mustRead(t, dest, "alloc/data/test.txt", "data")
		mustRead(t, dest, "alloc/data/after", "after")
		mustRead(t, dest, "web/local/conf", "conf")
	})

	// Move into task dirs that were already built (empty local/) works too.
	t.Run("IntoBuiltTaskDirs", func(t *testing.T) {
		prev := movePrev(t, h, allocA)
		dest := h.built(t, allocC, "web")
		if err := dest.Move(prev, []string{"web"}); err != nil {
			t.Fatalf("Move: %v", err)
		}
		mustRead(t, dest, "alloc/data/test.txt", "data")
		mustRead(t, dest, "web/local/conf", "conf")
		mustRead(t, prev, "alloc/logs/web.stderr.0", "log")
		wantNotExist(t, prev, "alloc/data/test.txt")
	})

	// Move before Build fails with ErrNotBuilt and moves nothing.
	t.Run("NotBuilt", func(t *testing.T) {
		prev := movePrev(t, h, allocA)
		dest := h.alloc(t, allocB)
		dest.NewTaskDir(allocdir.Task{Name: "web"})
		err := dest.Move(prev, []string{"web"})
		if !errors.Is(err, allocdir.ErrNotBuilt) {
			t.Errorf("Move before Build: got %v, want an error wrapping ErrNotBuilt", err)
		}
		mustRead(t, prev, "alloc/data/test.txt", "data")
		mustRead(t, prev, "web/local/conf", "conf")
		if _, err := os.Lstat(host(dest, "alloc/data/test.txt")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("dest alloc/data/test.txt after a refused Move: got %v, want it missing", err)
		}
	})

	// Move from an allocation with no data and no such task is a no-op
	// that leaves the destination's empty data dir in place.
	t.Run("EmptyPrev", func(t *testing.T) {
		prev := h.built(t, allocA)
		dest := h.built(t, allocB, "web")
		if err := dest.Move(prev, []string{"web"}); err != nil {
			t.Fatalf("Move: %v", err)
		}
		if infos, err := dest.List("alloc/data"); err != nil || len(infos) != 0 {
			t.Errorf("List(alloc/data): got (%v, %v), want an empty directory", names(infos), err)
		}
	})
}

// testDestroy checks Destroy: the alloc dir and its mounts are gone, it is
// repeatable, works unbuilt, does not follow links out and spares other
// allocations.
func testDestroy(t *testing.T, h *harness) {
	// Destroy removes the alloc dir; the read side then fails.
	t.Run("Removes", func(t *testing.T) {
		outside := t.TempDir()
		apply(t, outside, file("victim", "keep me", 0o644))
		a := h.built(t, allocA, "web")
		other := h.built(t, allocB, "web")
		apply(t, a.AllocDirPath(),
			file("alloc/data/f", "x", 0o644),
			file("web/secrets/s", "x", 0o600),
			symlink("alloc/data/out", outside),
			symlink("alloc/data/victim", outside+"/victim"),
		)
		apply(t, other.AllocDirPath(), file("alloc/data/f", "other", 0o644))
		if err := a.Destroy(); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		if _, err := os.Lstat(a.AllocDirPath()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("alloc dir after Destroy: got %v, want it gone", err)
		}
		if m := mountsUnder(t, a.AllocDirPath()); len(m) != 0 {
			t.Errorf("mounts under the alloc dir after Destroy: got %v, want none", m)
		}
		if b, err := os.ReadFile(outside + "/victim"); err != nil || string(b) != "keep me" {
			t.Errorf("file a link pointed at: got (%q, %v), want it untouched", b, err)
		}
		mustRead(t, other, "alloc/data/f", "other")
		if infos, err := a.List("/"); err == nil {
			t.Errorf("List(/) after Destroy: got %v, want an error", names(infos))
		}
		if fi, err := a.Stat("alloc/data/f"); err == nil {
			t.Errorf("Stat after Destroy: got %s, want an error", describe(fi))
		}
	})

	// A read-only tree written by the task (a Go module cache in local/
	// is one) is removed too, even when the agent is not root.
	t.Run("ReadOnlyTree", func(t *testing.T) {
		a := h.built(t, allocC, "web")
		apply(t, a.AllocDirPath(),
			file("web/local/pkg/mod/m@v1/go.mod", "module m\n", 0o444),
			dir("web/local/pkg/mod/m@v1", 0o555),
			dir("web/local/pkg/mod", 0o555),
			file("alloc/data/ro", "x", 0o400),
			dir("alloc/data", 0o555),
		)
		if err := a.Destroy(); err != nil {
			t.Errorf("Destroy: %v", err)
		}
		if _, err := os.Lstat(a.AllocDirPath()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("alloc dir after Destroy: got %v, want it gone", err)
		}
	})

	// A second Destroy is fine.
	t.Run("Twice", func(t *testing.T) {
		a := h.built(t, allocD, "web")
		if err := a.Destroy(); err != nil {
			t.Fatalf("first Destroy: %v", err)
		}
		if err := a.Destroy(); err != nil {
			t.Errorf("second Destroy: got %v, want nil", err)
		}
	})

	// Destroy of a never-built allocation is fine and creates nothing.
	t.Run("NeverBuilt", func(t *testing.T) {
		a := h.alloc(t, allocE)
		a.NewTaskDir(allocdir.Task{Name: "web"})
		if err := a.Destroy(); err != nil {
			t.Errorf("Destroy of a never-built allocation: got %v, want nil", err)
		}
		if _, err := os.Lstat(a.AllocDirPath()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("alloc dir after Destroy: got %v, want it missing", err)
		}
	})
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	mounts, err := mountinfo.Read("")
	if err != nil {
		t.Logf("cannot read the mount table, not checking mounts: %v", err)
		return nil
	}
	var out []string
	for _, m := range mounts {
		if m.MountPoint == dir || strings.HasPrefix(m.MountPoint, dir+"/") {
			out = append(out, m.MountPoint)
		}
	}
	return out
}
