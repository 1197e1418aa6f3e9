// Command allocfs serves allocation directories from a FUSE mount and
// manages them through the daemon's control API.
//
//	allocfs serve                         mount and serve the control API (Linux)
//	allocfs alloc create|list|status|stop|destroy
//	allocfs alloc fs|logs ALLOC           Nomad's shape: files and logs, on
//	                                      the socket or, with -address, a
//	                                      node's TCP API (any OS)
//	allocfs status                        the node, as the daemon sees it
//	allocfs gc [ALLOC]                    collect terminal allocations
//	allocfs version
//
// Flags take Nomad's one-dash spelling too (-json, -address). alloc fs,
// alloc logs, alloc status and alloc stop take any unique prefix of an
// allocation's ID of two characters or more; destroy, gc, exec and
// --previous want the whole ID.
//
// Exit codes: 0 when the command did what it was asked, 1 when it failed,
// 2 when it was called wrongly (unknown flag, missing argument).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/spf13/pflag"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	os.Exit(run(os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
}

// env is what a command may use of the outside world besides the
// filesystem and the network: where to print and the environment.
type env struct {
	stdout io.Writer
	stderr io.Writer
	getenv func(string) string
}

// command is one subcommand. Commands that have subcommands of their own
// (alloc) dispatch again with the same table shape.
type command struct {
	name     string
	synopsis string
	run      func(e *env, args []string) error
}

// commands is the top-level table; see also allocCommands.
var commands = append([]command{
	{"alloc", "create, list, inspect and destroy allocations", runAlloc},
	{"status", "show the node: data dir, mount, passthrough, backing store", runStatus},
	{"gc", "collect terminal allocations", runGC},
	{"fs", "the same as 'alloc fs': an allocation's files, as 'nomad alloc fs'", runAllocFS},
	{"logs", "the same as 'alloc logs': a task's logs, as 'nomad alloc logs'", runAllocLogs},
	{"version", "print the version", runVersion},
}, nodeCommands...)

// run executes the command line args and returns the exit code.
func run(args []string, e *env) int {
	err := dispatch("allocfs", commands, e, args)
	var uerr *usageError
	switch {
	case err == nil, errors.Is(err, pflag.ErrHelp):
		return exitOK
	case errors.As(err, &uerr):
		fmt.Fprintf(e.stderr, "%s: %s\n", uerr.cmd, uerr.msg)
		fmt.Fprintf(e.stderr, "Run '%s --help' for usage.\n", uerr.cmd)
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "allocfs: %v\n", err)
		return exitFailed
	}
}

// dispatch runs the command of table named by args[0]. prefix is the
// command line so far ("allocfs", "allocfs alloc").
func dispatch(prefix string, table []command, e *env, args []string) error {
	if len(args) == 0 {
		printCommands(e.stderr, prefix, table)
		return &usageError{cmd: prefix, msg: "a command is required"}
	}
	switch args[0] {
	case "-h", "--help", "help":
		printCommands(e.stdout, prefix, table)
		return nil
	case "--version", "-version":
		if prefix == "allocfs" {
			return runVersion(e, args[1:])
		}
	}
	for _, c := range table {
		if c.name == args[0] {
			return c.run(e, args[1:])
		}
	}
	return &usageError{cmd: prefix, msg: fmt.Sprintf("unknown command %q", args[0])}
}

func printCommands(w io.Writer, prefix string, table []command) {
	fmt.Fprintf(w, "Usage: %s <command> [flags]\n\nCommands:\n", prefix)
	names := make([]command, len(table))
	copy(names, table)
	sort.Slice(names, func(i, j int) bool { return names[i].name < names[j].name })
	for _, c := range names {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.synopsis)
	}
	fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", prefix)
}

// usageError is a command line the program cannot act on; it exits 2.
type usageError struct {
	cmd string // e.g. "allocfs alloc create"
	msg string
}

func (e *usageError) Error() string { return e.cmd + ": " + e.msg }

func usageErrorf(cmd, format string, a ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, a...)}
}

// newFlagSet returns the flag set of the command cmd ("allocfs alloc
// create"). usage is the argument synopsis and help is the text shown
// above the flags by --help.
func newFlagSet(e *env, cmd, usage, help string) *pflag.FlagSet {
	fset := pflag.NewFlagSet(cmd, pflag.ContinueOnError)
	fset.SetOutput(e.stdout)
	fset.SortFlags = false
	fset.Usage = func() {
		w := fset.Output()
		fmt.Fprintf(w, "Usage: %s %s\n\n%s\n", cmd, usage, strings.TrimSpace(help))
		if fset.HasAvailableFlags() {
			fmt.Fprintf(w, "\nFlags:\n%s", fset.FlagUsages())
		}
	}
	return fset
}

// parseFlags parses args into fset and checks the number of positional
// arguments is between minArgs and maxArgs (maxArgs < 0: no limit).
func parseFlags(fset *pflag.FlagSet, args []string, minArgs, maxArgs int) error {
	if err := fset.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return usageErrorf(fset.Name(), "%v", err)
	}
	n := fset.NArg()
	switch {
	case n < minArgs:
		return usageErrorf(fset.Name(), "expected %d argument(s), got %d", minArgs, n)
	case maxArgs >= 0 && n > maxArgs:
		return usageErrorf(fset.Name(), "unexpected argument %q", fset.Arg(maxArgs))
	}
	return nil
}
