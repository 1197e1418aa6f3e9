//go:build linux

package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/api/fsapi"
	"github.com/allocfs/allocfs/api/netlimit"
	"github.com/allocfs/allocfs/fs"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/lock"
	"github.com/allocfs/allocfs/internal/mountinfo"
	"github.com/allocfs/allocfs/metrics"
	"github.com/allocfs/allocfs/migrate"
	"github.com/allocfs/allocfs/node"
	"github.com/allocfs/allocfs/restart"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// shutdownTimeout bounds how long requests in flight may keep the API up
// once a signal asked the daemon to stop.
const shutdownTimeout = 5 * time.Second

// Daemon is one run of serve: the store, the mount, the services over
// them and what keeps the FUSE connection while no daemon runs. Start
// brings it up in that order, Wait serves until a signal, and Shutdown
// takes it down in the reverse order, unmounting or leaving the mount to
// its keeper.
type Daemon struct {
	logger  hclog.Logger
	cfg     Config
	secrets atomic.Pointer[NodeSecrets]

	// Clients get what the mount and the store leave them, and no more.
	budget netlimit.Budget
	guard  *netlimit.Guard

	store     *store.Store
	storeOpen bool
	metrics   *metrics.Metrics
	sizes     *node.NomadSizes
	mount     *fs.Mount
	// keeper is what keeps the connection while no daemon runs: "holder",
	// "systemd" or "" for nothing; holderPid is the holder's process.
	keeper    string
	holderPid int
	stopWatch func()

	svc       *node.Service
	apiServer *api.Server
	// metricsHandler serves /v1/metrics on both listeners.
	metricsHandler http.Handler
	srv            *http.Server // the control socket's
	nodeSrv        *http.Server // --http-addr's, or nil
	served         chan error
	stopMetrics    func()
	stopGC         func()
	gcDone         chan struct{}
	// failed is set when the control API stopped by itself.
	failed bool
}

// New returns the daemon of cfg, logging to logger; nothing runs yet.
func New(logger hclog.Logger, cfg Config) *Daemon {
	return &Daemon{logger: logger, cfg: cfg}
}

// Start brings the daemon up. On failure it has closed what it opened,
// except a mount it could not give up (the error says so).
func (d *Daemon) Start() (err error) {
	d.stopWatch, d.stopMetrics, d.stopGC = func() {}, func() {}, func() {}
	if d.cfg.Secrets == nil {
		d.cfg.Secrets = &NodeSecrets{}
	}
	d.secrets.Store(d.cfg.Secrets)
	if d.budget, err = netlimit.NewBudget(d.logger); err != nil {
		return err
	}
	if d.guard, err = netlimit.NewGuard(d.logger, d.budget); err != nil {
		return err
	}
	if err := preflight(d.logger, d.cfg); err != nil {
		return err
	}
	// Every return from here on with an error closes the store, which
	// releases the data dir's lock.
	defer func() {
		if err == nil {
			return
		}
		if cerr := d.closeStore(); cerr != nil {
			d.logger.Error("failed to close the store", "error", cerr)
		}
	}()
	if err := d.openStore(); err != nil {
		return err
	}
	ln, err := d.attach()
	if err != nil {
		return err
	}
	d.startServices()
	d.srv = d.guard.HTTPServer(d.guard.LimitStreams(withMetrics(d.apiServer, d.metricsHandler), fsapi.Prefix), "unix")
	// Followers never finish by themselves: a shutdown ends them.
	d.srv.RegisterOnShutdown(d.apiServer.StopStreams)
	d.served = make(chan error, 2)
	go func() { d.served <- d.srv.Serve(ln) }()
	if d.cfg.Node.Addr != "" {
		if err := d.serveNode(); err != nil {
			d.srv.Close()
			d.stopMetrics()
			d.sizes.Close()
			return errors.Join(err, d.mount.Unmount())
		}
	}
	gcCtx, stopGC := context.WithCancel(context.Background())
	d.stopGC, d.gcDone = stopGC, make(chan struct{})
	go func() {
		defer close(d.gcDone)
		d.svc.Run(gcCtx)
	}()
	d.logger.Info("serving", "data_dir", d.cfg.DataDir, "mount", d.mount.Dir(), "socket", d.cfg.Socket,
		"passthrough", d.mount.Passthrough(), "allocations", d.store.Len())
	if err := restart.Notify("READY=1\nSTATUS=serving " + d.mount.Dir()); err != nil {
		d.logger.Warn("systemd was not told the daemon is ready", "error", err)
	}
	return nil
}

