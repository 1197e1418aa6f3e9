// Package netlimit bounds what the clients of a network listener can make
// a daemon hold: open connections, long requests, and the log lines their
// refusals write.
//
// # Why a daemon needs these bounds
//
// Every accepted connection is a file descriptor, and a FUSE daemon shares
// its descriptors between its clients and the mount it serves: when a flood
// of idle connections takes the last descriptor, every open(2) through the
// mount fails with EMFILE. [Budget] splits the daemon's RLIMIT_NOFILE
// between the mount's reserve and its clients' shares; this package holds
// the clients to them.
//
// # The split: Budget
//
// [NewBudget] raises the soft limit to the hard one and splits it
// ([SplitFDs]): half, at least 256, stays with the mount and the store;
// the rest (at most 16384) is the network share, split between the control
// socket's connections, the TCP listener's and the requests that stream,
// each capped on its own so that a flood of one kind leaves the others
// their slots. A limit that leaves too little is refused with the number
// to raise it to.
//
// # Putting it together: Guard
//
// [Guard] holds a daemon's listeners and handlers to a Budget: capped
// listeners, the stream cap shared by every listener, HTTP servers with
// timeouts that close idle connections (and never cut a long answer), and
// one rate-limited log of refusals that the daemon's token checks write
// to as well.
//
// # Connections: Listener
//
// [NewListener] wraps a net.Listener so that at most n of the connections it
// accepted are open at once. At the cap, Accept waits for a slot instead of
// accepting and closing at once: connections beyond the cap stay in the
// kernel's accept queue, where they cost the daemon no descriptor, no
// goroutine, no syscall and no log line, however many arrive (beyond the
// queue's length, somaxconn, the kernel drops them). Accepting to close would
// cost a descriptor and a syscall per attempt, fail with EMFILE exactly
// when it matters, and hand a client that reconnects in a loop a way to keep
// the daemon busy. The price of waiting is that a queued client is served
// only when a slot frees: the server's idle and read timeouts bound how
// long that takes.
//
// # Long requests: Gate
//
// A request that streams (a follower, a snapshot) holds descriptors of its
// own besides its connection, for as long as the client wants. [Gate] runs
// at most n such requests at once and answers the others 503 at once.
//
// # Log lines: LogLimiter
//
// A refusal (a bad token, a failed TLS handshake, a listener at its cap) is
// worth a log line, but not one per attempt: [LogLimiter] writes at most one
// line per kind per interval and reports on it how many it suppressed since
// the previous one.
package netlimit
