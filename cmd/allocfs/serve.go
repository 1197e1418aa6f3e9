//go:build linux

package main

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/metrics"
	"github.com/hashicorp/go-hclog"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
)

const (
	defaultDataDir = "/var/lib/allocfs"

	// shutdownTimeout bounds how long requests in flight may keep the
	// API up once a signal asked the daemon to stop.
	shutdownTimeout = 5 * time.Second
)

const serveCmd = "allocfs serve"

// serveArgs are serve's flags, from --config's file and the command line.
type serveArgs struct {
	configFile                      string
	dataDir, mountDir, socket       string
	logLevel                        string
	logJSON, debugFuse, fuseIOUring bool
	liveRestart, allowNonEmpty      bool
	node                            nodeConfig
	gc                              store.GCConfig
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
	a.gc = store.DefaultGCConfig()
	fset.StringVar(&a.configFile, "config", "", "`file` of flags, one per line (--log-level=debug; # starts a comment), read before the command line, whose flags win; SIGHUP reads it again")
	fset.StringVar(&a.dataDir, "data-dir", defaultDataDir, "backing `directory`: every byte of every allocation lives here")
	fset.StringVar(&a.mountDir, "mount", "", "mount `point` (default <data-dir>/mnt)")
	fset.BoolVar(&a.allowNonEmpty, "allow-non-empty", false, "mount over a mount point that holds files, hiding them (refused otherwise)")
	fset.StringVar(&a.socket, "socket", "", "control API unix socket `path` (default <data-dir>/allocfs.sock)")
	fset.StringVar(&a.logLevel, "log-level", "info", "log `level`: trace, debug, info, warn or error")
	fset.BoolVar(&a.logJSON, "log-json", false, "log JSON lines instead of text")
	fset.BoolVar(&a.liveRestart, "live-restart", true, "keep the mount alive across restarts: a holder process keeps the FUSE connection, the next serve takes it over (after a crash too), and SIGTERM with running allocations leaves it to that one; false: every stop unmounts")
	fset.BoolVar(&a.fuseIOUring, "fuse-io-uring", false, "take FUSE requests over io_uring where the kernel allows it (Linux 6.14+, /sys/module/fuse/parameters/enable_uring set to Y), about twice as fast for metadata; needs --live-restart=false, since the kernel resends nothing a dead daemon's rings held")
	fset.BoolVar(&a.debugFuse, "debug-fuse", false, "log every FUSE request and reply (very verbose; served by go-fuse's server, which has the trace)")
	fset.StringVar(&a.node.addr, "http-addr", "", "also serve other machines on this TCP `address` (host:port): snapshots for remote migration and, with --token-file, the client API")
	fset.StringVar(&a.node.migrateTokenFile, "migrate-token-file", "", "`file` holding the cluster's shared migration token, which admits snapshot requests")
	fset.StringVar(&a.node.nodeSecretFile, "node-secret-file", "", "`file` holding this node's secret (Nomad's node SecretID): snapshot requests with the migrate token Nomad derives from it are admitted")
	fset.StringVar(&a.node.apiTokenFile, "token-file", "", "`file` holding the token (X-Nomad-Token or Authorization: Bearer) that the client API on --http-addr requires")
	fset.StringVar(&a.node.tlsCert, "tls-cert", "", "this node's certificate `file` (PEM): --http-addr serves TLS with it, and fetches from other nodes present it")
	fset.StringVar(&a.node.tlsKey, "tls-key", "", "the private key `file` (PEM) of --tls-cert")
	fset.StringVar(&a.node.tlsCA, "tls-ca", "", "the cluster's CA `file` (PEM): --http-addr requires client certificates it signed (mutual TLS), and fetches trust the nodes it signed")
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
	stored, storedMem := listenedFds()
	a, err := parseServeArgs(e, args)
	if err != nil {
		return err
	}
	secrets, err := a.node.load()
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
	return serve(logger, serveConfig{
		dataDir:       a.dataDir,
		mountDir:      a.mountDir,
		socket:        a.socket,
		mount:         fs.MountOptions{Debug: a.debugFuse, IOUring: a.fuseIOUring, ChrootEnv: chrootEnv},
		live:          a.liveRestart && !a.debugFuse,
		allowNonEmpty: a.allowNonEmpty,
		stored:        stored,
		storedMem:     storedMem,
		node:          a.node,
		secrets:       secrets,
		gc:            a.gc,
		usageInterval: a.metricsUsageInterval,
		storeOpts:     storeOpts,
		quota:         a.quota,
		args:          a,
		reread:        func() (*serveArgs, error) { return parseServeArgs(e, args) },
	})
}

