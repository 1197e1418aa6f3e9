//go:build linux

package main

import (
	"crypto/tls"
	"fmt"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
)

// reloader applies a SIGHUP: serve's flags are parsed again (the command
// line and --config's file, which may have changed), and what can change
// while the daemon runs does: the log level, and the token and TLS files,
// which are read again even when their names stay (a rotated certificate
// or token). What cannot (the data dir, the mount, the sockets, whether
// the listener speaks TLS and which routes it has, the collector's
// settings) is logged as waiting for the next start. A reload that fails
// (a flag or file that does not parse) changes nothing and says why.
type reloader struct {
	logger hclog.Logger
	// args are the flags in effect; reread parses them again.
	args   *serveArgs
	reread func() (*serveArgs, error)
	// secrets are the listener's tokens and TLS; fetchTLS sets the TLS
	// of remote migrations' fetches.
	secrets  *atomic.Pointer[nodeSecrets]
	fetchTLS func(*tls.Config)
}

func (r *reloader) reload() {
	if r.reread == nil || r.args == nil {
		r.logger.Info("SIGHUP: nothing to reload")
		return
	}
	next, err := r.reread()
	if err == nil {
		err = resolveServePaths(next)
	}
	if err != nil {
		r.logger.Error("reload failed; the configuration in effect stays", "error", err)
		return
	}
	inEffect := *r.args
	inEffect.logLevel = next.logLevel
	waiting := restartOnly(r.args, next)
	node := r.args.node
	if sameListener(r.args.node, next.node) {
		node = next.node
	} else {
		waiting = append(waiting, "http-addr, its token files or its TLS")
	}
	secrets, err := node.load()
	if err != nil {
		r.logger.Error("reload failed; the configuration in effect stays", "error", err)
		return
	}
	inEffect.node = node
	r.logger.SetLevel(hclog.LevelFromString(next.logLevel))
	r.secrets.Store(secrets)
	r.fetchTLS(secrets.fetchTLS)
	r.args = &inEffect
	r.logger.Info("reloaded", "log_level", next.logLevel, "config", next.configFile,
		"tokens", secrets.migrateTokens != nil || secrets.apiToken != "", "tls", secrets.serverTLS != nil || secrets.fetchTLS != nil)
	if len(waiting) > 0 {
		r.logger.Warn("changed flags take effect at the next start", "flags", fmt.Sprint(waiting))
	}
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

// sameListener reports whether next can secure the running listener:
// same address and routes, and TLS on or off as it is. The files
// themselves, and whether client certificates are required, may change.
func sameListener(old, next nodeConfig) bool {
	tlsOn := func(c nodeConfig) bool { return c.tlsCert != "" }
	return old.addr == next.addr && old.servesSnapshots() == next.servesSnapshots() &&
		old.servesClientAPI() == next.servesClientAPI() && tlsOn(old) == tlsOn(next)
}
