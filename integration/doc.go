// Package integration tests allocfs from the outside, the way a node uses
// it: a real `allocfs serve` process, a real FUSE mount, and the ordinary
// tools (coreutils, tar, bash) and system calls that tasks, drivers and
// operators aim at it. It has no code of its own outside its tests; this
// file only explains them.
//
// # What runs
//
// The harness package (shared with cmd/allocfs's tests) builds
// ./cmd/allocfs once per test binary into a temporary directory (with the race detector when the tests have it, so
// that the daemon's data races fail the run too). Each test group then
// starts its own node:
//
//	/tmp/allocfs-it-XXXX/
//	  data/           --data-dir: state/, layers/, staging/
//	  mnt/            --mount: <mnt>/<allocID>/alloc, <mnt>/<allocID>/<task>
//	  allocfs.sock    --socket: the control API
//
// The mount point lies outside the data dir on purpose, so a test can walk
// every byte the daemon stored (grep -r data/) without walking the mount.
// A node is ready when its socket accepts connections and
// /proc/self/mountinfo shows fuse.allocfs at the mount point.
//
// Every test calls fstest.RequireFUSE first: without /dev/fuse or root the
// tests skip, and with ALLOCFS_REQUIRE_FUSE=1 (CI on a FUSE-capable
// machine) they fail instead, so a broken runner cannot pass silently.
//
// # The helpers
//
//	n := startNode(t)         build if needed, serve, wait for the mount
//	n.cli(t, args...)         run allocfs with ALLOCFS_SOCKET set to n's socket
//	n.sh(t, dir, script)      bash -c with `set -euo pipefail`, LC_ALL=C, in dir
//	n.kill9(t)                SIGKILL: the holder keeps the mount for the next serve
//	n.Restart(t)              serve again on the same data dir and mount
//	n.stop(t)                 SIGUSR1 (a full stop); the daemon must exit 0 and unmount
//
// The helpers take the *testing.T of the (sub)test that calls them, so a
// subtest's failure stops that subtest and not its parent; mustCLI and
// mustSh fail the test unless the command exits 0.
//
// Cleanup does not depend on the test passing: the daemon is killed by
// its PID, the mount point is detached lazily (umount -l), the holder of
// the FUSE connection is told to stop, and the temporary directory is
// removed.
//
// # The tests
//
// TestShellTools runs one tool per subtest against one allocation and
// checks what a person would check: bytes, exit codes, modes, owners,
// mtimes. TestCrashRestart kills the daemon with SIGKILL and checks that a
// restarted daemon takes the held mount over and serves every allocation,
// every byte written before the crash and a request made meanwhile;
// TestLiveRestart (restart_test.go) upgrades and kills a daemon under
// running tasks, none of which may notice. TestPosix runs go-fuse's
// posixtest table, each entry in a fresh directory inside a volume, plus
// a few POSIX checks of our own (posixExtra) where posixtest has none or
// excuses a failure with a skip of its own.
//
// # Chaos
//
// integration/chaos, a command of its own (`make chaos`), is no test:
// tasks' writes, renames and listings on many allocations while serve is
// killed and upgraded round after round, for minutes, with the figures it
// reports (docs/benchmarks.md "Chaos"). `make test` never runs it.
//
// # Known gaps
//
// A check that fails because allocfs itself is wrong stays in the table:
// it is skipped with t.Skip("known gap: ...") naming the defect (for the
// posix table, an entry of posixGaps), so that the package passes while
// the bug is open and whoever fixes it only has to delete the skip. A
// posixtest entry whose expectation is not POSIX's (it fails on ext4 and
// tmpfs too) is skipped as a "posixtest defect" instead. A skip is never
// the place to hide a flaky or wrong test of our own.
//
// # The race detector
//
// Under -race the daemon is built with -race too, and a "DATA RACE"
// report in its output fails the test even when the daemon was killed
// before its exit code could say so. Client commands run with
// GORACE=atexit_sleep_ms=0: a race-enabled binary otherwise sleeps a
// second before exiting.
//
// # Running
//
//	ALLOCFS_REQUIRE_FUSE=1 go test -race -count=1 ./integration/
//	go test -run 'TestPosix/Link$' -v ./integration/   one posixtest entry
//
// The daemon's output is printed when a test fails; under -v it logs at
// debug level and every command's output is logged too.
package integration
