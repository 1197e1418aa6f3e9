// Package nomadreplay does to a directory what Nomad's client does to its
// client.alloc_dir, with the same system calls in the same order, so that
// a test can run Nomad's life of an allocation against a plain disk and
// against the allocfs mount and compare. No Nomad agent can run in CI;
// this replay is the closest real artifact. It is our own code, written
// from the behaviour recorded in nomad-compat.md §12 (Nomad v2.0.5): it
// imports nothing of Nomad's.
//
// # What is replayed
//
//	Client.Start         MkdirAll(alloc_dir, 0711), MkdirAll(alloc_mounts_dir), statfs (df -kP)
//	Client.Build         MkdirAll <id> 0755; alloc, alloc/{logs,tmp,data}: MkdirAll, chmod |0777, chown nobody
//	Client.Move          stat <prev>/alloc/data; remove <new>/alloc/data; rename; the same per task for local/;
//	                     on any error Nomad's fallback: Destroy <new>, Build it again (the data is lost to it)
//	Client.BuildTask     <task>, local: chmod 0777, chown nobody; tmp 01777; then by isolation mode:
//	                       chroot: bind <id>/alloc on <task>/alloc, alloc/logs read-only on <task>/alloc/logs,
//	                               secrets, then the embed of chroot_env (createDir, link, else copy)
//	                       unveil: binds into alloc_mounts_dir/<id>-<task>/{task,alloc,secrets}
//	                       image, none: nothing more on disk
//	                     secrets/, private/: MkdirAll 0777; a tmpfs (noexec, size=Nm,noswap) unless
//	                     .nomad-mount is there; the marker; chmod 0777, chown nobody
//	Client.Logmon        mkfifoat of alloc/logs/.<task>.std{out,err}.fifo, no-follow; a reader that appends
//	                     to <task>.<stream>.<N>, rotating at a size and removing the oldest indices
//	Client.Listen        a unix socket (alloc/tmp/consul_grpc.sock, secrets/api.sock)
//	Client.Template      a temp file beside the target, renamed over it, chowned
//	Client.Artifact      a tar unpacked into local/
//	Snapshot, Receive    the previous node's tar of alloc/data and <task>/local, and the new node's
//	                     unpacking of it into a directory named with the previous allocation's ID
//	Client.Destroy       per task: unmount and remove the binds, the tmpfs, dev and proc (flags 0);
//	                     then os.RemoveAll(<id>)
//
// Every step returns an error instead of failing a test, so that a test
// can show the replay notices what goes wrong (Client.Rename swapped for
// a refused rename loses the Move's data, and the replay says so).
package nomadreplay
