//go:build linux

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/internal/mountinfo"
)

// fuseConnections is where the kernel lists FUSE connections by the
// minor number of their device.
const fuseConnections = "/sys/fs/fuse/connections"

// nodeHealth is what GET /v1/agent/health checks: the mount, passthrough
// and the store. None of the checks touches the mount: a daemon that
// stats its own mount from a request can wait on itself.
func nodeHealth(m *fs.Mount, s *store.Store) func() []api.HealthCheck {
	return func() []api.HealthCheck {
		return []api.HealthCheck{mountHealth(m, mountinfoPath), passthroughHealth(m), storeHealth(s)}
	}
}

// mountHealth finds the mount in the mount table and its connection in
// fusectl's directory, and asks the connection whether the kernel ended
// it.
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
	case top.FSType != allocfsFSType:
		c.Detail = fmt.Sprintf("%s is covered by a %s mount", m.Dir(), top.FSType)
	case m.ConnectionEnded():
		c.Detail = "the FUSE connection was ended (unmounted or aborted); the files at " + m.Dir() + " answer ENOTCONN"
	default:
		_, minor, _ := strings.Cut(top.Device, ":")
		waiting, err := os.ReadFile(filepath.Join(fuseConnections, minor, "waiting"))
		if err != nil {
			c.Detail = fmt.Sprintf("FUSE connection %s is not in %s: %v", minor, fuseConnections, err)
			return c
		}
		c.OK = true
		c.Detail = fmt.Sprintf("FUSE connection %s, %s requests waiting", minor, strings.TrimSpace(string(waiting)))
	}
	return c
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