// preflight checks the machine and the paths before anything is opened.
func preflight(logger hclog.Logger, cfg Config) error {
	if err := checkLayout(cfg); err != nil {
		return err
	}
	if err := CheckFUSE(); err != nil {
		return err
	}
	if err := checkTmpfs(logger); err != nil {
		return err
	}
	// A mount point that cannot be one is refused before the data dir
	// is created; the rest of its preparation waits for the lock. One a
	// holder keeps waits for a daemon: it is not touched.
	if _, _, err := restart.AskHolder(restart.HolderSocket(cfg.DataDir), "version"); cfg.Stored < 0 && (err != nil || !cfg.Live) {
		if fi, err := probe(cfg.MountDir, statTimeout); err == nil && !fi.IsDir() {
			return notADirectory(cfg.MountDir, fi)
		}
	}
	return nil
}

// openStore opens the store, taking it over from a running daemon for
// an upgrade, and announces the mount point in it.
func (d *Daemon) openStore() error {
	s, err := store.OpenWith(d.logger, d.cfg.DataDir, d.cfg.StoreOpts)
	if errors.Is(err, lock.ErrLocked) && d.cfg.Live {
		if _, mount, _ := lock.Holder(d.cfg.DataDir); mount == d.cfg.MountDir {
			// An upgrade: the running daemon hands its mount over.
			s, err = restart.TakeOverRunning(d.logger, d.cfg.DataDir, d.cfg.StoreOpts)
		}
	}
	if err != nil {
		return fmt.Errorf("failed to open the store in %q: %w", d.cfg.DataDir, err)
	}
	// Until closeStore, which releases the data dir's lock.
	d.store, d.storeOpen = s, true
	if err := s.Announce(d.cfg.MountDir); err != nil {
		return err
	}
	logQuota(d.logger, s)
	d.metrics = metrics.New(d.logger)
	s.SetObserver(d.metrics.Store())
	return nil
}

// closeStore closes the store once, releasing the data dir's lock.
func (d *Daemon) closeStore() error {
	if !d.storeOpen {
		return nil
	}
	d.storeOpen = false
	if err := d.store.Close(); err != nil {
		return fmt.Errorf("failed to close the store: %w", err)
	}
	return nil
}

