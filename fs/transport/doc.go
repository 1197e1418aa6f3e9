// Package transport is allocfs's own end of the FUSE connection: it
// mounts, answers the kernel's INIT, reads requests from /dev/fuse,
// hands each to a fuse.RawFileSystem (go-fuse's node bridge, in allocfs)
// and writes the reply. It replaces go-fuse's fuse.Server, and speaks
// the same protocol through go-fuse's wire types.
//
// Why our own loop. go-fuse's server starts a new reader goroutine for
// almost every request it takes (so that a slow handler never stalls the
// connection), and each start can wake another OS thread. A loop that
// keeps a pool of readers blocked in read(2) and handles each request on
// the goroutine that read it wakes none: on a loaded 2-vCPU VM a no-op
// server answered twice the cold lookups this way, on an idle one about
// 1.2× (docs/benchmarks.md, "The transport's floor"). The live-restart
// issue needs the loop too: a new daemon must serve a /dev/fuse descriptor
// it was handed, which go-fuse's server cannot adopt.
//
// FUSE over io_uring (fuseuring.go, uring.go) is the second way requests
// come in, where the kernel allows it (Options.IOUring): after INIT the
// daemon registers ring entries on the kernel's per-CPU queues; a request
// arrives as a completion in an entry, and one io_uring_enter(2) commits
// its reply and waits for the next. Each entry has its own thread, pinned
// to the entry's CPU, so a caller and the handler of its request share a
// CPU: a lookup's round trip costs about half of what it costs over
// /dev/fuse (docs/benchmarks.md, "FUSE over io_uring"). FORGET, INTERRUPT
// and notifications still use /dev/fuse, whose readers keep running.
//
// The shape of a connection:
//
//	Mount(dir, fs, opts)   open /dev/fuse, mount(2) with fd=N, read INIT
//	                       and answer it: the mount is usable on return
//	Conn.Serve()           over io_uring: ring threads registered on every
//	                       CPU's queue (fuseuring.go); and always
//	                       readers: each reads one request, handles it,
//	                       replies, and reads again; a reader that finds
//	                       no other idle reader starts one first, so a
//	                       blocked handler never stalls the mount; then
//	                       the poll probe (pollprobe.go), so that no
//	                       POLL ever waits on this process again
//	Conn.Unmount()         umount(2); the readers see ENODEV and end
//	Conn.Wait()            returns when they have
//
// What a request looks like on the wire: a fuse_in_header (40 bytes:
// length, opcode, unique, node ID, uid, gid, pid, extension length), the
// opcode's fixed input struct, then its variable part (NUL-terminated
// names, write data, an xattr value), then request extensions (which
// allocfs does not ask for, and strips). go-fuse's input types embed the
// header, so the buffer is read in place as *fuse.XxxIn. A reply is a
// fuse_out_header (length, negated errno, unique) and the output struct
// or payload. FORGET, BATCH_FORGET and INTERRUPT get no reply.
//
// What the loop does not do: splice (replies are copied), POSIX and BSD
// locks (not negotiated: the kernel keeps them locally, which is exact for
// one node), INTERRUPT (ignored, which the protocol allows: the
// interrupted request is still answered when its handler returns),
// RETRIEVE of cached pages (not used by allocfs).
//
// A connection outlives its daemon while another process holds its
// /dev/fuse file (session.go): Conn.Session and Conn.Fd are what a
// successor needs, Adopt makes a Conn of them without a second INIT, and
// Conn.Resend has the kernel give out again what the old daemon had read
// and not answered.
//
// The kernel's notifications (invalidate an entry or inode, delete an
// entry) and the passthrough ioctls (register a backing file) go through
// the same Conn, which implements go-fuse's fs.ServerCallbacks.
//
// Options.Observer, when set, is told of every request handled, with its
// opcode, the time from read to reply and the reply's errno
// (observe.go): package metrics makes the node's per-opcode histograms
// of it. It is an interface of this package's, so the loop imports no
// metrics library, and without one the loop does not read the clock. An
// observer that is also an ArrivalObserver is told of each request as it
// arrives too (the mount counts requests there).
package transport
