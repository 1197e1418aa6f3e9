//go:build linux

package main

import (
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/daemon"
	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store/gc"
	"github.com/allocfs/allocfs/metrics"
	"github.com/allocfs/allocfs/restart"
	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

const defaultDataDir = "/var/lib/allocfs"

const serveCmd = "allocfs serve"

// serveArgs are serve's flags, from --config's file and the command line.
type serveArgs struct {
	configFile                      string
	dataDir, mountDir, socket       string
	logLevel                        string
	logJSON, debugFuse, fuseIOUring bool
	liveRestart, allowNonEmpty      bool
	allowSuid                       bool
	node                            daemon.NodeConfig
	gc                              gc.Config
	metricsUsageInterval            time.Duration
	chrootEnv                       []string
	quota                           quotaArgs
}

// newServeFlags returns serve's flag set, parsing into a.
func newServeFlags(e *env, a *serveArgs) *pflag.FlagSet {
	fset := newFlagSet(e, serveCmd, "[flags]", `
Mount the allocation directories at --mount and serve the control API on
--socket until SIGINT or SIGTERM. Every allocation recorded in --data-dir is
back in the mount when serve starts. On a signal the API stops first, then
the mount is detached; a mount that cannot be detached makes serve exit 1.

SIGHUP reloads: --config's file is read again, and with it the log level,
the token files and the TLS files take effect (a rotated certificate or
token needs nothing more). Other flags take effect at the next start; a
reload that changes them says so in the log.`)
	a.gc = gc.DefaultConfig()
	fset.StringVar(&a.configFile, "config", "", "`file` of flags, one per line (--log-level=debug; # starts a comment), read before the command line, whose flags win; SIGHUP reads it again")
	fset.StringVar(&a.dataDir, "data-dir", defaultDataDir, "backing `directory`: every byte of every allocation lives here")
	fset.StringVar(&a.mountDir, "mount", "", "mount `point` (default <data-dir>/mnt)")
	fset.BoolVar(&a.allowNonEmpty, "allow-non-empty", false, "mount over a mount point that holds files, hiding them (refused otherwise)")
	fset.StringVar(&a.socket, "socket", "", "control API unix socket `path` (default <data-dir>/allocfs.sock)")
	fset.StringVar(&a.logLevel, "log-level", "info", "log `level`: trace, debug, info, warn or error")
	fset.BoolVar(&a.logJSON, "log-json", false, "log JSON lines instead of text")
	fset.BoolVar(&a.liveRestart, "live-restart", true, "keep the mount alive across restarts: a holder process keeps the FUSE connection, the next serve takes it over (after a crash too), and SIGTERM with running allocations leaves it to that one; false: every stop unmounts")
	fset.BoolVar(&a.fuseIOUring, "fuse-io-uring", false, "take FUSE requests over io_uring where the kernel allows it (Linux 6.14+, /sys/module/fuse/parameters/enable_uring set to Y), about twice as fast for metadata; needs --live-restart=false, since the kernel resends nothing a dead daemon's rings held")
	fset.BoolVar(&a.allowSuid, "allow-suid", false, "mount without nosuid, so that set-uid and set-gid bits and file capabilities of the allocations' files take effect when they run (an exec task's chroot ping or sudo), as on a local disk; off by default because a task could then gain privileges from a file it can write, or that a migration brought in; nodev stays; a live restart keeps the mount as it was made")
	fset.BoolVar(&a.debugFuse, "debug-fuse", false, "log every FUSE request and reply (very verbose; served by go-fuse's server, which has the trace)")
	fset.StringVar(&a.node.Addr, "http-addr", "", "also serve other machines on this TCP `address` (host:port): snapshots for remote migration and, with --token-file, the client API")
	fset.StringVar(&a.node.MigrateTokenFile, "migrate-token-file", "", "`file` holding the cluster's shared migration token, which admits snapshot requests")
	fset.StringVar(&a.node.NodeSecretFile, "node-secret-file", "", "`file` holding this node's secret (Nomad's node SecretID): snapshot requests with the migrate token Nomad derives from it are admitted")
	fset.StringVar(&a.node.APITokenFile, "token-file", "", "`file` holding the token (X-Nomad-Token or Authorization: Bearer) that the client API on --http-addr requires")
	fset.StringVar(&a.node.TLSCert, "tls-cert", "", "this node's certificate `file` (PEM): --http-addr serves TLS with it, and fetches from other nodes present it")
	fset.StringVar(&a.node.TLSKey, "tls-key", "", "the private key `file` (PEM) of --tls-cert")
	fset.StringVar(&a.node.TLSCA, "tls-ca", "", "the cluster's CA `file` (PEM): --http-addr requires client certificates it signed (mutual TLS), and fetches trust the nodes it signed")
	fset.DurationVar(&a.gc.Interval, "gc-interval", a.gc.Interval, "how often the collector checks the node's `duration`")
	fset.Float64Var(&a.gc.DiskUsagePercent, "gc-disk-usage-threshold", a.gc.DiskUsagePercent, "collect terminal allocations while the data dir's disk is fuller than this `percent` (0: never)")
	fset.Float64Var(&a.gc.InodeUsagePercent, "gc-inode-usage-threshold", a.gc.InodeUsagePercent, "likewise for inodes, in `percent` (0: never)")
	fset.IntVar(&a.gc.MaxAllocs, "gc-max-allocs", a.gc.MaxAllocs, "collect terminal allocations while there are more than this `number` (0: no limit)")
	fset.DurationVar(&a.metricsUsageInterval, "metrics-usage-interval", metrics.DefaultUsageInterval, "how often the allocations' usage in /v1/metrics is measured again, by a walk of their layers (`duration`; the series are up to that old)")
	addQuotaFlags(fset, &a.quota)
	fset.StringSliceVar(&a.chrootEnv, "chroot-env", defaultChrootEnv(), "Nomad's chroot_env: host `paths` (PATH, or HOST=DEST for another place) that a task directory Nomad builds a chroot in shows, read-only below the task's own files, so that Nomad copies none; the same list as the Nomad client's; empty for none")
	return fset
}

// defaultChrootEnv is Nomad's default chroot_env, as --chroot-env takes it.
func defaultChrootEnv() []string {
	var out []string
	for src := range fs.DefaultChrootEnv() {
		out = append(out, src)
	}
	sort.Strings(out)
	return out
}

// chrootEnvMap turns --chroot-env's entries into Nomad's chroot_env map.
func chrootEnvMap(entries []string) (map[string]string, error) {
	env := make(map[string]string)
	for _, e := range entries {
		if e == "" {
			continue
		}
		src, dest, ok := strings.Cut(e, "=")
		if !ok {
			dest = src
		}
		if !filepath.IsAbs(src) || !filepath.IsAbs(dest) {
			return nil, fmt.Errorf("--chroot-env %q: host path and destination must be absolute", e)
		}
		env[src] = dest
	}
	return env, nil
}

// parseServeArgs parses serve's command line, and the file its --config
// names before it, and checks what can be checked without the machine.
func parseServeArgs(e *env, args []string) (*serveArgs, error) {
	a := &serveArgs{}
	if err := parseFlags(newServeFlags(e, a), args, 0, 0); err != nil {
		return nil, err
	}
	if a.configFile != "" {
		fileArgs, err := readConfigFile(a.configFile)
		if err != nil {
			return nil, usageErrorf(serveCmd, "%v", err)
		}
		configFile := a.configFile
		a = &serveArgs{}
		if err := parseFlags(newServeFlags(e, a), append(fileArgs, args...), 0, 0); err != nil {
			return nil, err
		}
		a.configFile = configFile
	}
	if hclog.LevelFromString(a.logLevel) == hclog.NoLevel {
		return nil, usageErrorf(serveCmd, "unknown --log-level %q: use trace, debug, info, warn or error", a.logLevel)
	}
	if a.dataDir == "" {
		return nil, usageErrorf(serveCmd, "--data-dir must not be empty")
	}
	if a.liveRestart && a.fuseIOUring {
		return nil, usageErrorf(serveCmd, "--fuse-io-uring needs --live-restart=false: after a crash, the kernel would not resend the requests the dead daemon's rings held, and their callers would wait forever")
	}
	if a.metricsUsageInterval <= 0 {
		return nil, usageErrorf(serveCmd, "--metrics-usage-interval must be more than 0")
	}
	if _, err := chrootEnvMap(a.chrootEnv); err != nil {
		return nil, usageErrorf(serveCmd, "%v", err)
	}
	if _, err := a.quota.storeOptions(); err != nil {
		return nil, usageErrorf(serveCmd, "%v", err)
	}
	if a.mountDir == "" {
		a.mountDir = filepath.Join(a.dataDir, "mnt")
	}
	if a.socket == "" {
		a.socket = filepath.Join(a.dataDir, "allocfs.sock")
	}
	return a, nil
}

// readConfigFile returns the flags of a --config file: one per line, as
// "--name=value", "--name value" or "--name" for a boolean; blank lines
// and lines starting with # are skipped.
func readConfigFile(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read the config file: %w", err)
	}
	var args []string
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if !strings.HasPrefix(line, "--") {
			return nil, fmt.Errorf("%s:%d: %q is not a flag (--name=value)", path, i+1, line)
		}
		name, value, spaced := strings.Cut(line, " ")
		if n, _, _ := strings.Cut(name, "="); n == "--config" {
			return nil, fmt.Errorf("%s:%d: --config cannot name another file", path, i+1)
		}
		if spaced {
			args = append(args, name+"="+strings.TrimSpace(value))
		} else {
			args = append(args, name)
		}
	}
	return args, nil
}