// attach takes over the connection systemd or a holder keeps (a restart,
// a crash), or mounts anew on a prepared mount point, and hands the new
// connection to its keeper. It returns the control socket's listener,
// bound before the mount comes up: clients that connect meanwhile wait in
// the backlog, and binding later would race the FUSE server over the
// process umask (listenSocket).
func (d *Daemon) attach() (net.Listener, error) {
	cfg := d.cfg
	heldFd, holderV := cfg.Stored, 0
	var heldMem map[string]int
	var err error
	if heldFd >= 0 {
		if err := restart.CheckHeld(cfg.DataDir, cfg.MountDir, heldFd, "systemd's descriptor store"); err != nil {
			restart.CloseAll(cfg.StoredMem)
			return nil, err
		}
		heldMem = restart.StoredMemory(d.store, cfg.StoredMem)
	} else {
		// Memory volumes without their connection are of a mount that
		// is gone.
		for name, fd := range cfg.StoredMem {
			unix.Close(fd)
			restart.Notify("FDSTOREREMOVE=1\nFDNAME=" + name)
		}
		if cfg.Live {
			if heldFd, d.holderPid, holderV, err = restart.TakeHeld(cfg.DataDir, cfg.MountDir); err != nil {
				return nil, err
			}
		}
		if heldFd >= 0 && holderV >= 2 {
			if heldMem, err = restart.HeldMemory(restart.HolderSocket(cfg.DataDir)); err != nil {
				d.logger.Error("the holder did not hand its memory volumes over: the tasks find secrets/ and private/ empty", "error", err)
			}
		}
	}
	// Only the holder of the data dir's lock may touch the mount point:
	// a second serve on the same data dir must fail before it detaches
	// or mounts anything.
	if heldFd < 0 {
		if err := prepareMountPoint(d.logger, cfg.MountDir, mountinfoPath, cfg.AllowNonEmpty); err != nil {
			return nil, err
		}
	}
	ln, err := listenSocket(d.logger, cfg.Socket)
	if err != nil {
		return nil, err
	}
	if ln, err = d.guard.LimitListener(ln, d.budget.UnixConns, "unix"); err != nil {
		return nil, err
	}
	opts := fs.DefaultMountOptions()
	opts.Debug = cfg.Mount.Debug
	opts.IOUring = cfg.Mount.IOUring
	opts.AllowSuid = cfg.Mount.AllowSuid
	opts.ChrootEnv = cfg.Mount.ChrootEnv
	opts.Requests = d.metrics.FUSE()
	opts.CopyUps = d.metrics.CopyUps()
	if d.sizes, err = startNomadSizes(d.logger, d.store, cfg.NomadAddr, cfg.NomadTokenFile); err != nil {
		ln.Close()
		return nil, err
	}
	opts.Created = d.sizes.Created
	if heldFd >= 0 {
		err = d.adopt(heldFd, holderV, heldMem, opts)
	} else {
		err = d.mountNew(opts)
	}
	if err != nil {
		d.sizes.Close()
		ln.Close()
		return nil, err
	}
	d.sizes.Resume()
	if d.holderPid != 0 {
		d.keeper = "holder"
		d.logger.Info("the FUSE connection's holder runs", "holder_pid", d.holderPid)
		d.stopWatch = restart.WatchHolder(d.logger, cfg.DataDir, d.mount, d.holderPid)
	}
	if fd, ok := d.mount.FuseFd(); ok && cfg.Live && restart.UnderSystemd() {
		// One entry, whatever systemd kept of the last start's.
		restart.Notify("FDSTOREREMOVE=1\nFDNAME=" + restart.FuseFDName)
		if err := restart.Notify("FDSTORE=1\nFDNAME="+restart.FuseFDName, fd); err != nil {
			d.logger.Error("the mount will not survive a crash of this daemon", "error", err)
		} else {
			d.keeper = "systemd"
			d.logger.Info("the FUSE connection is in systemd's descriptor store")
			if err := d.mount.KeepMemory(restart.SystemdKeeper{}); err != nil {
				d.logger.Error("systemd did not take every memory volume: those end with this daemon", "error", err)
			}
		}
	}
	return ln, nil
}

// adopt serves the kept connection heldFd, with the memory volumes its
// keeper handed over.
func (d *Daemon) adopt(heldFd, holderV int, heldMem map[string]int, opts fs.MountOptions) error {
	opts.HeldMemory = heldMem
	switch {
	case d.cfg.Stored >= 0:
		opts.Memory = restart.SystemdKeeper{}
	case holderV >= 2:
		opts.Memory = restart.HolderKeeper{Socket: restart.HolderSocket(d.cfg.DataDir)}
	}
	m, err := fs.AdoptMount(d.logger, d.store, heldFd, opts)
	if err != nil {
		unix.Close(heldFd)
		restart.CloseAll(heldMem)
		return fmt.Errorf("%w; the mount stays kept for the next serve", err)
	}
	d.mount = m
	warnSuidKept(d.logger, m.Dir(), opts.AllowSuid, mountinfoPath)
	if d.holderPid != 0 && holderV < 2 {
		// A holder of version 1 keeps no memory volume: a new one
		// takes its place.
		if d.holderPid, err = restart.ReplaceHolder(d.cfg.DataDir, m); err != nil {
			d.logger.Error("the mount will not survive a crash of this daemon", "error", err)
		}
	}
	return nil
}

