package migrate

import "fmt"

// Policy is what a replacement allocation asks for its previous
// allocation's ephemeral disk, as one enum rather than Nomad's two
// booleans (nomad#16826): migrate implies sticky.
type Policy string

const (
	// PolicyNone: the new allocation starts empty.
	PolicyNone Policy = "none"
	// PolicySticky: take the previous data over when it is on this node.
	PolicySticky Policy = "sticky"
	// PolicyMigrate: sticky, and fetch it from another node when it is
	// not here.
	PolicyMigrate Policy = "migrate"
)

// ParsePolicy reads a policy; "" means none.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case "":
		return PolicyNone, nil
	case PolicyNone, PolicySticky, PolicyMigrate:
		return p, nil
	}
	return "", fmt.Errorf("unknown migration policy %q: want none, sticky or migrate", s)
}

// Local reports whether the policy takes over data on the same node.
func (p Policy) Local() bool { return p == PolicySticky || p == PolicyMigrate }

// Remote reports whether the policy fetches data from another node.
func (p Policy) Remote() bool { return p == PolicyMigrate }

// Mode is how a local migration hands the data over.
type Mode string

const (
	// ModeAdopt: the new allocation takes the previous layers over and
	// writes them in place; the previous one shows where they went.
	ModeAdopt Mode = "adopt"
	// ModeSnapshot: the previous layers are sealed read-only under a
	// fresh layer; the previous allocation keeps a frozen view and the
	// new one copies a file up on its first write.
	ModeSnapshot Mode = "snapshot"
)

// ParseMode reads a mode; "" means adopt.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case "":
		return ModeAdopt, nil
	case ModeAdopt, ModeSnapshot:
		return m, nil
	}
	return "", fmt.Errorf("unknown migration mode %q: want adopt or snapshot", s)
}
