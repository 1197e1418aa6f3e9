package metrics

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/prometheus/client_golang/prometheus"
)

// Node is what the node's series are read from at scrape time. Every
// field but Store may be nil: its series are then left out.
type Node struct {
	// Store holds the allocations; their usage is measured on its layers.
	Store *store.Store
	// Passthrough reports whether the kernel serves file data from the
	// backing files (fs.Mount.Passthrough), and whether passthrough was
	// negotiated and lost since (fs.Mount.PassthroughLost).
	Passthrough func() (on, lost bool)
	// FileOpens counts the handles of volume files the kernel serves by
	// passthrough and those the daemon serves (fs.Mount.FileOpens).
	FileOpens func() (passthrough, daemon uint64)
	// Followers counts the clients following a file (api.Server.Followers).
	Followers func() int64
	// UsageInterval is how often the allocations' usage is measured
	// again; 0 means DefaultUsageInterval.
	UsageInterval time.Duration
}

// WatchNode adds the node's series to the registry and starts measuring
// the allocations' usage in the background. stop ends the measuring and
// waits for it (a second call does nothing): call it before closing the
// store. WatchNode is called once.
func (m *Metrics) WatchNode(n Node) (stop func()) {
	c := newNodeCollector(n, newUsageCache(m.logger, n.Store, n.UsageInterval))
	m.reg.MustRegister(c)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.usage.run(ctx) })
	return sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
}

// nodeCollector reads the node's series at scrape time.
type nodeCollector struct {
	node  Node
	usage *usageCache

	passthrough, passthroughLost, opens, followers *prometheus.Desc
	quotaEnforced, allocLimit, usageReadFailures   *prometheus.Desc
	// readFailures counts the accounting reads that failed.
	readFailures                                                           atomic.Int64
	allocs, allocStatus, allocBytes, allocFiles                            *prometheus.Desc
	usageRefreshed, usageTook, usageFailures                               *prometheus.Desc
	backingSize, backingFree, backingAvail, backingFiles, backingFilesFree *prometheus.Desc
}

func newNodeCollector(n Node, u *usageCache) *nodeCollector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, labels, nil)
	}
	stale := fmt.Sprintf(" Measured in the background every %s by walking the allocation's layers on the backing store, so up to that old (allocfs_alloc_usage_refreshed_timestamp_seconds says when); an allocation created since the last walk has none yet.", u.interval)
	return &nodeCollector{
		node:  n,
		usage: u,
		passthrough: desc("fuse_passthrough",
			"1 while the kernel serves the data of the mount's files from their backing files (FUSE passthrough: reads and writes never reach the daemon), 0 when it was not negotiated or was lost."),
		passthroughLost: desc("fuse_passthrough_lost",
			"1 once passthrough was negotiated and file data went through the daemon all the same (go-fuse turns it off for the whole mount after one failed registration; see the log)."),
		opens: desc("fuse_file_opens_total",
			"Handles of volume files opened, by who serves their data: passthrough (the kernel, from the backing file) or daemon (a lower file of a writable volume, a file with set-id bits, every file when passthrough is off).", "mode"),
		followers: desc("followers",
			"Clients following a file or a task's logs through the client API (stream or logs with follow) and waiting for more."),
		allocs: desc("allocs",
			"Allocations on the node, by status (running, terminal).", "status"),
		allocStatus: desc("alloc_status",
			"1 for an allocation's status (running, terminal), 0 for the other.", "alloc_id", "status"),
		allocBytes: desc("alloc_bytes",
			"Bytes of an allocation's files, by volume (alloc/data, <task>/local...) and layer: upper is the volume's writable layer, what the allocation wrote itself; lower are the read-only layers a snapshot migration stacked under it, which the previous allocation may show too (the node's total is allocfs_backing_*: a layer that outlived its allocation, or that a flatten merged, is nobody's upper). File sizes, each hard-linked file once."+stale,
			"alloc_id", "volume", "layer"),
		allocFiles: desc("alloc_files",
			"Inodes of an allocation (files, directories, links; a hard-linked file once, where alloc status counts names and no directories), by volume and layer as allocfs_alloc_bytes."+stale,
			"alloc_id", "volume", "layer"),
		quotaEnforced: desc("quota_enforced",
			"1 when the data dir's filesystem enforces allocations' disk limits, 0 when it cannot (serve's log says what would), by mechanism (btrfs qgroups) and filesystem.", "mechanism", "filesystem"),
		allocLimit: desc("alloc_limit_bytes",
			"An allocation's disk limit: what its volumes' upper layers may hold (alloc/data, logs, tmp, every task's local/ and tmp/). Only allocations with a limit have it; their allocfs_alloc_bytes is then read at scrape time from the filesystem's quota accounting, for the whole allocation (volume=\"\", layer=\"upper\"), with no walk.", "alloc_id"),
		usageReadFailures: desc("alloc_usage_read_failures_total",
			"Reads of an allocation's usage from the quota accounting that failed (the series is left out of that scrape)."),
		usageRefreshed: desc("alloc_usage_refreshed_timestamp_seconds",
			"When the last walk of the allocations' layers ended (Unix time)."),
		usageTook: desc("alloc_usage_refresh_duration_seconds",
			"How long the last walk of the allocations' layers took."),
		usageFailures: desc("alloc_usage_failures_total",
			"Layers a walk could not measure (counted as empty in that walk's usage)."),
		backingSize: desc("backing_size_bytes",
			"Size of the filesystem holding the data dir (statfs)."),
		backingFree: desc("backing_free_bytes",
			"Free bytes of the filesystem holding the data dir; what the collector's disk threshold is measured against."),
		backingAvail: desc("backing_avail_bytes",
			"Bytes of the filesystem holding the data dir available to unprivileged users."),
		backingFiles: desc("backing_files",
			"Inodes of the filesystem holding the data dir."),
		backingFilesFree: desc("backing_files_free",
			"Free inodes of the filesystem holding the data dir; what the collector's inode threshold is measured against."),
	}
}