// warnSuidKept says so when the mount at dir, taken over, was made with
// the other --allow-suid than this daemon's: the setting is the mount's,
// made by mount(2), and a takeover keeps it until a full stop (SIGUSR1)
// lets the next start mount again.
func warnSuidKept(logger hclog.Logger, dir string, allowSuid bool, table string) {
	mounts, err := mountinfo.Read(table)
	if err != nil {
		logger.Warn("cannot tell whether the mount taken over allows set-id files", "error", err)
		return
	}
	var top *mountinfo.Entry
	for i := range mounts {
		if mounts[i].MountPoint == dir {
			top = &mounts[i] // the last one is on top
		}
	}
	if top == nil || top.FSType != FSType {
		return
	}
	if nosuid := top.HasOption("nosuid"); nosuid == allowSuid {
		logger.Warn("the mount taken over keeps its set-id setting until a full stop (SIGUSR1) and a start mount it again",
			"mount_nosuid", nosuid, "allow_suid", allowSuid)
	}
}

// mountNew mounts the store and, for a live restart outside systemd,
// starts the holder that keeps the connection.
func (d *Daemon) mountNew(opts fs.MountOptions) error {
	m, err := fs.NewMount(d.logger, d.store, d.cfg.MountDir, opts)
	if err != nil {
		return err
	}
	d.mount = m
	if fd, ok := m.FuseFd(); ok && d.cfg.Live && !restart.UnderSystemd() {
		if d.holderPid, err = restart.StartHolder(d.cfg.DataDir, fd); err != nil {
			d.logger.Error("the mount will not survive a crash of this daemon", "error", err)
		} else if err := m.KeepMemory(restart.HolderKeeper{Socket: restart.HolderSocket(d.cfg.DataDir)}); err != nil {
			d.logger.Error("the holder did not take every memory volume: those end with this daemon", "error", err)
		}
	}
	return nil
}

// startServices starts the lifecycle service, the API over it and the
// metrics. Every read of an allocation's files, for the client API and
// for snapshots, goes through the store, never through the mount; a
// follower of a collected allocation's file sees it deleted.
func (d *Daemon) startServices() {
	logFusectl(d.logger)
	m, s := d.mount, d.store
	d.svc = node.New(node.Config{
		Logger:      d.logger,
		Store:       s,
		GC:          d.cfg.GC,
		MountDir:    m.Dir(),
		Passthrough: m.Passthrough,
		AllocFS:     func(id string) allocdir.FS { return fs.NewAllocDir(d.logger, s, m, m.Dir(), id) },
		Health:      nodeHealth(m, s, d.cfg.StoreOpts.Quotas),
		Fetches:     d.metrics.Fetches(),
	})
	d.svc.SetFetchTLS(d.cfg.Secrets.fetchTLS)
	d.apiServer = api.NewServer(d.logger, d.svc)
	d.metricsHandler = d.metrics.Handler()
	d.stopMetrics = watchNode(d.metrics, m, s, d.apiServer.Followers, d.cfg.UsageInterval)
}

// serveNode serves other machines on --http-addr: snapshots and the
// client API, each behind its token.
func (d *Daemon) serveNode() error {
	cfg := d.cfg
	var tlsCfg *tls.Config
	if cfg.Secrets.serverTLS != nil {
		tlsCfg = liveServerTLS(&d.secrets)
	}
	tcp, err := net.Listen("tcp", cfg.Node.Addr)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", cfg.Node.Addr, err)
	}
	if tcp, err = d.guard.LimitListener(tcp, d.budget.TCPConns, "tcp"); err != nil {
		return err
	}
	routes := api.NodeRoutes{MetricsPath: metrics.Path}
	if cfg.Node.servesSnapshots() {
		tokens := migrate.TokenCheckerFunc(func(id, token string) bool {
			t := d.secrets.Load().migrateTokens
			return t != nil && t.Check(id, token)
		})
		routes.Snapshots = d.guard.LimitStreams(migrate.SnapshotHandler(d.logger, d.svc.FS, tokens), "")
	}
	if cfg.Node.servesClientAPI() {
		routes.Client, routes.Metrics = d.guard.LimitStreams(d.apiServer.ClientAPI(), fsapi.Prefix), d.metricsHandler
	}
	d.nodeSrv = d.guard.HTTPServer(api.NodeHandler(d.guard.Refusals(), nodeTokens(&d.secrets), routes), "tcp")
	d.nodeSrv.TLSConfig = tlsCfg
	d.nodeSrv.RegisterOnShutdown(d.apiServer.StopStreams)
	go func() {
		if tlsCfg != nil {
			d.served <- d.nodeSrv.ServeTLS(tcp, "", "")
			return
		}
		d.served <- d.nodeSrv.Serve(tcp)
	}()
	d.logger.Info("serving other machines", "addr", tcp.Addr().String(), "tls", tlsCfg != nil,
		"mutual_tls", cfg.Secrets.serverTLS != nil && cfg.Secrets.serverTLS.ClientCAs != nil,
		"snapshots", cfg.Node.servesSnapshots(), "client_api", cfg.Node.servesClientAPI())
	if tlsCfg == nil {
		// Anyone on the path reads the token, and with it the client API
		// or the snapshots, as they go by.
		d.logger.Warn("tokens are accepted over plain HTTP: they and the files they admit to travel in clear text; serve with --tls-cert and --tls-key", "addr", tcp.Addr().String())
	}
	return nil
}