func runServe(e *env, args []string) error {
	// Taken before anything else: the variables describe this process's
	// descriptors as it started.
	stored, storedMem := restart.ListenedFds()
	a, err := parseServeArgs(e, args)
	if err != nil {
		return err
	}
	secrets, err := a.node.Load()
	if err != nil {
		return usageErrorf(serveCmd, "%v", err)
	}
	if err := resolveServePaths(a); err != nil {
		return err
	}
	chrootEnv, _ := chrootEnvMap(a.chrootEnv)
	storeOpts, err := a.quota.storeOptions()
	if err != nil {
		return usageErrorf(serveCmd, "%v", err)
	}
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       "allocfs",
		Level:      hclog.LevelFromString(a.logLevel),
		JSONFormat: a.logJSON,
		Output:     e.stderr,
	})
	// go-fuse's bridge reports a node it does not know through the
	// standard logger as it panics; after a takeover that is how every
	// inherited node is found (fs/takeover.go), so it is debug talk.
	log.SetFlags(0)
	log.SetOutput(logger.Named("fuse").StandardWriter(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}))
	r := &reloader{args: a, reread: func() (*serveArgs, error) { return parseServeArgs(e, args) }}
	return serve(logger, daemon.Config{
		DataDir:        a.dataDir,
		MountDir:       a.mountDir,
		Socket:         a.socket,
		Mount:          fs.MountOptions{Debug: a.debugFuse, IOUring: a.fuseIOUring, AllowSuid: a.allowSuid, ChrootEnv: chrootEnv},
		Live:           a.liveRestart && !a.debugFuse,
		AllowNonEmpty:  a.allowNonEmpty,
		Stored:         stored,
		StoredMem:      storedMem,
		Node:           a.node,
		Secrets:        secrets,
		GC:             a.gc,
		UsageInterval:  a.metricsUsageInterval,
		StoreOpts:      storeOpts,
		NomadAddr:      a.quota.nomadAddr,
		NomadTokenFile: a.quota.nomadTokenFile,
		Reload:         r.reload,
	})
}

