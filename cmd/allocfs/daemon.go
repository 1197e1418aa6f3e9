//go:build linux

package main

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
	"golang.org/x/sys/unix"
)

// daemon is one run of serve: the store, the mount, the services over
// them and what keeps the FUSE connection while no daemon runs. start
// brings it up in that order, wait serves until a signal, and shutdown
// takes it down in the reverse order, unmounting or leaving the mount to
// its keeper.
type daemon struct {
	logger  hclog.Logger
	cfg     serveConfig
	secrets atomic.Pointer[nodeSecrets]

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

	svc         *node.Service
	apiServer   *api.Server
	srv         *http.Server // the control socket's
	nodeSrv     *http.Server // --http-addr's, or nil
	served      chan error
	stopMetrics func()
	stopGC      func()
	gcDone      chan struct{}
}

// start brings the daemon up. On failure it has closed what it opened,
// except a mount it could not give up (the error says so).
func (d *daemon) start() (err error) {
	d.stopWatch, d.stopMetrics, d.stopGC = func() {}, func() {}, func() {}
	if d.cfg.secrets == nil {
		d.cfg.secrets = &nodeSecrets{}
	}
	d.secrets.Store(d.cfg.secrets)
	if d.budget, err = netlimit.NewBudget(d.logger); err != nil {
		return err
	}
	if d.guard, err = netlimit.NewGuard(d.logger, d.budget); err != nil {
		return err
	}
	if err := preflight(d.logger, d.cfg); err != nil {
		return err
	}
	if err := d.openStore(); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			d.closeStore()
		}
	}()
	ln, err := d.attach()
	if err != nil {
		return err
	}
	d.startServices()
	d.srv = d.guard.HTTPServer(d.guard.LimitStreams(withMetrics(d.apiServer, d.metrics.Handler()), fsapi.Prefix), "unix")
	// Followers never finish by themselves: a shutdown ends them.
	d.srv.RegisterOnShutdown(d.apiServer.StopStreams)
	d.served = make(chan error, 2)
	go func() { d.served <- d.srv.Serve(ln) }()
	if d.cfg.node.addr != "" {
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
	d.logger.Info("serving", "data_dir", d.cfg.dataDir, "mount", d.mount.Dir(), "socket", d.cfg.socket,
		"passthrough", d.mount.Passthrough(), "allocations", d.store.Len())
	if err := sdNotify("READY=1\nSTATUS=serving " + d.mount.Dir()); err != nil {
		d.logger.Warn("systemd was not told the daemon is ready", "error", err)
	}
	return nil
}

// preflight checks the machine and the paths before anything is opened.
func preflight(logger hclog.Logger, cfg serveConfig) error {
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
	return nil
}

// openStore opens the store, taking it over from a running daemon for
// an upgrade, and announces the mount point in it.
func (d *daemon) openStore() error {
	s, err := store.OpenWith(d.logger, d.cfg.dataDir, d.cfg.storeOpts)
	if errors.Is(err, store.ErrLocked) && d.cfg.live {
		if _, mount, _ := store.LockHolder(d.cfg.dataDir); mount == d.cfg.mountDir {
			// An upgrade: the running daemon hands its mount over.
			s, err = takeOverRunning(d.logger, d.cfg)
		}
	}
	if err != nil {
		return fmt.Errorf("failed to open the store in %q: %w", d.cfg.dataDir, err)
	}
	// Until closeStore, which releases the data dir's lock.
	d.store, d.storeOpen = s, true
	if err := s.Announce(d.cfg.mountDir); err != nil {
		return err
	}
	logQuota(d.logger, s)
	d.metrics = metrics.New(d.logger)
	s.SetObserver(d.metrics.Store())
	return nil
}

