//go:build linux

package daemon

import (
	"fmt"
	"os"
	"strings"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/internal/fusectl"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"github.com/hashicorp/go-hclog"
)

// nodeHealth is what GET /v1/agent/health checks: the mount, passthrough
// and the store. None of the checks touches the mount: a daemon that
// stats its own mount from a request can wait on itself.
func nodeHealth(m *fs.Mount, s *store.Store, quotasAsked bool) func() []api.HealthCheck {
	return func() []api.HealthCheck {
		return []api.HealthCheck{mountHealth(m, mountinfoPath), passthroughHealth(m), storeHealth(s), memoryHealth(m, s), quotaHealth(s, quotasAsked)}
	}
}

// quotaHealth fails where the operator asked for disk limits
// (--enable-quotas) and the data dir cannot enforce them, or while the
// kernel's quota groups lag the records (a settle failed); a node that
// never asked for limits is healthy without them, and the detail says
// what would enable them.
func quotaHealth(s *store.Store, asked bool) api.HealthCheck {
	c := api.HealthCheck{Name: "quota"}
	r := s.Quota()
	switch {
	case !r.Enforced() && asked:
		c.Detail = "--enable-quotas is set, but disk limits are not enforced: " + r.Why
	case !r.Enforced():
		c.OK, c.Detail = true, "disk limits are off: "+r.Why
	case s.QuotaError() != nil:
		c.Detail = fmt.Sprintf("some allocations' disk limits lag their records (%s): %v", r.Mechanism, s.QuotaError())
	default:
		c.OK, c.Detail = true, fmt.Sprintf("allocations' disk limits are enforced by %s on %s", r.Mechanism, r.Filesystem)
	}
	return c
}

// mountHealth finds the mount in the mount table and asks the connection
// whether the kernel ended it. How many requests wait on it comes from
// fusectl, where this process can reach one (internal/fusectl): a host
// that never mounted fusectl, or a daemon without the privilege to make
// its own instance, takes nothing from a healthy mount.
func mountHealth(m *fs.Mount, table string) api.HealthCheck {
	c := api.HealthCheck{Name: "mount"}
	mounts, err := mountinfo.Read(table)
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	var top *mountinfo.Entry
	for i := range mounts {
		if mounts[i].MountPoint == m.Dir() {
			top = &mounts[i] // the last one is on top
		}
	}
	switch {
	case top == nil:
		c.Detail = "nothing is mounted at " + m.Dir()
	case top.FSType != FSType:
		c.Detail = fmt.Sprintf("%s is covered by a %s mount", m.Dir(), top.FSType)
	case m.ConnectionEnded():
		c.Detail = "the FUSE connection was ended (unmounted or aborted); the files at " + m.Dir() + " answer ENOTCONN"
	default:
		c.OK = true
		c.Detail = "FUSE connection " + connectionState(top.Device)
	}
	return c
}

// logFusectl says where the health check reads the FUSE connection from:
// the host's fusectl, a private instance of the daemon's own where the
// host mounted none, or nowhere.
func logFusectl(logger hclog.Logger) {
	d, err := fusectl.Shared()
	switch {
	case err != nil:
		logger.Warn("fusectl cannot be reached: the health check cannot say how many requests wait on the mount", "error", err)
	case d.Detached():
		logger.Info("no fusectl is mounted at " + fusectl.MountPoint + ": the daemon reads its FUSE connection through a private, detached instance that no mount table shows")
	}
}

// connectionState describes the connection of the mount whose device
// is device: its number and, where fusectl can be reached, how many
// requests wait on it.
func connectionState(device string) string {
	conn, err := fusectl.Conn(device)
	if err != nil {
		return device
	}
	d, err := fusectl.Shared()
	if err != nil {
		return fmt.Sprintf("%d (requests waiting: unknown, %v)", conn, err)
	}
	n, err := d.Waiting(conn)
	if err != nil {
		return fmt.Sprintf("%d (requests waiting: unknown, %v)", conn, err)
	}
	return fmt.Sprintf("%d, %d requests waiting", conn, n)
}

// passthroughHealth fails when passthrough was negotiated and file data
// went through the daemon all the same.
func passthroughHealth(m *fs.Mount) api.HealthCheck {
	c := api.HealthCheck{Name: "passthrough", OK: true, Detail: "the kernel serves file data from the backing files"}
	switch {
	case m.PassthroughLost():
		c.OK, c.Detail = false, "file data went through the daemon although passthrough was negotiated (see the log)"
	case !m.Passthrough():
		c.Detail = "not negotiated: file data goes through the daemon"
	}
	return c
}

// storeHealth writes, syncs and removes a file in the store's staging
// directory: the store takes writes.
func storeHealth(s *store.Store) api.HealthCheck {
	c := api.HealthCheck{Name: "store"}
	f, err := os.CreateTemp(s.StagingDir(), ".health-")
	if err != nil {
		c.Detail = fmt.Sprintf("the data dir %s takes no new file: %v", s.DataDir(), err)
		return c
	}
	_, werr := f.Write([]byte("ok"))
	serr := f.Sync()
	cerr := f.Close()
	rerr := os.Remove(f.Name())
	for _, err := range []error{werr, serr, cerr, rerr} {
		if err != nil {
			c.Detail = fmt.Sprintf("the data dir %s takes no writes: %v", s.DataDir(), err)
			return c
		}
	}
	c.OK, c.Detail = true, "the data dir "+s.DataDir()+" takes writes"
	return c
}

// memoryHealth fails while a task runs whose memory volumes were lost
// before this daemon started (their keeper died with the daemon), or
// holds data in one that only this process keeps.
func memoryHealth(m *fs.Mount, s *store.Store) api.HealthCheck {
	c := api.HealthCheck{Name: "memory", OK: true, Detail: "every memory volume is kept beyond this daemon"}
	var lost []string
	for _, key := range m.LostMemory() {
		id, _, _ := strings.Cut(key, "/")
		if _, err := s.View(id); err == nil {
			lost = append(lost, key)
		}
	}
	switch unkept := m.MemoryInUse(); {
	case len(lost) > 0:
		c.OK = false
		c.Detail = "lost before this daemon started, their tasks finding them empty: " + strings.Join(lost, ", ") + " (what kept them while no daemon ran was gone)"
	case len(unkept) > 0:
		c.OK = false
		c.Detail = "kept by this daemon only, and lost if it stops: " + strings.Join(unkept, ", ")
	}
	return c
}
