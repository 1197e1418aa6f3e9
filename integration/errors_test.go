package integration

import (
	"strings"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
)

// TestCLIErrorStyle: the CLI's refusals read one way: the allocation
// quoted, nothing said twice, the tasks listed where a task is wrong, and
// a missing path named once. destroy takes no prefix: "a" destroys no a1.
func TestCLIErrorStyle(t *testing.T) {
	fstest.RequireFUSE(t)
	n := startNode(t)
	n.mustCLI(t, "alloc", "create", "a1", "--task", "web", "--task", "db")
	n.mustCLI(t, "alloc", "create", "a2", "--task", "web")
	n.mustCLI(t, "alloc", "stop", "a2")
	n.mustCLI(t, "alloc", "create", "a3", "--task", "web", "--previous", "a2", "--migrate")
	n.mustCLI(t, "alloc", "create", "gone", "--task", "web")
	n.mustCLI(t, "alloc", "destroy", "gone")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"alloc", "status", "nope"}, `allocfs: unknown allocation "nope"`},
		{[]string{"alloc", "fs", "nope"}, `allocfs: unknown allocation "nope": no allocation has that ID or an ID that starts with it`},
		{[]string{"alloc", "status", "gone"}, `allocfs: allocation "gone" has been garbage collected`},
		{[]string{"alloc", "destroy", "a"}, `allocfs: unknown allocation "a"`},
		{[]string{"gc", "a1"}, `allocfs: allocation "a1" is running: stop it before collecting it`},
		{[]string{"alloc", "create", "a4", "--task", "web", "--previous", "a1", "--migrate"}, `allocfs: previous allocation "a1" is running: stop it first (allocfs alloc stop a1)`},
		{[]string{"alloc", "create", "a4", "--task", "web", "--previous", "a2", "--migrate"}, `allocfs: previous allocation "a2" already handed its data to "a3": allocation already exists`},
		{[]string{"alloc", "create", "a1", "--task", "web"}, `allocfs: failed to create allocation "a1": allocation already exists`},
		{[]string{"logs", "a1"}, `allocfs: allocation "a1" has 2 tasks (db, web): name one`},
		{[]string{"logs", "a1", "api"}, `allocfs: allocation "a1" has no task "api"; its tasks: db, web`},
		{[]string{"alloc", "fs", "a1", "alloc/nodir"}, `allocfs: resolve "alloc/nodir": no such file or directory`},
	} {
		r := n.cli(t, c.args...)
		if got := strings.TrimSpace(r.stderr); r.code != 1 || got != c.want {
			t.Errorf("allocfs %s: exit %d\n got: %s\nwant: %s", strings.Join(c.args, " "), r.code, got, c.want)
		}
	}
}
