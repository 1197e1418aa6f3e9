// Package daemon is `allocfs serve` as a library: one node's store, its
// mount, the APIs over them and the collector, brought up and taken down
// in order. cmd/allocfs parses the flags into a Config and calls it.
//
// # A run
//
//	d := daemon.New(logger, cfg)
//	d.Start()                 // checks, store, mount, APIs, collector
//	leave, err := d.Wait(sigs, hups)
//	d.Shutdown(leave)         // APIs, then the mount, then the store
//
// Start checks the machine and the paths first (preflight.go: /dev/fuse,
// tmpfs, a mount point that would hide the data dir or is not a
// directory), so that a refusal changes nothing. It then opens the store
// (its lock makes this the only daemon of the data dir), and either adopts
// the FUSE connection a keeper held for it (package restart: a holder
// process or systemd's descriptor store, after a crash, a restart or an
// upgrade) or prepares the mount point (detaching a stale mount a dead
// daemon left) and mounts anew. The control socket is
// bound before the mount comes up, and the TCP listener for other
// machines (NodeConfig: snapshots behind the migration token, the client
// API and metrics behind the API token, TLS) after it.
//
// Every listener and streaming request is held to the descriptor budget
// (api/netlimit): the mount's own descriptors must never run out because
// clients took them.
//
// # Stopping
//
// Wait returns on SIGINT or SIGTERM, or when the control API fails; a
// SIGHUP reloads what can change while running (Config.Reload: the log
// level, the tokens, the TLS files). With a keeper and a running
// allocation, or on restart.SigHandOver, Shutdown leaves the mount to the
// keeper (its requests wait in the kernel for the next daemon); otherwise
// it unmounts. A second signal exits at once (ExitOnSecondSignal).
//
// Health (GET /v1/agent/health: the mount, passthrough, the store, the
// memory volumes, quotas) and the metrics' periodic measures are wired
// here too (health.go, metrics.go).
package daemon
