// Package logmon collects a task's stdout and stderr into rotating log
// files in its allocation's alloc/logs, the way Nomad's logmon does, so
// that anything reading Nomad's log layout (the alloc-FS logs API, tail
// -f, a log shipper) reads ours unchanged.
//
// # The path of a byte
//
// A task never writes a log file itself. For each stream logmon makes a
// FIFO in the log directory and hands the task its write end as fd 1 or
// 2; logmon reads the other end and writes what arrives to a Rotator:
//
//	task ──write(1)──▶ alloc/logs/.web.stdout.fifo ──▶ Rotator ──▶ alloc/logs/web.stdout.<N>
//	task ──write(2)──▶ alloc/logs/.web.stderr.fifo ──▶ Rotator ──▶ alloc/logs/web.stderr.<N>
//
// The FIFO decouples the task from the files: the task's writes cost no
// more than a pipe's, and rotation, pruning and a slow disk are logmon's
// business. The FIFO's buffer is also the only flow control: when logmon
// falls behind, the task blocks in write, and nothing is dropped.
//
// # Files and rotation
//
// Each stream has its own files, <task>.<stream>.<index>, mode 0644,
// opened for appending. A Rotator starts on the highest index present, so
// a restarted task appends to the file its previous run was writing, and
// indices only ever grow: a reader that saw web.stdout.7 knows that
// web.stdout.6 is older, whatever happened in between.
//
// A file is full at max_file_size. To keep lines whole, a file that
// reaches the limit in the middle of a line takes up to 32 KiB more to
// end that line; only lines longer than that are split across two files.
// So a file holds at most max_file_size + 32 KiB, and the disk a stream
// uses is bounded by max_files times that. When the current file is full,
// the next index is opened (stepping over any file that is already full),
// and then the oldest files are deleted so that exactly max_files remain.
//
// Output is buffered (64 KiB) and flushed every 100 ms, when the buffer
// fills, and at Close. A reader of the files is therefore at most 100 ms
// behind, and the task's many small writes become few large ones, which
// matters on a FUSE mount where every write is a round trip.
//
// Nothing is lost or duplicated: every byte read from a FIFO is written
// once, in order, to exactly one file; pruning removes whole files only.
// The exception is a log directory that refuses writes (a full disk):
// reading goes on, since a task blocked on a full pipe would be worse
// than missing lines, and what the files cannot take is dropped. Stop
// then returns ErrOutputLost with the count of bytes lost per stream and
// the first error, and Monitor.Lost gives the total; the caller decides
// what that means for the task (allocfs exec reports it and still exits
// with the task's code).
//
// # Security: the log directory belongs to the task too
//
// alloc/logs is world-writable (tasks of an allocation share alloc/), so a
// task can replace a FIFO or a log file with a symbolic link to a host
// file and wait for the agent, running as root, to open it: that read
// /etc/shadow into the logs or appended the task's output to a host file
// (HCSEC-2026-14, CVE-2026-6959). logmon therefore:
//
//   - opens the log directory once, beneath the allocation's directory,
//     and every FIFO and log file relative to that fd with openat2's
//     RESOLVE_BENEATH and RESOLVE_NO_SYMLINKS and O_NOFOLLOW, so no link
//     is followed anywhere in the path;
//   - checks what it opened with fstat: a FIFO owned by the agent, whose
//     write end is the very FIFO whose read end it holds; a regular file
//     with a single name (a hard link could be a host file) for a log;
//   - opens everything with O_NONBLOCK, so that a FIFO planted where a
//     log file belongs fails the open instead of hanging the agent.
//
// A FIFO path that is not the agent's FIFO fails Start with
// ErrUnsafePath: the task cannot be started safely. A log file that is
// not a plain file is stepped over with a warning (the next index is
// used), so that a task cannot turn its own logging off either. Removal
// uses unlinkat, which never follows a link, and a FIFO is only removed
// if the path still holds the one logmon opened.
//
// # Lifecycle
//
//	dir, _ := logmon.OpenDir(allocDir, "alloc/logs")
//	m, _ := logmon.Start(logger, dir, "web", logmon.DefaultConfig())
//	cmd.Stdout, cmd.Stderr = m.Stdout(), m.Stderr()
//	err := cmd.Start()
//	m.CloseWriters()  // the task holds the write ends now
//	cmd.Wait()
//	m.Stop(2 * time.Second)  // drain, flush, close, remove the FIFOs
//	dir.Close()
//
// A FIFO ends when its last writer closes it, normally when the task
// exits. A process the task left running may keep it open; Stop then
// waits at most its grace, takes what the pipe holds without waiting for
// more, and finishes. (allocfs exec ends every process of the task
// before it calls Stop, so that the FIFOs end with them.)
//
// # Concurrency
//
// A Rotator is safe for concurrent use; its Write takes a mutex that the
// flush timer shares. A Monitor runs one goroutine per stream. Dir is
// safe for concurrent use and must outlive the Rotators and Monitors
// that use it.
package logmon
