//go:build linux

package main

import "github.com/allocfs/allocfs/restart"

// runHolder is `allocfs fuse-holder`, which serve starts to keep its FUSE
// connection (package restart).
func runHolder(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs fuse-holder", "--socket PATH", `
Hold a FUSE connection (its /dev/fuse descriptor as fd 3) while the daemon
that serves it restarts; started by serve, not by hand.`)
	var socket string
	fset.StringVar(&socket, "socket", "", "unix socket `path` to answer on")
	if err := parseFlags(fset, args, 0, 0); err != nil {
		return err
	}
	if socket == "" {
		return usageErrorf("allocfs fuse-holder", "--socket is required")
	}
	return restart.ServeHolder(socket)
}
