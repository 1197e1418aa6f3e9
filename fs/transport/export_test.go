package transport

// Polls returns how many POLL requests c has had, and the node of the
// first.
func Polls(c *Conn) (int32, uint64) { return c.polls.Load(), c.firstPoll.Load() }

// ProbeNode is the poll probe's node ID.
const ProbeNode uint64 = probeNode

// ProbeName is the root entry of the poll probe.
const ProbeName = probeName
