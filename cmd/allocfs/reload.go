//go:build linux

package main

import (
	"fmt"
	"path/filepath"

	"github.com/allocfs/allocfs/daemon"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"github.com/hashicorp/go-hclog"
)

// reloader reads serve's configuration again for a SIGHUP: the flags
// are parsed again (the command line and --config's file, which may have
// changed), and what can change while the daemon runs does: the log
// level, and the token and TLS files, which are read again even when
// their names stay (a rotated certificate or token). What cannot (the
// data dir, the mount, the sockets, whether the listener speaks TLS and
// which routes it has, the collector's settings) is named as waiting for
// the next start. A reload that fails (a flag or file that does not
// parse) changes nothing and says why.
type reloader struct {
	// args are the flags in effect; reread parses them again.
	args   *serveArgs
	reread func() (*serveArgs, error)
}

func (r *reloader) reload() (*daemon.Reload, error) {
	next, err := r.reread()
	if err == nil {
		err = resolveServePaths(next)
	}
	if err != nil {
		return nil, err
	}
	inEffect := *r.args
	inEffect.logLevel = next.logLevel
	waiting := restartOnly(r.args, next)
	node := r.args.node
	if node.SameListener(next.node) {
		node = next.node
	} else {
		waiting = append(waiting, "http-addr, its token files or its TLS")
	}
	secrets, err := node.Load()
	if err != nil {
		return nil, err
	}
	inEffect.node = node
	r.args = &inEffect
	return &daemon.Reload{Level: hclog.LevelFromString(next.logLevel), Secrets: secrets, Waiting: waiting, Config: next.configFile}, nil
}

// resolveServePaths makes a's paths absolute and resolved, as serve
// compares them.
func resolveServePaths(a *serveArgs) error {
	for _, p := range []*string{&a.dataDir, &a.socket} {
		var err error
		if *p, err = resolvePath(*p); err != nil {
			return err
		}
	}
	var err error
	a.mountDir, err = resolveMountPath(a.mountDir)
	return err
}

// restartOnly names the flags that differ between old and next and that
// only a start applies.
func restartOnly(old, next *serveArgs) []string {
	var names []string
	for _, f := range []struct {
		name    string
		changed bool
	}{
		{"data-dir", old.dataDir != next.dataDir},
		{"mount", old.mountDir != next.mountDir},
		{"socket", old.socket != next.socket},
		{"log-json", old.logJSON != next.logJSON},
		{"debug-fuse", old.debugFuse != next.debugFuse},
		{"fuse-io-uring", old.fuseIOUring != next.fuseIOUring},
		{"allow-suid", old.allowSuid != next.allowSuid},
		{"gc-*", old.gc != next.gc},
		{"metrics-usage-interval", old.metricsUsageInterval != next.metricsUsageInterval},
		{"enable-quotas, default-disk-mb, quota-groups", old.quota != next.quota},
	} {
		if f.changed {
			names = append(names, f.name)
		}
	}
	return names
}

// resolveMountPath is resolvePath for the mount point, which it never
// touches when an allocfs mount is there: a mount a holder keeps has no
// daemon until this one takes it, so a stat of it would wait for this
// very process. A mount point is not a symbolic link, so resolving its
// parent is enough.
func resolveMountPath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("failed to resolve %q: %w", p, err)
	}
	parent, err := resolvePath(filepath.Dir(abs))
	if err != nil {
		return "", err
	}
	candidate := filepath.Join(parent, filepath.Base(abs))
	if mounts, err := mountinfo.Read("/proc/self/mountinfo"); err == nil {
		for _, m := range mounts {
			if m.MountPoint == candidate && m.FSType == daemon.FSType {
				return candidate, nil
			}
		}
	}
	return resolvePath(abs)
}
