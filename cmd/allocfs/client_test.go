package main

import (
	"strings"
	"testing"

	"github.com/allocfs/allocfs/api"
	"github.com/spf13/pflag"
)

// TestParseNomadFlags: Nomad's one-dash long flags count as the flags
// they name, shorthands stay shorthands, and nothing after "--" or that
// names no flag is rewritten.
func TestParseNomadFlags(t *testing.T) {
	fset := pflag.NewFlagSet("t", pflag.ContinueOnError)
	stat := fset.Bool("stat", false, "")
	addr := fset.String("address", "", "")
	lines := fset.IntP("lines", "n", 0, "")
	follow := fset.BoolP("follow", "f", false, "")
	err := parseNomadFlags(fset, []string{"-stat", "-address=https://n:1", "-n", "-5", "-f", "a1", "--", "-stat"}, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !*stat || *addr != "https://n:1" || *lines != -5 || !*follow {
		t.Errorf("got stat=%v address=%q n=%d f=%v", *stat, *addr, *lines, *follow)
	}
	if got := fset.Args(); len(got) != 2 || got[0] != "a1" || got[1] != "-stat" {
		t.Errorf("args: got %q, want [a1 -stat]", got)
	}
	fset = pflag.NewFlagSet("t", pflag.ContinueOnError)
	fset.Bool("stat", false, "")
	if err := parseNomadFlags(fset, []string{"-recursive", "a1"}, 1, 1); err == nil {
		t.Error("an unknown one-dash flag was accepted")
	}
}

// TestResolveTask: the only task when none is named; a named one must
// exist; the errors quote the allocation and list its tasks.
func TestResolveTask(t *testing.T) {
	one := &api.AllocStub{ID: "a1", TaskStates: map[string]api.TaskState{"web": {}}}
	two := &api.AllocStub{ID: "a2", TaskStates: map[string]api.TaskState{"web": {}, "db": {}}}
	if got, err := resolveTask(one, ""); err != nil || got != "web" {
		t.Errorf("one task, none named: got %q %v, want web", got, err)
	}
	if got, err := resolveTask(two, "db"); err != nil || got != "db" {
		t.Errorf("two tasks, db named: got %q %v, want db", got, err)
	}
	for _, c := range []struct {
		stub *api.AllocStub
		task string
		want string
	}{
		{two, "", `allocation "a2" has 2 tasks (db, web): name one`},
		{one, "db", `allocation "a1" has no task "db"; its tasks: web`},
		{one, "a/b", "invalid task name"},
	} {
		if _, err := resolveTask(c.stub, c.task); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("resolveTask(%s, %q): got %v, want %q", c.stub.ID, c.task, err, c.want)
		}
	}
}
