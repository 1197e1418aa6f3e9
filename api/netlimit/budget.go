package netlimit

import (
	"fmt"
	"math"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// The file descriptor budget. serve shares one RLIMIT_NOFILE between the
// mount and the store, which must be able to open files whatever clients
// do, and its network clients, which must never take what the mount
// needs: a descriptor the last idle connection took is an EMFILE for a
// task's open(2) through the mount.
const (
	// minReserve is the least the mount and the store keep: stdio,
	// /dev/fuse, the runtime's poller, the listeners, the state dir, the
	// followers' inotify instance, a collector walking a layer, a remote
	// migration's fetch, the layer roots and directories the mount keeps
	// open (64 each at most: fs.rootCacheSize, fs.dirCacheSize), and the
	// backing file behind every file tasks hold open through the mount.
	minReserve = 256
	// minNetwork is the smallest share worth serving clients with; a limit
	// that leaves less is refused at start.
	minNetwork = 64
	// maxNetwork bounds the clients' share on machines with a large limit:
	// past a few thousand connections a node's clients cost memory rather
	// than descriptors, and the mount may as well keep the rest.
	maxNetwork = 16384
	// fdsPerStream is what one client-API or snapshot request holds besides
	// its connection: the file it reads and a directory it resolves
	// through (a snapshot walks one directory at a time).
	fdsPerStream = 2
)

// Budget is how serve splits its descriptors. Reserve is never handed to
// clients; the rest, the network share, is split between the connections
// of each listener and the requests that stream, each capped on its own
// so that one kind of client cannot starve another: a flood of TCP
// connections leaves the control socket its slots, so `alloc create`
// still works.
//
//	Limit = Reserve + UnixConns + TCPConns + Streams*fdsPerStream
type Budget struct {
	// Limit is the soft RLIMIT_NOFILE serve runs with.
	Limit int
	// Reserve is what the mount and the store keep for their own I/O: half
	// of the limit, at least minReserve, and whatever maxNetwork leaves.
	Reserve int
	// UnixConns is the most connections open at once on the control
	// socket (an eighth of the network share).
	UnixConns int
	// TCPConns is the most connections open at once on --http-addr (what
	// the others leave).
	TCPConns int
	// Streams is the most client-API and snapshot requests running at once
	// on both listeners together (a quarter of the network share).
	Streams int
}

// SplitFDs splits a descriptor limit into a budget, or says how far the
// limit must be raised for clients to be served at all.
func SplitFDs(limit int) (Budget, error) {
	network := min(limit-max(limit/2, minReserve), maxNetwork)
	if network < minNetwork {
		return Budget{}, fmt.Errorf("the open files limit (RLIMIT_NOFILE) of %d is too low: the mount and the store keep %d descriptors, "+
			"which leaves %d for connections; raise it to at least %d (ulimit -n, or LimitNOFILE= in a systemd unit)",
			limit, max(limit/2, minReserve), max(network, 0), minReserve+minNetwork)
	}
	b := Budget{Limit: limit, Reserve: limit - network}
	b.UnixConns = network / 8
	b.Streams = network / 4 / fdsPerStream
	b.TCPConns = network - b.UnixConns - b.Streams*fdsPerStream
	return b, nil
}

// RaiseNoFile raises the soft RLIMIT_NOFILE to the hard limit and returns
// both as they were and the soft limit it leaves. Since Go 1.19 the
// runtime raises the soft limit itself at start, but to one below the hard
// limit (so that it can tell whether someone changed it since), and not at
// all when the two are equal, as under `prlimit --nofile=1024:1024`; so
// this mostly adds that last descriptor. Going through syscall.Setrlimit
// tells the runtime, whose children (fusermount3) then inherit the raised
// limit instead of the original one.
func RaiseNoFile() (was syscall.Rlimit, soft uint64, err error) {
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		return was, 0, fmt.Errorf("failed to read the open files limit: %w", err)
	}
	if was.Cur >= was.Max {
		return was, was.Cur, nil
	}
	raised := syscall.Rlimit{Cur: was.Max, Max: was.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err != nil {
		return was, 0, fmt.Errorf("failed to raise the open files limit from %d to its hard limit %d: %w", was.Cur, was.Max, err)
	}
	return was, raised.Cur, nil
}

// NewBudget raises the open files limit and splits it; the numbers go
// to the log, so that an operator who sees connections wait knows why.
func NewBudget(logger hclog.Logger) (Budget, error) {
	was, soft, err := RaiseNoFile()
	if err != nil {
		return Budget{}, err
	}
	// The kernel's nr_open bounds the hard limit far below this; the
	// clamp only keeps the conversion honest.
	limit := int(min(soft, math.MaxInt32))
	b, err := SplitFDs(limit)
	if err != nil {
		return Budget{}, err
	}
	logger.Info("file descriptor budget", "limit", b.Limit, "soft_was", was.Cur, "hard", was.Max,
		"reserve", b.Reserve, "unix_conns", b.UnixConns, "tcp_conns", b.TCPConns,
		"streams", b.Streams, "fds_per_stream", fdsPerStream)
	return b, nil
}
