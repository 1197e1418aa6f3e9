//go:build linux

// Command dropcap drops CAP_SYS_RESOURCE from the bounding set of its
// thread and execs its arguments, so that root's capabilities after the
// exec lack it: ext4 lets that capability past project quotas, and the
// project-quota tests on ext4 run without it (scripts/test-prjquota-vm.sh
// runs it inside the VM, which has no setpriv).
package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dropcap PROGRAM [ARG...]")
		os.Exit(2)
	}
	// The bounding set is the thread's: the exec must run on this one.
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SYS_RESOURCE, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "dropcap:", err)
		os.Exit(1)
	}
	err := syscall.Exec(os.Args[1], os.Args[1:], os.Environ())
	fmt.Fprintln(os.Stderr, "dropcap:", err)
	os.Exit(1)
}