// Wait serves until a signal of sigs stops the daemon or the control API
// fails; one of hups reloads. It reports whether the daemon leaves its
// mount to the keeper instead of unmounting, and the API's failure.
func (d *Daemon) Wait(sigs, hups <-chan os.Signal) (leave bool, failure error) {
	for {
		select {
		case <-hups:
			restart.Notify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", restart.MonotonicUsec()))
			d.reload()
			restart.Notify("READY=1")
		case sig := <-sigs:
			if d.keeper == "holder" && !restart.HolderAlive(d.cfg.DataDir) {
				d.logger.Error("the FUSE connection's holder is gone: this daemon's end will end the mount", "holder_pid", d.holderPid)
				d.keeper = ""
			}
			if sig == restart.SigHandOver {
				if reason := d.handOverRefusal(); reason != "" {
					d.logger.Error("refused to hand the mount over", "reason", reason)
					restart.RefuseHandOver(d.cfg.DataDir, reason)
					continue
				}
			}
			leave = d.keeper != "" && (sig == restart.SigHandOver || sig != restart.SigFullStop && restart.AnyRunning(d.store))
			restart.Notify("STOPPING=1")
			if leave {
				if held := d.mount.MemoryInUse(); len(held) > 0 {
					d.logger.Warn("leaving the mount: the content of its memory volumes is lost, the next serve starts them empty", "volumes", strings.Join(held, ", "))
				}
				d.logger.Info("shutting down; the mount stays for the next serve", "signal", sig.String(), "kept_by", d.keeper)
			} else {
				d.logger.Info("shutting down", "signal", sig.String())
			}
			return leave, nil
		case err := <-d.served:
			d.logger.Error("control API stopped; shutting down", "error", err)
			d.failed = true
			return false, fmt.Errorf("control API stopped: %w", err)
		}
	}
}

// reload applies a SIGHUP: what the configuration's reread says changed
// and can change while the daemon runs (the log level, the tokens and
// the TLS) does; what cannot waits for the next start, as the log says. A
// reload that fails changes nothing and says why.
func (d *Daemon) reload() {
	if d.cfg.Reload == nil {
		d.logger.Info("SIGHUP: nothing to reload")
		return
	}
	r, err := d.cfg.Reload()
	if err != nil {
		d.logger.Error("reload failed; the configuration in effect stays", "error", err)
		return
	}
	d.logger.SetLevel(r.Level)
	d.secrets.Store(r.Secrets)
	d.svc.SetFetchTLS(r.Secrets.fetchTLS)
	d.logger.Info("reloaded", "log_level", r.Level.String(), "config", r.Config,
		"tokens", r.Secrets.migrateTokens != nil || r.Secrets.apiToken != "", "tls", r.Secrets.serverTLS != nil || r.Secrets.fetchTLS != nil)
	if len(r.Waiting) > 0 {
		d.logger.Warn("changed flags take effect at the next start", "flags", fmt.Sprint(r.Waiting))
	}
}

