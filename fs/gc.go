package fs

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Pin keeps allocation id from being destroyed until the returned func
// is called: a migration streaming its snapshot holds one.
func (s *Store) Pin(id string) (func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.lookup(id); err != nil {
		return nil, err
	}
	s.pins[id]++
	released := false
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if released {
			return
		}
		released = true
		if s.pins[id]--; s.pins[id] <= 0 {
			delete(s.pins, id)
		}
	}, nil
}

// GCConfig are the automatic collector's triggers, Nomad's client GC
// settings and defaults.
type GCConfig struct {
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

// DefaultGCConfig is Nomad's client GC defaults.
func DefaultGCConfig() GCConfig {
	return GCConfig{Interval: time.Minute, DiskUsagePercent: 80, InodeUsagePercent: 70, MaxAllocs: 50}
}

// Collector destroys terminal allocations, oldest stopped first, while the
// node is over one of its triggers, and logs why it collected each one.
// Pinned allocations are skipped; layers another allocation still stacks
// on survive their owner (the store only removes unreferenced layers).
type Collector struct {
	logger hclog.Logger
	store  *Store
	cfg    GCConfig
	statfs func() (unix.Statfs_t, error)
}

// NewCollector returns a collector of store with cfg.
func NewCollector(logger hclog.Logger, store *Store, cfg GCConfig) *Collector {
	return &Collector{logger: logger.Named("gc"), store: store, cfg: cfg, statfs: store.Statfs}
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

// Collect runs one pass and returns the IDs it collected. It ends by
// flattening snapshot chains (Store.Flatten): a chain becomes mergeable
// only once the stopped allocations that hold its old layers are
// collected, and doing it here rather than in Seal keeps a migration
// O(1) and its cost off the new allocation's start.
func (c *Collector) Collect() []string {
	collected := c.collect()
	if _, err := c.store.Flatten(); err != nil {
		c.logger.Error("failed to flatten snapshot chains", "error", err)
	}
	return collected
}

// collect destroys terminal allocations while the node is over a trigger.
func (c *Collector) collect() []string {
	var collected []string
	for {
		reason := c.pressure()
		if reason == "" {
			return collected
		}
		victim := c.oldestTerminal()
		if victim == nil {
			c.logger.Debug("garbage collection skipped because no terminal allocations", "pressure", reason)
			return collected
		}
		if err := c.store.Destroy(victim.ID); err != nil {
			c.logger.Error("failed to collect allocation", "alloc_id", victim.ID, "reason", reason, "error", err)
			return collected
		}
		c.logger.Info("collected allocation", "alloc_id", victim.ID, "reason", reason, "stopped", victim.Stopped)
		collected = append(collected, victim.ID)
	}
}

// pressure says which trigger the node is over, or "".
func (c *Collector) pressure() string {
	if n := c.store.Len(); c.cfg.MaxAllocs > 0 && n > c.cfg.MaxAllocs {
		return fmt.Sprintf("%d allocations > max %d", n, c.cfg.MaxAllocs)
	}
	st, err := c.statfs()
	if err != nil {
		c.logger.Error("cannot read backing store usage", "error", err)
		return ""
	}
	if st.Blocks > 0 {
		used := 100 * float64(st.Blocks-st.Bfree) / float64(st.Blocks)
		if c.cfg.DiskUsagePercent > 0 && used > c.cfg.DiskUsagePercent {
			return fmt.Sprintf("disk usage %.1f%% > %.0f%%", used, c.cfg.DiskUsagePercent)
		}
	}
	if st.Files > 0 {
		used := 100 * float64(st.Files-st.Ffree) / float64(st.Files)
		if c.cfg.InodeUsagePercent > 0 && used > c.cfg.InodeUsagePercent {
			return fmt.Sprintf("inode usage %.1f%% > %.0f%%", used, c.cfg.InodeUsagePercent)
		}
	}
	return ""
}

// oldestTerminal is the terminal, unpinned allocation stopped first.
func (c *Collector) oldestTerminal() *State {
	var terminal []*State
	for _, st := range c.store.List() {
		if st.Status != StatusTerminal {
			continue
		}
		c.store.mu.RLock()
		pinned := c.store.pins[st.ID] > 0
		c.store.mu.RUnlock()
		if !pinned {
			terminal = append(terminal, st)
		}
	}
	if len(terminal) == 0 {
		return nil
	}
	sort.Slice(terminal, func(i, j int) bool { return terminal[i].Stopped.Before(terminal[j].Stopped) })
	return terminal[0]
}
