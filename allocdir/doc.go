// Package allocdir defines the allocation-directory contract that task
// drivers program against. The plain on-disk implementation, that every
// other implementation is measured against, is package allocdir/disk.
//
// # The layout
//
// An allocation directory has a fixed shape (Nomad's, see [TaskDir] and the
// layout constants):
//
//	<root>/<allocID>/              0755, owned by the agent
//	├── alloc/                     0777  shared between tasks (NOMAD_ALLOC_DIR)
//	│   ├── data/                  0777  the ephemeral disk; migrated
//	│   ├── logs/                  0777  <task>.stdout.N, <task>.stderr.N
//	│   └── tmp/                   0777  scratch
//	└── <task>/                    0777  the task's working directory
//	    ├── local/                 0777  NOMAD_TASK_DIR; migrated
//	    ├── tmp/                   1777  sticky scratch
//	    ├── secrets/               0777  NOMAD_SECRETS_DIR; memory only
//	    └── private/               0777  agent-only material; memory only
//
// When the agent runs as root every directory below <allocID> is owned by
// "nobody"; otherwise ownership is left alone.
//
// # The contract
//
// [FS] is the read side (listing, stat, ranged reads, snapshots and change
// notification) used by the fs API, log followers and migration. [Interface]
// adds the lifecycle: task registration, Build, Destroy and Move. Every
// implementation must pass the conformance suite in allocdir/allocdirtest,
// which is where the exact semantics are pinned down.
//
// # Paths and containment
//
// Every request path is relative to the allocation directory; a leading "/"
// means the allocation root, never the host root. All of them go through
// one resolver ([Resolve]) that walks the path one component at a time and
// follows a symbolic link only while its target stays inside the allocation.
// The secrets and private rules are applied to the resolved path, so a link
// local/x -> ../secrets/y is refused as a secret read, not followed. The
// on-disk implementation then opens the resolved path with openat2(2) and
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, so a symlink planted between
// resolution and open makes the open fail instead of escaping.
//
// # Snapshots
//
// Package allocdir/snapshot writes Nomad's migration tar (alloc/data, then
// each task's local/), and its Extract is the only way a snapshot is ever
// unpacked: into a fresh directory, refusing anything that could escape or
// plant a device, and renaming into place only once the archive was read to
// its trailer. A refused archive fails with [ErrArchive].
//
// # Errors
//
// Domain failures are sentinel errors ([ErrEscapes], [ErrSecret],
// [ErrPrivate], [ErrNotBuilt], [ErrUnknownAlloc], [ErrGone], [ErrArchive])
// wrapped with context; test them with errors.Is.
//
// # Platforms
//
// The contract (FS and Interface, FileInfo, Task and TaskDir, the layout,
// the resolver, the errors and the change events) builds on every
// platform, so that a client of the API can use its types on a machine
// that cannot host an allocation. What only implementations need is
// Linux's and sits in the files named *_linux.go: opening beneath a
// directory with openat2 ([OpenBeneath], [NewBeneathFS]) and the shared
// read side ([ReadSide]), whose followers wait on a [Notifier] that the
// implementation gives it (inotify, from internal/inotify). The
// implementations and the Linux machinery they share have packages of
// their own: allocdir/disk, allocdir/snapshot, internal/inotify and
// internal/mountinfo; allocdir imports none of them.
package allocdir
