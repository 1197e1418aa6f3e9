// Package taskproc finds and ends every process of one task that
// `allocfs exec` runs, including the ones the task orphans.
//
// # The problem
//
// A task is not one process. It forks helpers, double-forks daemons and
// calls setsid, and when it ends, whatever it left behind still holds
// files open in the allocation's directory: its logs keep growing, its
// volume cannot be unmounted, the next run of the task finds a stale
// process on its port. Waiting for the main process is not enough.
//
// # Three ways to know a task's processes, best first
//
//   - A cgroup v2 of its own, a leaf in the caller's cgroup (so the task
//     stays under the limits its caller is under). The task starts in it
//     through clone3's CLONE_INTO_CGROUP, before its first instruction;
//     every process it starts inherits it and none can leave without
//     privilege. cgroup.kill ends them all at once.
//   - A child subreaper (PR_SET_CHILD_SUBREAPER): whatever the task
//     orphans becomes the caller's child instead of init's, so the task
//     is every descendant of the caller, read from /proc. The caller must
//     start no other child. With a cgroup the caller is a subreaper too:
//     it reaps the orphans it killed and finds a task that left the
//     cgroup.
//   - The task's process group alone, which setsid leaves: the last
//     resort, logged as a warning.
//
// [Track] picks the best the kernel and the caller's privileges allow and
// never fails. ALLOCFS_EXEC_NO_CGROUP=1 ([EnvNoCgroup]) forces the
// subreaper, for tests on machines that have cgroup v2.
//
// # Ending a task
//
// [Tracker.Terminate] runs once the main process has exited: SIGTERM to
// what is left, a grace period, then SIGKILL, and a bounded wait for the
// processes to die (only one stuck in the kernel, say on an unresponsive
// mount, takes longer). [Tracker.Close] then removes the cgroup.
package taskproc
