package gc

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Config are the automatic collector's triggers, Nomad's client GC
// settings and defaults.
type Config struct {
	// Interval between passes (gc_interval, 1m).
	Interval time.Duration
	// DiskUsagePercent of the backing store above which terminal
	// allocations are collected (gc_disk_usage_threshold, 80).
	DiskUsagePercent float64
	// InodeUsagePercent, likewise for inodes (gc_inode_usage_threshold, 70).
	InodeUsagePercent float64
	// MaxAllocs the node keeps before collecting terminal ones
	// (gc_max_allocs, 50).
	MaxAllocs int
}

// DefaultConfig is Nomad's client GC defaults.
func DefaultConfig() Config {
	return Config{Interval: time.Minute, DiskUsagePercent: 80, InodeUsagePercent: 70, MaxAllocs: 50}
}

// Collector destroys terminal allocations, oldest stopped first, while the
// node is over one of its triggers, and logs why it collected each one.
// It is the node's one collector: the timer (Run) and explicit requests
// (CollectAll, CollectAlloc) go through it alike. Pinned allocations are
// skipped; layers another allocation still stacks on survive their owner
// (the store only removes unreferenced layers). Every pass ends by
// sweeping orphan layers and flattening snapshot chains. A failure never
// stops a pass: it is logged and the pass goes on.
type Collector struct {
	logger hclog.Logger
	store  *store.Store
	cfg    Config
	statfs func() (unix.Statfs_t, error)
	// mu keeps passes from overlapping: a timer pass and a request.
	mu sync.Mutex
}

// NewCollector returns a collector of s with cfg.
func NewCollector(logger hclog.Logger, s *store.Store, cfg Config) *Collector {
	return &Collector{logger: logger.Named("gc"), store: s, cfg: cfg, statfs: s.Statfs}
}

// Run collects every Interval until ctx is done.
func (c *Collector) Run(ctx context.Context) {
	ticker := time.NewTicker(c.cfg.Interval)
	defer ticker.Stop()
	for {
		c.Collect()
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Collect runs one pass under the triggers and returns the IDs it
// collected. It ends by sweeping orphans and flattening snapshot chains
// (Store.Flatten): a chain becomes mergeable only once the stopped
// allocations that hold its old layers are collected, and doing it here
// rather than in the snapshot migration keeps a migration O(1) and its
// cost off the new allocation's start.
func (c *Collector) Collect() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	pass := store.CollectorPass{}
	start := time.Now()
	collected := c.collect(&pass)
	c.tidy(&pass, start)
	return collected
}

// CollectAll collects every terminal, unpinned allocation, oldest stopped
// first, whatever the triggers (an explicit node GC), then tidies like a
// pass. It returns those it collected and every failure.
func (c *Collector) CollectAll(reason string) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pass := store.CollectorPass{Requested: true}
	start := time.Now()
	collected := []string{}
	var errs []error
	terminal, pinned := c.terminal()
	pass.Pinned = len(pinned)
	for _, st := range terminal {
		if err := c.destroy(st, store.GCRequested, reason); err != nil {
			if errors.Is(err, store.ErrPinned) {
				pass.Pinned++
			}
			errs = append(errs, err)
			continue
		}
		collected = append(collected, st.ID)
	}
	c.tidy(&pass, start)
	return collected, errors.Join(errs...)
}

// CollectAlloc collects allocation id if it is terminal and unpinned; a
// running one gets store.ErrNotTerminal and a pinned one store.ErrPinned.
func (c *Collector) CollectAlloc(id, reason string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := c.store.Get(id)
	if err != nil {
		return err
	}
	if st.Status != record.StatusTerminal {
		return &notTerminalError{id: id, status: st.Status}
	}
	pass := store.CollectorPass{Requested: true}
	start := time.Now()
	err = c.destroy(st, store.GCRequested, reason)
	if errors.Is(err, store.ErrPinned) {
		pass.Pinned++
	}
	c.tidy(&pass, start)
	return err
}

// destroy collects one allocation and says why in the log; class is the
// reason's class, for the observer. One pinned since it was chosen, or
// destroyed by someone else meanwhile, is no collection (the caller
// counts the pinned ones, once each).
func (c *Collector) destroy(st *record.State, class store.GCReason, reason string) error {
	err := c.store.Destroy(st.ID)
	if !errors.Is(err, store.ErrPinned) && !errors.Is(err, allocdir.ErrUnknownAlloc) {
		c.store.Observer().Collected(class, err)
	}
	if err != nil {
		if errors.Is(err, allocdir.ErrUnknownAlloc) || errors.Is(err, store.ErrPinned) {
			c.logger.Info("allocation not collected", "alloc_id", st.ID, "reason", reason, "error", err)
			return err
		}
		// The record is gone when only the layers failed: the sweep
		// takes them.
		c.logger.Error("failed to collect allocation", "alloc_id", st.ID, "reason", reason, "error", err)
		return err
	}
	c.logger.Info("collected allocation", "alloc_id", st.ID, "reason", reason, "stopped", st.Stopped, "migrated_to", st.MigratedTo)
	return nil
}

