//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/api/fsapi"
	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/metrics"
	"github.com/allocfs/allocfs/migrate"
	"github.com/allocfs/allocfs/node"
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
// tears everything down on SIGINT or SIGTERM.
func serve(logger hclog.Logger, cfg serveConfig) error {
	// The FUSE server creates files for callers whose umask the kernel
	// has applied already: its own must be 0 (fs.NewMount checks).
	unix.Umask(0)
	// SIGINT and SIGTERM start the shutdown below instead of killing the
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
	var secrets atomic.Pointer[nodeSecrets]
	if cfg.secrets == nil {
		cfg.secrets = &nodeSecrets{}
	}
	secrets.Store(cfg.secrets)

	// Clients get what the mount and the store leave them, and no more.
	budget, err := netlimit.NewBudget(logger)
	if err != nil {
		return err
	}
	guard, err := netlimit.NewGuard(logger, budget)
	if err != nil {
		return err
	}
	if err := checkLayout(cfg); err != nil {
		return err
	}
	if err := checkFUSE(); err != nil {
		return err
	}
	if err := checkTmpfs(logger); err != nil {
		return err
	}
	// A mount point that cannot be one is refused before the data dir
	// is created; the rest of its preparation waits for the lock. One a
	// holder keeps waits for a daemon: it is not touched.
	if _, _, err := askHolder(holderSocket(cfg.dataDir), "version"); cfg.stored < 0 && (err != nil || !cfg.live) {
		if fi, err := probe(cfg.mountDir, statTimeout); err == nil && !fi.IsDir() {
			return notADirectory(cfg.mountDir, fi)
		}
	}
	s, err := store.OpenWith(logger, cfg.dataDir, cfg.storeOpts)
	if errors.Is(err, store.ErrLocked) && cfg.live {
		if _, mount, _ := store.LockHolder(cfg.dataDir); mount == cfg.mountDir {
			// An upgrade: the running daemon hands its mount over.
			s, err = takeOverRunning(logger, cfg)
		}
	}
	if err != nil {
		return fmt.Errorf("failed to open the store in %q: %w", cfg.dataDir, err)
	}
	// Every return before the end closes the store, which releases the
	// data dir's lock.
	storeOpen := true
	defer func() {
		if storeOpen {
			if err := s.Close(); err != nil {
				logger.Error("failed to close the store", "error", err)
			}
		}
	}()
	if err := s.Announce(cfg.mountDir); err != nil {
		return err
	}
	logQuota(logger, s)
	nodeMetrics := metrics.New(logger)
	s.SetObserver(nodeMetrics.Store())
	// A connection systemd or a holder keeps (a restart, a crash) is
	// taken over; only without one is the mount point prepared for a new
	// mount.
	heldFd, holderPid, holderV := cfg.stored, 0, 0
	var heldMem map[string]int
	if heldFd >= 0 {
		if err := checkHeld(cfg, heldFd, "systemd's descriptor store"); err != nil {
			closeAll(cfg.storedMem)
			return err
		}
		heldMem = storedMemory(s, cfg.storedMem)
	} else {
		// Memory volumes without their connection are of a mount that
		// is gone.
		for name, fd := range cfg.storedMem {
			unix.Close(fd)
			sdNotify("FDSTOREREMOVE=1\nFDNAME=" + name)
		}
		if cfg.live {
			heldFd, holderPid, holderV, err = takeHeld(cfg)
			if err != nil {
				return err
			}
		}
		if heldFd >= 0 && holderV >= 2 {
			if heldMem, err = heldMemory(holderSocket(cfg.dataDir)); err != nil {
				logger.Error("the holder did not hand its memory volumes over: the tasks find secrets/ and private/ empty", "error", err)
			}
		}
	}
	// Only the holder of the data dir's lock may touch the mount point:
	// a second serve on the same data dir must fail before it detaches
	// or mounts anything.
	if heldFd < 0 {
		if err := prepareMountPoint(logger, cfg.mountDir, mountinfoPath, cfg.allowNonEmpty); err != nil {
			return err
		}
	}
	// The socket is bound before the mount comes up (clients that connect
	// meanwhile wait in the backlog) because binding it later would race
	// the FUSE server over the process umask; see listenSocket.
	ln, err := listenSocket(logger, cfg.socket)
	if err != nil {
		return err
	}
	if ln, err = guard.LimitListener(ln, budget.UnixConns, "unix"); err != nil {
		return err
	}

	opts := fs.DefaultMountOptions()
	opts.Debug = cfg.mount.Debug
	opts.IOUring = cfg.mount.IOUring
	opts.ChrootEnv = cfg.mount.ChrootEnv
	opts.Requests = nodeMetrics.FUSE()
	opts.CopyUps = nodeMetrics.CopyUps()
	sizes, err := startNomadSizes(logger, s, cfg.quota)
	if err != nil {
		ln.Close()
		return err
	}
	defer sizes.Close()
	opts.Created = sizes.Created
	var m *fs.Mount
	if heldFd >= 0 {
		opts.HeldMemory = heldMem
		switch {
		case cfg.stored >= 0:
			opts.Memory = systemdKeeper{}
		case holderV >= 2:
			opts.Memory = holderKeeper{holderSocket(cfg.dataDir)}
		}
		m, err = fs.AdoptMount(logger, s, heldFd, opts)
		if err != nil {
			unix.Close(heldFd)
			closeAll(heldMem)
			ln.Close()
			return fmt.Errorf("%w; the mount stays kept for the next serve", err)
		}
		if holderPid != 0 && holderV < 2 {
			// A holder of version 1 keeps no memory volume: a new one
			// takes its place.
			if holderPid, err = replaceHolder(cfg.dataDir, m); err != nil {
				logger.Error("the mount will not survive a crash of this daemon", "error", err)
			}
		}
	} else {
		if m, err = fs.NewMount(logger, s, cfg.mountDir, opts); err != nil {
			ln.Close()
			return err
		}
		if fd, ok := m.FuseFd(); ok && cfg.live && !underSystemd() {
			if holderPid, err = startHolder(cfg.dataDir, fd); err != nil {
				logger.Error("the mount will not survive a crash of this daemon", "error", err)
			} else if err := m.KeepMemory(holderKeeper{holderSocket(cfg.dataDir)}); err != nil {
				logger.Error("the holder did not take every memory volume: those end with this daemon", "error", err)
			}
		}
	}
	sizes.Resume()
	// keeper is what keeps the connection while no daemon runs.
	keeper := ""
	stopWatch := func() {}
	if holderPid != 0 {
		keeper = "holder"
		logger.Info("the FUSE connection's holder runs", "holder_pid", holderPid)
		stopWatch = watchHolder(logger, cfg.dataDir, m, holderPid)
	}
	if fd, ok := m.FuseFd(); ok && cfg.live && underSystemd() {
		// One entry, whatever systemd kept of the last start's.
		sdNotify("FDSTOREREMOVE=1\nFDNAME=" + fuseFDName)
		if err := sdNotify("FDSTORE=1\nFDNAME="+fuseFDName, fd); err != nil {
			logger.Error("the mount will not survive a crash of this daemon", "error", err)
		} else {
			keeper = "systemd"
			logger.Info("the FUSE connection is in systemd's descriptor store")
			if err := m.KeepMemory(systemdKeeper{}); err != nil {
				logger.Error("systemd did not take every memory volume: those end with this daemon", "error", err)
			}
		}
	}

	// Every read of an allocation's files, for the client API and for
	// snapshots, goes through the store, never through the mount; a
	// follower of a collected allocation's file sees it deleted.
	logFusectl(logger)
	svc := node.New(node.Config{
		Logger:      logger,
		Store:       s,
		GC:          cfg.gc,
		MountDir:    m.Dir(),
		Passthrough: m.Passthrough,
		AllocFS:     func(id string) allocdir.FS { return fs.NewAllocDir(logger, s, m, m.Dir(), id) },
		Health:      nodeHealth(m, s, cfg.storeOpts.Quotas),
		Fetches:     nodeMetrics.Fetches(),
	})
	svc.SetFetchTLS(cfg.secrets.fetchTLS)
	apiServer := api.NewServer(logger, svc)
	clientAPI := apiServer.ClientAPI()
	// Deferred after the store's close, so that it runs before it on
	// an early return; the end of serve stops it before closing the store.
	stopMetrics := watchNode(nodeMetrics, m, s, apiServer.Followers, cfg.usageInterval)
	defer stopMetrics()
	metricsHandler := nodeMetrics.Handler()
	srv := guard.HTTPServer(guard.LimitStreams(withMetrics(apiServer, metricsHandler), fsapi.Prefix), "unix")
	// Followers never finish by themselves: a shutdown ends them.
	srv.RegisterOnShutdown(apiServer.StopStreams)
	served := make(chan error, 2)
	go func() { served <- srv.Serve(ln) }()
	var nodeSrv *http.Server
	if cfg.node.addr != "" {
		var tlsCfg *tls.Config
		if cfg.secrets.serverTLS != nil {
			tlsCfg = liveServerTLS(&secrets)
		}
		tcp, err := net.Listen("tcp", cfg.node.addr)
		if err != nil {
			srv.Close()
			return errors.Join(fmt.Errorf("failed to listen on %s: %w", cfg.node.addr, err), m.Unmount())
		}
		if tcp, err = guard.LimitListener(tcp, budget.TCPConns, "tcp"); err != nil {
			srv.Close()
			return errors.Join(err, m.Unmount())
		}
		routes := api.NodeRoutes{MetricsPath: metrics.Path}
		if cfg.node.servesSnapshots() {
			tokens := migrate.TokenCheckerFunc(func(id, token string) bool {
				t := secrets.Load().migrateTokens
				return t != nil && t.Check(id, token)
			})
			routes.Snapshots = guard.LimitStreams(migrate.SnapshotHandler(logger, svc.FS, tokens), "")
		}
		if cfg.node.servesClientAPI() {
			routes.Client, routes.Metrics = guard.LimitStreams(clientAPI, fsapi.Prefix), metricsHandler
		}
		nodeSrv = guard.HTTPServer(api.NodeHandler(guard.Refusals(), nodeTokens(&secrets), routes), "tcp")
		nodeSrv.TLSConfig = tlsCfg
		nodeSrv.RegisterOnShutdown(apiServer.StopStreams)
		go func() {
			if tlsCfg != nil {
				served <- nodeSrv.ServeTLS(tcp, "", "")
				return
			}
			served <- nodeSrv.Serve(tcp)
		}()
		logger.Info("serving other machines", "addr", tcp.Addr().String(), "tls", tlsCfg != nil,
			"mutual_tls", cfg.secrets.serverTLS != nil && cfg.secrets.serverTLS.ClientCAs != nil,
			"snapshots", cfg.node.servesSnapshots(), "client_api", cfg.node.servesClientAPI())
		if tlsCfg == nil {
			// Anyone on the path reads the token, and with it the
			// client API or the snapshots, as they go by.
			logger.Warn("tokens are accepted over plain HTTP: they and the files they admit to travel in clear text; serve with --tls-cert and --tls-key", "addr", tcp.Addr().String())
		}
	}
	gcCtx, stopGC := context.WithCancel(context.Background())
	gcDone := make(chan struct{})
	go func() {
		defer close(gcDone)
		svc.Run(gcCtx)
	}()
	logger.Info("serving", "data_dir", cfg.dataDir, "mount", m.Dir(), "socket", cfg.socket,
		"passthrough", m.Passthrough(), "allocations", s.Len())
	if err := sdNotify("READY=1\nSTATUS=serving " + m.Dir()); err != nil {
		logger.Warn("systemd was not told the daemon is ready", "error", err)
	}

	var failure error
	// leave hands the connection to the holder instead of unmounting.
	leave := false
	reloader := &reloader{logger: logger, args: cfg.args, reread: cfg.reread, secrets: &secrets, fetchTLS: svc.SetFetchTLS}
wait:
	for {
		select {
		case <-hups:
			sdNotify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonicUsec()))
			reloader.reload()
			sdNotify("READY=1")
		case sig := <-sigs:
			if keeper == "holder" && !holderAlive(cfg.dataDir) {
				logger.Error("the FUSE connection's holder is gone: this daemon's end will end the mount", "holder_pid", holderPid)
				keeper = ""
			}
			if sig == sigHandOver {
				reason := ""
				if held := m.MemoryInUse(); len(held) > 0 {
					// An upgrade must not cost a task its secrets.
					reason = fmt.Sprintf("memory volumes hold data that nothing but this process keeps, which would be lost: %s; stop those allocations, or stop this daemon with SIGTERM, which leaves the mount with them empty", strings.Join(held, ", "))
				}
				if keeper == "" {
					reason = "nothing keeps its FUSE connection (--live-restart=false, or the holder died): the mount would end with it"
				}
				if reason != "" {
					logger.Error("refused to hand the mount over", "reason", reason)
					refuseHandOver(cfg.dataDir, reason)
					continue
				}
			}
			leave = keeper != "" && (sig == sigHandOver || sig != sigFullStop && anyRunning(s))
			sdNotify("STOPPING=1")
			if leave {
				if held := m.MemoryInUse(); len(held) > 0 {
					logger.Warn("leaving the mount: the content of its memory volumes is lost, the next serve starts them empty", "volumes", strings.Join(held, ", "))
				}
				logger.Info("shutting down; the mount stays for the next serve", "signal", sig.String(), "kept_by", keeper)
			} else {
				logger.Info("shutting down", "signal", sig.String())
			}
			break wait
		case err := <-served:
			failure = fmt.Errorf("control API stopped: %w", err)
			logger.Error("control API stopped; shutting down", "error", err)
			break wait
		}
	}
	// The holder, from now on, is left as it is: kept for the next
	// daemon, or stopped with the mount.
	stopWatch()
	// A second signal means "now": leave at once, detaching the mount
	// unless it stays with its holder. Another hand-over request (two
	// upgrades racing) changes nothing.
	go func() {
		for sig := range sigs {
			if sig == sigHandOver && leave {
				continue
			}
			logger.Error("second signal: exiting without a clean shutdown", "signal", sig.String())
			if !leave {
				if err := unix.Unmount(cfg.mountDir, unix.MNT_DETACH); err != nil {
					logger.Error("lazy unmount failed", "error", err)
				}
			}
			os.Exit(exitFailed)
		}
	}()

	stopGC()
	<-gcDone
	logger.Info("stopping control API")
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	// Both at once, so that the second does not get what the first left
	// of the timeout.
	nodeDown := make(chan error, 1)
	go func() {
		if nodeSrv == nil {
			nodeDown <- nil
			return
		}
		nodeDown <- nodeSrv.Shutdown(ctx)
	}()
	err = errors.Join(srv.Shutdown(ctx), <-nodeDown)
	cancel()
	if err != nil {
		logger.Warn("requests still running after the timeout; closing their connections", "timeout", shutdownTimeout, "error", err)
		srv.Close()
		if nodeSrv != nil {
			nodeSrv.Close()
		}
	}
	svc.Wait()
	stopMetrics()
	logger.Info("control API stopped")

	if leave {
		// What the kernel sends from now on waits for the next serve,
		// which has it sent again.
		if err := m.Park(parkTimeout); err != nil {
			logger.Warn("leaving the mount with requests in progress; the next serve runs them again", "error", err)
		}
		storeOpen = false
		if err := s.Close(); err != nil {
			failure = errors.Join(failure, fmt.Errorf("failed to close the store: %w", err))
		}
		logger.Info("stopped; the mount waits for the next serve", "mount", m.Dir(), "kept_by", keeper)
		return failure
	}
	logger.Info("unmounting", "mount", m.Dir())
	uerr := m.Unmount()
	if keeper == "systemd" {
		sdNotify("FDSTOREREMOVE=1\nFDNAME=" + fuseFDName)
	}
	if keeper == "holder" {
		// After a lazy detach the connection lives on in the files still
		// open: without its holder it ends with this daemon.
		askHolder(holderSocket(cfg.dataDir), "stop")
	}
	if uerr != nil {
		logger.Error("unmount failed", "mount", m.Dir(), "error", uerr)
		return errors.Join(failure, fmt.Errorf("failed to unmount %q: %w; detach it with: umount -l %s", m.Dir(), uerr, m.Dir()))
	}
	logger.Info("unmounted", "mount", m.Dir())
	storeOpen = false
	if err := s.Close(); err != nil {
		failure = errors.Join(failure, fmt.Errorf("failed to close the store: %w", err))
	}
	if failure != nil {
		return failure
	}
	logger.Info("stopped")
	return nil
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
