//go:build linux

package allocdirtest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/allocfs/allocfs/allocdir"
)

// testLayout checks the directories Build and TaskDir.Build create, their
// modes and owners, the TaskDir paths and the task registry.
func testLayout(t *testing.T, h *harness) {
	a := h.alloc(t, allocA)
	if err := a.Build(); err != nil {
		t.Fatalf("Build: %v", err)
	}
	web := a.NewTaskDir(allocdir.Task{Name: "web"})
	if web == nil {
		t.Fatal("NewTaskDir(web): got nil, want a TaskDir")
	}
	if err := web.Build(); err != nil {
		t.Fatalf("TaskDir.Build(web): %v", err)
	}
	root := a.AllocDirPath()

	// The allocation directory is named after the allocation and is absolute.
	t.Run("AllocDirPath", func(t *testing.T) {
		if !filepath.IsAbs(root) {
			t.Errorf("AllocDirPath: got %q, want an absolute path", root)
		}
		if got := filepath.Base(root); got != allocA {
			t.Errorf("base of AllocDirPath: got %q, want %q", got, allocA)
		}
		if got, want := a.ShareDirPath(), root+"/alloc"; got != want {
			t.Errorf("ShareDirPath: got %q, want %q", got, want)
		}
	})

	// Build creates alloc/{logs,tmp,data} 0777 under a 0755 alloc dir.
	t.Run("AllocModes", func(t *testing.T) {
		wantMode(t, root, fs.ModeDir|0o755)
		wantMode(t, host(a, "alloc"), fs.ModeDir|0o777)
		for _, d := range []string{"logs", "tmp", "data"} {
			wantMode(t, host(a, "alloc/"+d), fs.ModeDir|0o777)
		}
	})

	// TaskDir.Build creates web/ and local/ 0777, tmp/ 1777 (sticky), and
	// the secrets/ and private/ directories (0777 when running as root).
	t.Run("TaskModes", func(t *testing.T) {
		wantMode(t, host(a, "web"), fs.ModeDir|0o777)
		wantMode(t, host(a, "web/local"), fs.ModeDir|0o777)
		wantMode(t, host(a, "web/tmp"), fs.ModeDir|fs.ModeSticky|0o777)
		for _, d := range []string{"web/secrets", "web/private"} {
			if m := modeOf(t, host(a, d)); !m.IsDir() {
				t.Errorf("mode of %s: got %v, want a directory", d, m)
			}
			if os.Geteuid() == 0 {
				wantMode(t, host(a, d), fs.ModeDir|0o777)
			}
		}
	})

	// As root, everything below the alloc dir belongs to nobody; the alloc
	// dir itself stays with the agent.
	t.Run("Owners", func(t *testing.T) {
		requireRoot(t, "chown the layout to nobody")
		uid, gid := lookupOwner(t, "nobody")
		if u, _ := ownerOf(t, root); u != uint32(os.Geteuid()) {
			t.Errorf("owner of the alloc dir: got uid %d, want the agent's %d", u, os.Geteuid())
		}
		for _, d := range []string{"alloc", "alloc/logs", "alloc/tmp", "alloc/data",
			"web", "web/local", "web/tmp", "web/secrets", "web/private"} {
			if u, g := ownerOf(t, host(a, d)); u != uid || g != gid {
				t.Errorf("owner of %s: got %d:%d, want nobody %d:%d", d, u, g, uid, gid)
			}
		}
	})

	// As root, a task with a user gets secrets/ and private/ owned by that
	// user with mode 0700.
	t.Run("TaskUser", func(t *testing.T) {
		requireRoot(t, "chown secrets/ to the task's user")
		uid, _ := lookupOwner(t, "daemon")
		td := a.NewTaskDir(allocdir.Task{Name: "svc", User: "daemon"})
		if err := td.Build(); err != nil {
			t.Fatalf("TaskDir.Build(svc): %v", err)
		}
		for _, d := range []string{"svc/secrets", "svc/private"} {
			wantMode(t, host(a, d), fs.ModeDir|0o700)
			if u, _ := ownerOf(t, host(a, d)); u != uid {
				t.Errorf("owner of %s: got uid %d, want daemon's %d", d, u, uid)
			}
		}
	})

	// A second Build and TaskDir.Build succeed, keep the modes and keep
	// what the directories hold.
	t.Run("Idempotent", func(t *testing.T) {
		apply(t, root, file("alloc/data/keep", "kept", 0o644), file("web/local/keep", "kept", 0o644))
		before := tree(t, root)
		if err := a.Build(); err != nil {
			t.Errorf("second Build: %v", err)
		}
		if err := web.Build(); err != nil {
			t.Errorf("second TaskDir.Build: %v", err)
		}
		if d := diffTrees(before, tree(t, root)); d != "" {
			t.Errorf("second Build changed the tree: %s", d)
		}
		mustRead(t, a, "alloc/data/keep", "kept")
		mustRead(t, a, "web/local/keep", "kept")
	})

	// Every TaskDir path field is the documented path below AllocDirPath.
	t.Run("TaskDirPaths", func(t *testing.T) {
		for _, c := range []struct{ field, got, want string }{
			{"AllocDir", web.AllocDir, root},
			{"Dir", web.Dir, root + "/web"},
			{"SharedAllocDir", web.SharedAllocDir, root + "/alloc"},
			{"SharedTaskDir", web.SharedTaskDir, root + "/web/alloc"},
			{"LocalDir", web.LocalDir, root + "/web/local"},
			{"LogDir", web.LogDir, root + "/alloc/logs"},
			{"SecretsDir", web.SecretsDir, root + "/web/secrets"},
			{"PrivateDir", web.PrivateDir, root + "/web/private"},
			{"TmpDir", web.TmpDir, root + "/web/tmp"},
			{"Task.Name", web.Task.Name, "web"},
		} {
			if c.got != c.want {
				t.Errorf("TaskDir.%s: got %q, want %q", c.field, c.got, c.want)
			}
		}
	})

	// GetTaskDir returns the registered TaskDir, nil for an unknown task,
	// and the latest registration of a name.
	t.Run("GetTaskDir", func(t *testing.T) {
		if got := a.GetTaskDir("web"); got == nil || got.Dir != web.Dir {
			t.Errorf("GetTaskDir(web): got %+v, want the registered TaskDir", got)
		}
		if got := a.GetTaskDir("nope"); got != nil {
			t.Errorf("GetTaskDir(nope): got %+v, want nil", got)
		}
		b := h.alloc(t, allocB)
		b.NewTaskDir(allocdir.Task{Name: "web", SecretsMB: 1})
		b.NewTaskDir(allocdir.Task{Name: "web", SecretsMB: 7})
		if got := b.GetTaskDir("web"); got == nil || got.Task.SecretsMB != 7 {
			t.Errorf("GetTaskDir after registering twice: got %+v, want the second registration (SecretsMB 7)", got)
		}
	})

	// WalkTaskDirs visits tasks in name order and stops at, and returns,
	// the first error.
	t.Run("WalkTaskDirs", func(t *testing.T) {
		b := h.alloc(t, allocC)
		for _, n := range []string{"web", "api", "db"} {
			b.NewTaskDir(allocdir.Task{Name: n})
		}
		var visited []string
		if err := b.WalkTaskDirs(func(td *allocdir.TaskDir) error {
			visited = append(visited, td.Task.Name)
			return nil
		}); err != nil {
			t.Errorf("WalkTaskDirs: %v", err)
		}
		if want := []string{"api", "db", "web"}; !slices.Equal(visited, want) {
			t.Errorf("WalkTaskDirs order: got %v, want %v", visited, want)
		}
		stop := errors.New("stop here")
		visited = nil
		err := b.WalkTaskDirs(func(td *allocdir.TaskDir) error {
			visited = append(visited, td.Task.Name)
			if td.Task.Name == "db" {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) {
			t.Errorf("WalkTaskDirs error: got %v, want the callback's error", err)
		}
		if want := []string{"api", "db"}; !slices.Equal(visited, want) {
			t.Errorf("WalkTaskDirs visited after an error: got %v, want %v", visited, want)
		}
	})

	// A task name that is not one path component, or is the shared "alloc"
	// dir, fails TaskDir.Build with ErrInvalidName and creates or changes
	// nothing, inside the allocation or next to it.
	t.Run("InvalidTaskNames", func(t *testing.T) {
		for _, name := range []string{"", ".", "..", "a/b", "../escape", "alloc", "web/../..", "x\x00y"} {
			t.Run(fmt.Sprintf("%q", name), func(t *testing.T) {
				parent := filepath.Dir(root)
				beforeParent, beforeAlloc := topLevel(t, parent), tree(t, root)
				var td *allocdir.TaskDir
				func() {
					defer func() {
						if r := recover(); r != nil {
							t.Errorf("NewTaskDir(%q) panicked: %v", name, r)
						}
					}()
					td = a.NewTaskDir(allocdir.Task{Name: name})
				}()
				if td == nil {
					t.Errorf("NewTaskDir(%q): got nil, want a TaskDir whose Build fails", name)
				} else if err := td.Build(); !errors.Is(err, allocdir.ErrInvalidName) {
					t.Errorf("TaskDir.Build(%q): got %v, want an error wrapping ErrInvalidName", name, err)
				}
				if d := diffTrees(beforeParent, topLevel(t, parent)); d != "" {
					t.Errorf("task %q changed the store next to the alloc dir: %s", name, d)
				}
				if d := diffTrees(beforeAlloc, tree(t, root)); d != "" {
					t.Errorf("task %q changed the alloc dir: %s", name, d)
				}
			})
		}
	})
}
