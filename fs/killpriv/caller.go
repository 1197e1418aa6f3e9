package killpriv

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Bits of a capability set.
const (
	CapFsetid   = 4  // CAP_FSETID
	CapSysAdmin = 21 // CAP_SYS_ADMIN
)

// callerProc is what /proc/<pid>/status says of the process that made a
// request: FUSE tells the daemon the caller's pid, fsuid and fsgid, not
// its capabilities or supplementary groups.
type callerProc struct {
	capEff uint64
	groups []uint32
}

// readCaller reads the status of the caller of ctx; false when there is
// none to read (a request the kernel makes itself has pid 0, a process
// may be gone).
func readCaller(ctx context.Context) (callerProc, bool) {
	c, ok := fuse.FromContext(ctx)
	if !ok || c.Pid == 0 {
		return callerProc{}, false
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.Pid))
	if err != nil {
		return callerProc{}, false
	}
	var p callerProc
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return callerProc{}, false
			}
			p.capEff = eff
		} else if v, ok := strings.CutPrefix(line, "Groups:"); ok {
			for _, g := range strings.Fields(v) {
				n, err := strconv.ParseUint(g, 10, 32)
				if err != nil {
					return callerProc{}, false
				}
				p.groups = append(p.groups, uint32(n))
			}
		}
	}
	return p, true
}

// HasCap reports whether the process that made the request has the
// capability bit in its effective set. Unknown means no.
func HasCap(ctx context.Context, bit uint) bool {
	p, ok := readCaller(ctx)
	return ok && p.capEff&(1<<bit) != 0
}

// inGroupOrFsetid reports whether the caller of ctx is in group
// gid (its fsgid or a supplementary group) or has CAP_FSETID: the VFS's
// in_group_or_capable, which decides whether a change keeps a set-gid
// bit. Unknown means no.
func inGroupOrFsetid(ctx context.Context, gid uint32) bool {
	if c, ok := fuse.FromContext(ctx); ok && c.Gid == gid {
		return true
	}
	p, ok := readCaller(ctx)
	if !ok {
		return false
	}
	if p.capEff&(1<<CapFsetid) != 0 {
		return true
	}
	for _, g := range p.groups {
		if g == gid {
			return true
		}
	}
	return false
}