// serve runs the daemon of cfg until SIGINT or SIGTERM (package daemon).
func serve(logger hclog.Logger, cfg daemon.Config) error {
	// The FUSE server creates files for callers whose umask the kernel
	// has applied already: its own must be 0 (fs.NewMount checks).
	unix.Umask(0)
	// SIGINT and SIGTERM start the shutdown instead of killing the
	// process. One that arrives while the mount comes up is acted on as
	// soon as it is up.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, restart.SigFullStop, restart.SigHandOver)
	defer signal.Stop(sigs)
	// SIGHUP, which a closed terminal or a reload by habit sends,
	// reloads (reload.go) and never stops the daemon.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	d := daemon.New(logger, cfg)
	if err := d.Start(); err != nil {
		return err
	}
	leave, failure := d.Wait(sigs, hups)
	go d.ExitOnSecondSignal(sigs, leave)
	return errors.Join(failure, d.Shutdown(leave))
}

// resolvePath makes p absolute and resolves the symbolic links of its
// longest existing prefix, so that paths can be compared with each other
// and with /proc/self/mountinfo.
func resolvePath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("failed to resolve %q: %w", p, err)
	}
	var rest []string
	for dir := abs; ; dir = filepath.Dir(dir) {
		real, err := filepath.EvalSymlinks(dir)
		if err == nil {
			return filepath.Join(append([]string{real}, rest...)...), nil
		}
		if dir == filepath.Dir(dir) {
			return abs, nil
		}
		rest = append([]string{filepath.Base(dir)}, rest...)
	}
}