// tidy sweeps orphan layers and flattens snapshot chains, logging what
// fails, and tells the observer of the pass that started at start.
func (c *Collector) tidy(pass *store.CollectorPass, start time.Time) {
	var err error
	if pass.Swept, err = c.store.Sweep(); err != nil {
		c.logger.Error("failed to remove orphan layers", "error", err)
	}
	if pass.Merges, err = c.store.Flatten(); err != nil {
		c.logger.Error("failed to flatten snapshot chains", "error", err)
	}
	if err := c.store.Resettle(); err != nil {
		c.logger.Error("disk limits still lag the records", "error", err)
	}
	pass.Duration = time.Since(start)
	c.store.Observer().CollectorPass(*pass)
}

// collect destroys terminal allocations while the node is over a trigger.
// One that cannot be collected is skipped for the rest of the pass.
func (c *Collector) collect(pass *store.CollectorPass) []string {
	var collected []string
	skip := make(map[string]bool)
	pinnedSeen := make(map[string]bool)
	defer func() { pass.Pinned += len(pinnedSeen) }()
	for first := true; ; first = false {
		class, reason := c.pressure()
		if first {
			pass.Pressure = class
		}
		if class == store.GCNone {
			return collected
		}
		terminal, pinned := c.terminal()
		for _, id := range pinned {
			pinnedSeen[id] = true
		}
		var victim *record.State
		for _, st := range terminal {
			if !skip[st.ID] {
				victim = st
				break
			}
		}
		if victim == nil {
			c.logger.Debug("garbage collection skipped because no terminal allocations", "pressure", reason)
			return collected
		}
		if err := c.destroy(victim, class, reason); err != nil {
			if errors.Is(err, store.ErrPinned) {
				pinnedSeen[victim.ID] = true
			}
			skip[victim.ID] = true
			if _, gone := c.store.Get(victim.ID); gone != nil {
				collected = append(collected, victim.ID)
			}
			continue
		}
		collected = append(collected, victim.ID)
	}
}

// pressure says which trigger the node is over (GCNone: none), and in
// words, for the log.
func (c *Collector) pressure() (store.GCReason, string) {
	if n := c.store.Len(); c.cfg.MaxAllocs > 0 && n > c.cfg.MaxAllocs {
		return store.GCMaxAllocs, fmt.Sprintf("%d allocations > max %d", n, c.cfg.MaxAllocs)
	}
	st, err := c.statfs()
	if err != nil {
		c.logger.Error("cannot read backing store usage", "error", err)
		return store.GCNone, ""
	}
	if st.Blocks > 0 {
		used := 100 * float64(st.Blocks-st.Bfree) / float64(st.Blocks)
		if c.cfg.DiskUsagePercent > 0 && used > c.cfg.DiskUsagePercent {
			return store.GCDisk, fmt.Sprintf("disk usage %.1f%% > %.0f%%", used, c.cfg.DiskUsagePercent)
		}
	}
	if st.Files > 0 {
		used := 100 * float64(st.Files-st.Ffree) / float64(st.Files)
		if c.cfg.InodeUsagePercent > 0 && used > c.cfg.InodeUsagePercent {
			return store.GCInodes, fmt.Sprintf("inode usage %.1f%% > %.0f%%", used, c.cfg.InodeUsagePercent)
		}
	}
	return store.GCNone, ""
}

// terminal returns the terminal, unpinned allocations, stopped first
// first, and the IDs of the terminal ones a migration pins.
func (c *Collector) terminal() (terminal []*record.State, pinned []string) {
	for _, st := range c.store.List() {
		// Nomad's client removes what it made through the mount; it
		// tells no one when an allocation stops.
		if st.Status != record.StatusTerminal || st.Origin == record.OriginMount {
			continue
		}
		if c.store.Pinned(st.ID) {
			pinned = append(pinned, st.ID)
			continue
		}
		terminal = append(terminal, st)
	}
	sort.SliceStable(terminal, func(i, j int) bool { return terminal[i].Stopped.Before(terminal[j].Stopped) })
	return terminal, pinned
}

// notTerminalError refuses to collect a running allocation: it is
// store.ErrNotTerminal, with a message that says what to do.
type notTerminalError struct {
	id     string
	status record.Status
}

func (e *notTerminalError) Error() string {
	return fmt.Sprintf("allocation %q is %s: stop it before collecting it", e.id, e.status)
}

func (e *notTerminalError) Is(target error) bool { return target == store.ErrNotTerminal }
