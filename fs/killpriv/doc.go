// Package killpriv keeps set-id bits as a local filesystem keeps them,
// for a FUSE server that makes every entry as root.
//
// Two things stand between a task and the mode bits it asked for. The
// daemon makes each entry as root and then chowns it to the caller, which
// clears set-id bits as any chown by root does; so a new entry asked for
// with set-id or sticky bits gets its requested mode again afterwards
// (RestoreMode). The kernel has already applied the umask and stripped
// what the caller may not set.
//
// And a change of a file's data by someone without CAP_FSETID must clear
// its set-id bits (the "killpriv" rule: S_ISUID always, S_ISGID when
// group-executable), so that an owner cannot plant code that runs with
// the privileges the bits would still grant. With HANDLE_KILLPRIV_V2 the
// kernel leaves that to the server and says when, per request, as the
// VFS decides it for a local filesystem:
//
//   - a WRITE carries FUSE_WRITE_KILL_SUIDGID when its writer lacks
//     CAP_FSETID; the writeback of a shared mapping (msync, munmap, the
//     flusher) never does: a local filesystem keeps the bits when data
//     arrives through a mapping, whoever wrote it;
//   - a SETATTR that changes the size carries FATTR_KILL_SUIDGID on the
//     same terms, and one that changes the owner always;
//   - before a write, fallocate or copy_file_range by a caller without
//     CAP_FSETID, the kernel's own file_remove_privs sends a SETATTR that
//     changes nothing, which the daemon applies as a chown to -1:-1
//     (fs/volume's volattr.go): on the backing file that clears the same bits.
//
// With passthrough a write never reaches the server and lands on the
// backing file as root, which keeps the bits; the SETATTR before it is
// what clears them. A file that has such bits when it is opened is served
// by the daemon all the same (the volume nodes' killprivFile), which follows each WRITE's
// flag, so that no write by an unprivileged caller can pass a file whose
// bits the kernel's cached mode does not show yet.
package killpriv