// serveConfig is what serve needs, with every path absolute and free of
// symbolic links as far as it exists.
type serveConfig struct {
	dataDir  string
	mountDir string
	socket   string
	mount    fs.MountOptions
	// live keeps the connection alive across restarts (holder.go).
	live bool
	// allowNonEmpty mounts over a mount point that holds files.
	allowNonEmpty bool
	// stored is the FUSE connection systemd passed from its descriptor
	// store (systemd.go), or -1.
	stored int
	// storedMem are the memory volumes' descriptors systemd passed with
	// it, by their names in the store (memkeep.go).
	storedMem map[string]int
	// node is what other machines reach over TCP, and secrets what its
	// files held at the start.
	node    nodeConfig
	secrets *nodeSecrets
	gc      store.GCConfig
	// usageInterval is how often the metrics' allocation usage is
	// measured.
	usageInterval time.Duration
	// storeOpts are the store's options: its disk limits; quota the
	// flags they came from.
	storeOpts store.Options
	quota     quotaArgs
	// args are the flags serve started with, and reread parses them
	// again, for SIGHUP; nil reread: nothing to reload.
	args   *serveArgs
	reread func() (*serveArgs, error)
}

// serve checks the machine, opens the store, mounts it, serves the API and
// tears everything down on SIGINT or SIGTERM (daemon.go).
func serve(logger hclog.Logger, cfg serveConfig) error {
	// The FUSE server creates files for callers whose umask the kernel
	// has applied already: its own must be 0 (fs.NewMount checks).
	unix.Umask(0)
	// SIGINT and SIGTERM start the shutdown instead of killing the
	// process. One that arrives while the mount comes up is acted on as
	// soon as it is up.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, sigFullStop, sigHandOver)
	defer signal.Stop(sigs)
	// SIGHUP, which a closed terminal or a reload by habit sends,
	// reloads (reload.go) and never stops the daemon.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	d := &daemon{logger: logger, cfg: cfg}
	if err := d.start(); err != nil {
		return err
	}
	leave, failure := d.wait(sigs, hups)
	go d.exitOnSecondSignal(sigs, leave)
	return errors.Join(failure, d.shutdown(leave))
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

// listenSocket binds the control socket with mode 0600 (the API can
// destroy allocations). A socket left by a daemon that died is removed; one
// that still answers belongs to a live daemon, and anything that is not a
// socket is left alone.
//
// The umask is set to 0177 around bind(2) so the socket never exists with
// a wider mode, then chmod makes sure of it. This must happen before
// fs.NewMount: the FUSE server, which runs with umask 0, must not see it
// change while it creates files.
func listenSocket(logger hclog.Logger, path string) (net.Listener, error) {
	// sun_path holds 108 bytes including the terminating NUL.
	if len(path) > 107 {
		return nil, fmt.Errorf("socket path %q is %d bytes, more than a unix socket allows (107): pass a shorter --socket", path, len(path))
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("failed to create the socket's directory: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case err == nil && fi.Mode().Type() == os.ModeSocket:
		if conn, err := net.DialTimeout("unix", path, time.Second); err == nil {
			conn.Close()
			return nil, fmt.Errorf("another allocfs is listening on %s; stop it first", path)
		}
		logger.Info("removing stale socket", "socket", path)
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("failed to remove stale socket %q: %w", path, err)
		}
	case err == nil:
		return nil, fmt.Errorf("%q exists and is not a socket (%s): move it away or pass another --socket", path, fi.Mode().Type())
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("failed to inspect socket path %q: %w", path, err)
	}

	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("failed to listen on %q: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("failed to restrict socket %q to its owner: %w", path, err)
	}
	return ln, nil
}