// handOverRefusal is why the mount cannot be handed over now, or "".
func (d *Daemon) handOverRefusal() string {
	if d.keeper == "" {
		return "nothing keeps its FUSE connection (--live-restart=false, or the holder died): the mount would end with it"
	}
	if held := d.mount.MemoryInUse(); len(held) > 0 {
		// An upgrade must not cost a task its secrets.
		return fmt.Sprintf("memory volumes hold data that nothing but this process keeps, which would be lost: %s; stop those allocations, or stop this daemon with SIGTERM, which leaves the mount with them empty", strings.Join(held, ", "))
	}
	return ""
}

// ExitOnSecondSignal makes a second signal mean "now": the process exits
// at once, detaching the mount unless it stays with its keeper. Another
// hand-over request (two upgrades racing) changes nothing.
func (d *Daemon) ExitOnSecondSignal(sigs <-chan os.Signal, leave bool) {
	for sig := range sigs {
		if sig == restart.SigHandOver && leave {
			continue
		}
		d.logger.Error("second signal: exiting without a clean shutdown", "signal", sig.String())
		if !leave {
			if err := unix.Unmount(d.cfg.MountDir, unix.MNT_DETACH); err != nil {
				d.logger.Error("lazy unmount failed", "error", err)
			}
		}
		os.Exit(1)
	}
}

// Shutdown stops the services, then leaves the mount to its keeper or
// unmounts it, and closes the store. Every failure is returned.
func (d *Daemon) Shutdown(leave bool) error {
	// The holder, from now on, is left as it is: kept for the next
	// daemon, or stopped with the mount.
	d.stopWatch()
	defer d.sizes.Close()
	d.stopGC()
	<-d.gcDone
	d.stopAPI()
	if leave {
		// What the kernel sends from now on waits for the next serve,
		// which has it sent again.
		if err := d.mount.Park(restart.ParkTimeout); err != nil {
			d.logger.Warn("leaving the mount with requests in progress; the next serve runs them again", "error", err)
		}
		err := d.closeStore()
		d.logger.Info("stopped; the mount waits for the next serve", "mount", d.mount.Dir(), "kept_by", d.keeper)
		return err
	}
	m := d.mount
	d.logger.Info("unmounting", "mount", m.Dir())
	uerr := m.Unmount()
	if d.keeper == "systemd" {
		restart.Notify("FDSTOREREMOVE=1\nFDNAME=" + restart.FuseFDName)
	}
	if d.keeper == "holder" {
		// After a lazy detach the connection lives on in the files still
		// open: without its holder it ends with this daemon.
		restart.AskHolder(restart.HolderSocket(d.cfg.DataDir), "stop")
	}
	if uerr != nil {
		d.logger.Error("unmount failed", "mount", m.Dir(), "error", uerr)
		d.sizes.Close()
		return errors.Join(fmt.Errorf("failed to unmount %q: %w; detach it with: umount -l %s", m.Dir(), uerr, m.Dir()), d.closeStore())
	}
	d.logger.Info("unmounted", "mount", m.Dir())
	if err := d.closeStore(); err != nil {
		return err
	}
	if !d.failed {
		d.logger.Info("stopped")
	}
	return nil
}

// stopAPI shuts both HTTP servers down at once, so that the second does
// not get what the first left of the timeout, and closes the connections
// of requests still running after it; the metrics stop measuring then.
func (d *Daemon) stopAPI() {
	d.logger.Info("stopping control API")
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	nodeDown := make(chan error, 1)
	go func() {
		if d.nodeSrv == nil {
			nodeDown <- nil
			return
		}
		nodeDown <- d.nodeSrv.Shutdown(ctx)
	}()
	if err := errors.Join(d.srv.Shutdown(ctx), <-nodeDown); err != nil {
		d.logger.Warn("requests still running after the timeout; closing their connections", "timeout", shutdownTimeout, "error", err)
		d.srv.Close()
		if d.nodeSrv != nil {
			d.nodeSrv.Close()
		}
	}
	d.svc.Wait()
	d.stopMetrics()
	d.logger.Info("control API stopped")
}
