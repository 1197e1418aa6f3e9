package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time: -ldflags "-X main.version=1.2.3";
// revision too, by the Makefile, for builds that carry no VCS stamp.
var (
	version  = "0.0.0-dev"
	revision = ""
)

func runVersion(e *env, args []string) error {
	fset := newFlagSet(e, "allocfs version", "", "Print the version of allocfs and how it was built.")
	if err := parseFlags(fset, args, 0, 0); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "allocfs %s (%s)\n", version, buildDetails())
	return nil
}

// buildDetails describes the build: the VCS revision when the binary was
// built from a checkout, the Go version and the platform.
func buildDetails() string {
	s := fmt.Sprintf("%s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	var rev, modified string
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = &debug.BuildInfo{}
	}
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.modified":
			if kv.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if rev == "" {
		rev = revision
	}
	if rev == "" {
		return s
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	return "rev " + rev + modified + ", " + s
}
