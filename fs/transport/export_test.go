package transport

// Polls returns how many POLL requests c has had, and the node of the
// first.
func Polls(c *Conn) (int32, uint64) { return c.polls.Load(), c.firstPoll.Load() }

// ProbeNode is the poll probe's node ID.
const ProbeNode uint64 = probeNode

// ProbeName is the root entry of the poll probe.
const ProbeName = probeName

// FailRingSetup makes the rings of CPU 0's queue fail to set up while on.
func FailRingSetup(on bool) { failRingSetup.Store(on) }

// Abort ends c's connection through fusectl, as Serve does when the kernel
// would wait for rings forever.
func Abort(c *Conn) error { return c.abort() }
