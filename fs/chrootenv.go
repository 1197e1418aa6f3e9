package fs

import (
	"strings"
	"sync"

	"github.com/allocfs/allocfs/fs/layer"
)

// The chroot environment a task directory of Nomad's can show: the host
// paths, by their place in the chroot. What the mount does with it is
// chroot.go.

// DefaultChrootEnv is Nomad's default chroot_env: host paths by their
// place in the chroot.
func DefaultChrootEnv() map[string]string {
	env := make(map[string]string)
	for _, p := range []string{"/bin", "/etc", "/lib", "/lib32", "/lib64", "/sbin", "/usr", "/run/resolvconf", "/run/systemd/resolve"} {
		env[p] = p
	}
	return env
}

// chrootEnv is a mount's chroot environment, ready to stack.
type chrootEnv struct {
	entries  []layer.HostEntry
	skeleton string // the host layer's root: <data-dir>/chroot/<hash>/root
	empty    string // what an off host layer shows: <data-dir>/chroot/<hash>/empty
	// devs are the devices of the entries' sources, by entry.
	devs []uint64
	// removedDir holds the log of the host entries each task layer
	// removed, named by the layer (layer.Removals):
	// <data-dir>/chroot/removed.
	removedDir string
	mu         sync.Mutex
	removals   map[string]*layer.Removals
}

// destOf is the place in a task directory of the host path p: below an
// entry's source, or in the skeleton.
func (c *chrootEnv) destOf(p string) ([]string, bool) {
	split := func(dest, below string) []string {
		parts := strings.Split(dest, "/")
		if below != "" {
			parts = append(parts, strings.Split(below, "/")...)
		}
		return parts
	}
	for _, e := range c.entries {
		if p == e.Source {
			return split(e.Dest, ""), true
		}
		if below, ok := strings.CutPrefix(p, e.Source+"/"); ok {
			return split(e.Dest, below), true
		}
	}
	if below, ok := strings.CutPrefix(p, c.skeleton+"/"); ok {
		return strings.Split(below, "/"), true
	}
	return nil, false
}