// Describe sends every series the collector may send.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.passthrough, c.passthroughLost, c.opens, c.followers,
		c.quotaEnforced, c.allocLimit, c.usageReadFailures,
		c.allocs, c.allocStatus, c.allocBytes, c.allocFiles,
		c.usageRefreshed, c.usageTook, c.usageFailures,
		c.backingSize, c.backingFree, c.backingAvail, c.backingFiles, c.backingFilesFree,
	} {
		ch <- d
	}
}

// Collect reads the node's series. Only the usage comes from the
// background walk; everything else is read now, the allocations from the
// store's records, in memory.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if c.node.Passthrough != nil {
		on, lost := c.node.Passthrough()
		gauge(c.passthrough, bool01(on))
		gauge(c.passthroughLost, bool01(lost))
	}
	if c.node.FileOpens != nil {
		pt, daemon := c.node.FileOpens()
		ch <- prometheus.MustNewConstMetric(c.opens, prometheus.CounterValue, float64(pt), "passthrough")
		ch <- prometheus.MustNewConstMetric(c.opens, prometheus.CounterValue, float64(daemon), "daemon")
	}
	if c.node.Followers != nil {
		gauge(c.followers, float64(c.node.Followers()))
	}
	c.collectBacking(ch, gauge)

	states := c.node.Store.List()
	byStatus := map[record.Status]int{record.StatusRunning: 0, record.StatusTerminal: 0}
	for _, st := range states {
		byStatus[st.Status]++
		for _, status := range []record.Status{record.StatusRunning, record.StatusTerminal} {
			gauge(c.allocStatus, bool01(st.Status == status), st.ID, string(status))
		}
	}
	for status, n := range byStatus {
		gauge(c.allocs, float64(n), string(status))
	}
	c.collectQuota(ch, states, gauge)

	snap, failures := c.usage.snapshot(firstScrapeWait)
	ch <- prometheus.MustNewConstMetric(c.usageFailures, prometheus.CounterValue, float64(failures))
	if snap.allocs == nil {
		return
	}
	gauge(c.usageRefreshed, float64(snap.at.UnixNano())/1e9)
	gauge(c.usageTook, snap.took.Seconds())
	for _, st := range states {
		vols, ok := snap.allocs[st.ID]
		if !ok {
			continue
		}
		keys := make([]string, 0, len(vols))
		for k := range vols {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, key := range keys {
			vu := vols[key]
			gauge(c.allocBytes, float64(vu.upper.bytes), st.ID, key, "upper")
			gauge(c.allocFiles, float64(vu.upper.files), st.ID, key, "upper")
			gauge(c.allocBytes, float64(vu.lower.bytes), st.ID, key, "lower")
			gauge(c.allocFiles, float64(vu.lower.files), st.ID, key, "lower")
		}
	}
}

// collectBacking reads the backing filesystem's statfs(2); a failure is
// the scrape's error, which the handler logs.
func (c *nodeCollector) collectBacking(ch chan<- prometheus.Metric, gauge func(*prometheus.Desc, float64, ...string)) {
	sf, err := c.node.Store.Statfs()
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.backingSize, fmt.Errorf("failed to read the backing store's usage: %w", err))
		return
	}
	// f_blocks, f_bfree and f_bavail count fragments where the
	// filesystem has them.
	bsize := float64(sf.Bsize)
	if sf.Frsize > 0 {
		bsize = float64(sf.Frsize)
	}
	gauge(c.backingSize, float64(sf.Blocks)*bsize)
	gauge(c.backingFree, float64(sf.Bfree)*bsize)
	gauge(c.backingAvail, float64(sf.Bavail)*bsize)
	gauge(c.backingFiles, float64(sf.Files))
	gauge(c.backingFilesFree, float64(sf.Ffree))
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// collectQuota reads what enforces disk limits and, for every allocation
// with a limit, its limit and usage from the quota accounting: a few
// sysfs reads each, whatever it holds.
func (c *nodeCollector) collectQuota(ch chan<- prometheus.Metric, states []*record.State, gauge func(*prometheus.Desc, float64, ...string)) {
	r := c.node.Store.Quota()
	gauge(c.quotaEnforced, bool01(r.Enforced()), r.Mechanism, r.Filesystem)
	for _, st := range states {
		if !counted(c.node.Store, st) {
			continue
		}
		gauge(c.allocLimit, float64(st.Disk.Bytes), st.ID)
		u, ok, err := c.node.Store.Usage(st.ID)
		if err != nil || !ok {
			if err != nil {
				c.readFailures.Add(1)
			}
			continue
		}
		gauge(c.allocBytes, float64(u.Bytes), st.ID, "", "upper")
		if u.Inodes > 0 {
			gauge(c.allocFiles, float64(u.Inodes), st.ID, "", "upper")
		}
	}
	ch <- prometheus.MustNewConstMetric(c.usageReadFailures, prometheus.CounterValue, float64(c.readFailures.Load()))
}