// closeStore closes the store once, releasing the data dir's lock.
func (d *daemon) closeStore() error {
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
func (d *daemon) attach() (net.Listener, error) {
	cfg := d.cfg
	heldFd, holderV := cfg.stored, 0
	var heldMem map[string]int
	var err error
	if heldFd >= 0 {
		if err := checkHeld(cfg, heldFd, "systemd's descriptor store"); err != nil {
			closeAll(cfg.storedMem)
			return nil, err
		}
		heldMem = storedMemory(d.store, cfg.storedMem)
	} else {
		// Memory volumes without their connection are of a mount that
		// is gone.
		for name, fd := range cfg.storedMem {
			unix.Close(fd)
			sdNotify("FDSTOREREMOVE=1\nFDNAME=" + name)
		}
		if cfg.live {
			if heldFd, d.holderPid, holderV, err = takeHeld(cfg); err != nil {
				return nil, err
			}
		}
		if heldFd >= 0 && holderV >= 2 {
			if heldMem, err = heldMemory(holderSocket(cfg.dataDir)); err != nil {
				d.logger.Error("the holder did not hand its memory volumes over: the tasks find secrets/ and private/ empty", "error", err)
			}
		}
	}
	// Only the holder of the data dir's lock may touch the mount point:
	// a second serve on the same data dir must fail before it detaches
	// or mounts anything.
	if heldFd < 0 {
		if err := prepareMountPoint(d.logger, cfg.mountDir, mountinfoPath, cfg.allowNonEmpty); err != nil {
			return nil, err
		}
	}
	ln, err := listenSocket(d.logger, cfg.socket)
	if err != nil {
		return nil, err
	}
	if ln, err = d.guard.LimitListener(ln, d.budget.UnixConns, "unix"); err != nil {
		return nil, err
	}
	opts := fs.DefaultMountOptions()
	opts.Debug = cfg.mount.Debug
	opts.IOUring = cfg.mount.IOUring
	opts.ChrootEnv = cfg.mount.ChrootEnv
	opts.Requests = d.metrics.FUSE()
	opts.CopyUps = d.metrics.CopyUps()
	if d.sizes, err = startNomadSizes(d.logger, d.store, cfg.quota); err != nil {
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
		d.stopWatch = watchHolder(d.logger, cfg.dataDir, d.mount, d.holderPid)
	}
	if fd, ok := d.mount.FuseFd(); ok && cfg.live && underSystemd() {
		// One entry, whatever systemd kept of the last start's.
		sdNotify("FDSTOREREMOVE=1\nFDNAME=" + fuseFDName)
		if err := sdNotify("FDSTORE=1\nFDNAME="+fuseFDName, fd); err != nil {
			d.logger.Error("the mount will not survive a crash of this daemon", "error", err)
		} else {
			d.keeper = "systemd"
			d.logger.Info("the FUSE connection is in systemd's descriptor store")
			if err := d.mount.KeepMemory(systemdKeeper{}); err != nil {
				d.logger.Error("systemd did not take every memory volume: those end with this daemon", "error", err)
			}
		}
	}
	return ln, nil
}

// adopt serves the kept connection heldFd, with the memory volumes its
// keeper handed over.
func (d *daemon) adopt(heldFd, holderV int, heldMem map[string]int, opts fs.MountOptions) error {
	opts.HeldMemory = heldMem
	switch {
	case d.cfg.stored >= 0:
		opts.Memory = systemdKeeper{}
	case holderV >= 2:
		opts.Memory = holderKeeper{holderSocket(d.cfg.dataDir)}
	}
	m, err := fs.AdoptMount(d.logger, d.store, heldFd, opts)
	if err != nil {
		unix.Close(heldFd)
		closeAll(heldMem)
		return fmt.Errorf("%w; the mount stays kept for the next serve", err)
	}
	d.mount = m
	if d.holderPid != 0 && holderV < 2 {
		// A holder of version 1 keeps no memory volume: a new one
		// takes its place.
		if d.holderPid, err = replaceHolder(d.cfg.dataDir, m); err != nil {
			d.logger.Error("the mount will not survive a crash of this daemon", "error", err)
		}
	}
	return nil
}

// mountNew mounts the store and, for a live restart outside systemd,
// starts the holder that keeps the connection.
func (d *daemon) mountNew(opts fs.MountOptions) error {
	m, err := fs.NewMount(d.logger, d.store, d.cfg.mountDir, opts)
	if err != nil {
		return err
	}
	d.mount = m
	if fd, ok := m.FuseFd(); ok && d.cfg.live && !underSystemd() {
		if d.holderPid, err = startHolder(d.cfg.dataDir, fd); err != nil {
			d.logger.Error("the mount will not survive a crash of this daemon", "error", err)
		} else if err := m.KeepMemory(holderKeeper{holderSocket(d.cfg.dataDir)}); err != nil {
			d.logger.Error("the holder did not take every memory volume: those end with this daemon", "error", err)
		}
	}
	return nil
}

// startServices starts the lifecycle service, the API over it and the
// metrics. Every read of an allocation's files, for the client API and
// for snapshots, goes through the store, never through the mount; a
// follower of a collected allocation's file sees it deleted.
func (d *daemon) startServices() {
	logFusectl(d.logger)
	m, s := d.mount, d.store
	d.svc = node.New(node.Config{
		Logger:      d.logger,
		Store:       s,
		GC:          d.cfg.gc,
		MountDir:    m.Dir(),
		Passthrough: m.Passthrough,
		AllocFS:     func(id string) allocdir.FS { return fs.NewAllocDir(d.logger, s, m, m.Dir(), id) },
		Health:      nodeHealth(m, s, d.cfg.storeOpts.Quotas),
		Fetches:     d.metrics.Fetches(),
	})
	d.svc.SetFetchTLS(d.cfg.secrets.fetchTLS)
	d.apiServer = api.NewServer(d.logger, d.svc)
	d.stopMetrics = watchNode(d.metrics, m, s, d.apiServer.Followers, d.cfg.usageInterval)
}

// serveNode serves other machines on --http-addr: snapshots and the
// client API, each behind its token.
func (d *daemon) serveNode() error {
	cfg := d.cfg
	var tlsCfg *tls.Config
	if cfg.secrets.serverTLS != nil {
		tlsCfg = liveServerTLS(&d.secrets)
	}
	tcp, err := net.Listen("tcp", cfg.node.addr)
	if err != nil {
		return fmt.Errorf("failed to listen on %s: %w", cfg.node.addr, err)
	}
	if tcp, err = d.guard.LimitListener(tcp, d.budget.TCPConns, "tcp"); err != nil {
		return err
	}
	routes := api.NodeRoutes{MetricsPath: metrics.Path}
	if cfg.node.servesSnapshots() {
		tokens := migrate.TokenCheckerFunc(func(id, token string) bool {
			t := d.secrets.Load().migrateTokens
			return t != nil && t.Check(id, token)
		})
		routes.Snapshots = d.guard.LimitStreams(migrate.SnapshotHandler(d.logger, d.svc.FS, tokens), "")
	}
	if cfg.node.servesClientAPI() {
		routes.Client, routes.Metrics = d.guard.LimitStreams(d.apiServer.ClientAPI(), fsapi.Prefix), d.metrics.Handler()
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
		"mutual_tls", cfg.secrets.serverTLS != nil && cfg.secrets.serverTLS.ClientCAs != nil,
		"snapshots", cfg.node.servesSnapshots(), "client_api", cfg.node.servesClientAPI())
	if tlsCfg == nil {
		// Anyone on the path reads the token, and with it the client API
		// or the snapshots, as they go by.
		d.logger.Warn("tokens are accepted over plain HTTP: they and the files they admit to travel in clear text; serve with --tls-cert and --tls-key", "addr", tcp.Addr().String())
	}
	return nil
}

// wait serves until a signal stops the daemon or the control API fails;
// SIGHUP reloads. It reports whether the daemon leaves its mount to the
// keeper instead of unmounting, and the API's failure.
func (d *daemon) wait(sigs, hups <-chan os.Signal) (leave bool, failure error) {
	reloader := &reloader{logger: d.logger, args: d.cfg.args, reread: d.cfg.reread, secrets: &d.secrets, fetchTLS: d.svc.SetFetchTLS}
	for {
		select {
		case <-hups:
			sdNotify(fmt.Sprintf("RELOADING=1\nMONOTONIC_USEC=%d", monotonicUsec()))
			reloader.reload()
			sdNotify("READY=1")
		case sig := <-sigs:
			if d.keeper == "holder" && !holderAlive(d.cfg.dataDir) {
				d.logger.Error("the FUSE connection's holder is gone: this daemon's end will end the mount", "holder_pid", d.holderPid)
				d.keeper = ""
			}
			if sig == sigHandOver {
				if reason := d.handOverRefusal(); reason != "" {
					d.logger.Error("refused to hand the mount over", "reason", reason)
					refuseHandOver(d.cfg.dataDir, reason)
					continue
				}
			}
			leave = d.keeper != "" && (sig == sigHandOver || sig != sigFullStop && anyRunning(d.store))
			sdNotify("STOPPING=1")
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
			return false, fmt.Errorf("control API stopped: %w", err)
		}
	}
}

// handOverRefusal is why the mount cannot be handed over now, or "".
func (d *daemon) handOverRefusal() string {
	if held := d.mount.MemoryInUse(); len(held) > 0 {
		// An upgrade must not cost a task its secrets.
		return fmt.Sprintf("memory volumes hold data that nothing but this process keeps, which would be lost: %s; stop those allocations, or stop this daemon with SIGTERM, which leaves the mount with them empty", strings.Join(held, ", "))
	}
	if d.keeper == "" {
		return "nothing keeps its FUSE connection (--live-restart=false, or the holder died): the mount would end with it"
	}
	return ""
}

// exitOnSecondSignal makes a second signal mean "now": the process exits
// at once, detaching the mount unless it stays with its keeper. Another
// hand-over request (two upgrades racing) changes nothing.
func (d *daemon) exitOnSecondSignal(sigs <-chan os.Signal, leave bool) {
	for sig := range sigs {
		if sig == sigHandOver && leave {
			continue
		}
		d.logger.Error("second signal: exiting without a clean shutdown", "signal", sig.String())
		if !leave {
			if err := unix.Unmount(d.cfg.mountDir, unix.MNT_DETACH); err != nil {
				d.logger.Error("lazy unmount failed", "error", err)
			}
		}
		os.Exit(exitFailed)
	}
}

// shutdown stops the services, then leaves the mount to its keeper or
// unmounts it, and closes the store. Every failure is returned.
func (d *daemon) shutdown(leave bool) error {
	// The holder, from now on, is left as it is: kept for the next
	// daemon, or stopped with the mount.
	d.stopWatch()
	defer d.sizes.Close()
	d.stopGC()
	<-d.gcDone
	d.stopAPI()
	d.stopMetrics()
	if leave {
		// What the kernel sends from now on waits for the next serve,
		// which has it sent again.
		if err := d.mount.Park(parkTimeout); err != nil {
			d.logger.Warn("leaving the mount with requests in progress; the next serve runs them again", "error", err)
		}
		if err := d.closeStore(); err != nil {
			return err
		}
		d.logger.Info("stopped; the mount waits for the next serve", "mount", d.mount.Dir(), "kept_by", d.keeper)
		return nil
	}
	m := d.mount
	d.logger.Info("unmounting", "mount", m.Dir())
	uerr := m.Unmount()
	if d.keeper == "systemd" {
		sdNotify("FDSTOREREMOVE=1\nFDNAME=" + fuseFDName)
	}
	if d.keeper == "holder" {
		// After a lazy detach the connection lives on in the files still
		// open: without its holder it ends with this daemon.
		askHolder(holderSocket(d.cfg.dataDir), "stop")
	}
	if uerr != nil {
		d.logger.Error("unmount failed", "mount", m.Dir(), "error", uerr)
		return errors.Join(fmt.Errorf("failed to unmount %q: %w; detach it with: umount -l %s", m.Dir(), uerr, m.Dir()), d.closeStore())
	}
	d.logger.Info("unmounted", "mount", m.Dir())
	if err := d.closeStore(); err != nil {
		return err
	}
	d.logger.Info("stopped")
	return nil
}

// stopAPI shuts both HTTP servers down at once, so that the second does
// not get what the first left of the timeout, and closes the connections
// of requests still running after it.
func (d *daemon) stopAPI() {
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
	d.logger.Info("control API stopped")
}
