// Package mountinfo parses the kernel's table of mounts,
// /proc/self/mountinfo (see proc(5)), keeping the fields allocfs acts on.
//
// allocfs asks what is mounted where to find its own FUSE mount and the
// connection behind it (the mount's device number names it in
// /sys/fs/fuse/connections), to locate the cgroup2 tree, which may be a
// bind-mounted subtree (the entry's Root), and to release mounts below a
// directory before removing it. Only mountinfo, not /proc/mounts, carries
// the device number and the root.
//
// The format is Linux's. [Parse] is plain Go and works on any input, so
// its tests use fixtures; [Read] finds a table only on Linux. Paths come
// back with the kernel's octal escapes undone (a space is \040 in the
// file).
package mountinfo
