//go:build !linux

package main

import (
	"fmt"
	"runtime"
)

// nodeCommands say where they run: a node needs Linux's FUSE, mounts and
// cgroups, while the client commands work from anywhere.
var nodeCommands = []command{
	{"serve", "mount the allocation directories (Linux only)", linuxOnly("serve")},
	{"exec", "run a command as a task of an allocation (Linux only)", linuxOnly("exec")},
}

func linuxOnly(name string) func(*env, []string) error {
	return func(*env, []string) error {
		return fmt.Errorf("allocfs %s runs on a Linux node, not on %s: the client commands (alloc fs, alloc logs with -address) reach a node from here", name, runtime.GOOS)
	}
}
