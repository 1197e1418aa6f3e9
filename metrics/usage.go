package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// DefaultUsageInterval is how often the usage of every allocation is
// measured again.
const DefaultUsageInterval = 30 * time.Second

// firstScrapeWait bounds how long a scrape waits for the first walk: a
// node with little data answers its first scrape with its usage, a big
// one answers without it rather than past the scraper's timeout.
const firstScrapeWait = 5 * time.Second

// usage is what a layer, or a volume's layers, hold: the bytes of its
// regular files (their sizes, as `du --apparent-size` counts them, each
// hard-linked file once) and its inodes (every entry but the root:
// files, directories, links, whiteouts).
type usage struct {
	bytes, files int64
}

func (u *usage) add(o usage) {
	u.bytes += o.bytes
	u.files += o.files
}

// volumeUsage is one volume's usage: of its writable upper layer, which
// the allocation writes, and of its read-only lower layers, which a
// snapshot migration stacked and which the previous allocation may
// still show too.
type volumeUsage struct {
	upper, lower usage
}

// usageSnapshot is the result of one refresh.
type usageSnapshot struct {
	// allocs maps an allocation to its volumes' usage.
	allocs map[string]map[string]volumeUsage
	// at is when the refresh ended, took how long it took.
	at   time.Time
	took time.Duration
}

// usageCache measures the allocations' usage in the background, one walk
// at a time, and keeps the last result for scrapes: a walk of every
// layer of a busy node takes far longer than a scrape may. Lower layers
// never change, so each is walked once for as long as some volume
// stacks it; writable upper layers are walked at every refresh.
type usageCache struct {
	logger   hclog.Logger
	store    *store.Store
	interval time.Duration
	// walk measures one layer; tests replace it.
	walk func(ctx context.Context, root string) (usage, error)

	// ready is closed once the first refresh ended.
	ready     chan struct{}
	readyOnce sync.Once

	mu   sync.RWMutex
	last usageSnapshot
	// failures counts the layers a walk failed on, since the start.
	failures int64

	// frozen holds the usage of the read-only layers walked so far, by
	// layer ID; only the refreshing goroutine touches it.
	frozen map[string]usage
}

func newUsageCache(logger hclog.Logger, s *store.Store, interval time.Duration) *usageCache {
	if interval <= 0 {
		interval = DefaultUsageInterval
	}
	return &usageCache{
		logger:   logger.Named("usage"),
		store:    s,
		interval: interval,
		walk:     walkLayer,
		ready:    make(chan struct{}),
		frozen:   make(map[string]usage),
	}
}

// run refreshes at once, then every interval, until ctx is done.
func (c *usageCache) run(ctx context.Context) {
	ticker := time.NewTicker(c.interval)
	defer ticker.Stop()
	for {
		c.refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// snapshot returns the last refresh's result, waiting for the first one
// for at most wait.
func (c *usageCache) snapshot(wait time.Duration) (usageSnapshot, int64) {
	select {
	case <-c.ready:
	case <-time.After(wait):
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.last, c.failures
}

// refresh measures every allocation's volumes. A refresh that ctx ends
// midway keeps nothing: a shutdown or a hand-over need not wait for a
// walk of every layer.
func (c *usageCache) refresh(ctx context.Context) {
	start := time.Now()
	states := c.store.List()
	// What no volume writes: the lowers, and the upper of a frozen
	// volume (a previous allocation's sealed view).
	readOnly := make(map[string]bool)
	for _, st := range states {
		for _, v := range st.Volumes {
			if v == nil {
				continue
			}
			for _, l := range v.Lowers {
				readOnly[l] = true
			}
			if v.ReadOnly {
				readOnly[v.Upper] = true
			}
		}
	}
	for id := range c.frozen {
		if !readOnly[id] {
			delete(c.frozen, id)
		}
	}
	failed := 0
	// measured holds what this refresh walked, so that a layer two
	// volumes show is walked once.
	measured := make(map[string]usage)
	measure := func(id string) usage {
		if u, ok := c.frozen[id]; ok {
			return u
		}
		if u, ok := measured[id]; ok {
			return u
		}
		if ctx.Err() != nil {
			return usage{}
		}
		u, err := c.walk(ctx, c.store.LayerPath(id))
		switch {
		case ctx.Err() != nil:
			return usage{}
		case errors.Is(err, os.ErrNotExist):
			// Removed since the list was taken: its allocation is
			// gone, or goes, with it.
		case err != nil:
			failed++
			c.logger.Debug("cannot measure a layer", "layer", id, "error", err)
		case readOnly[id]:
			c.frozen[id] = u
		}
		measured[id] = u
		return u
	}
	allocs := make(map[string]map[string]volumeUsage, len(states))
	for _, st := range states {
		if counted(c.store, st) {
			continue // read from the quota accounting at each scrape
		}
		vols := make(map[string]volumeUsage, len(st.Volumes))
		for key, v := range st.Volumes {
			if v == nil {
				continue
			}
			vu := volumeUsage{upper: measure(v.Upper)}
			for _, l := range v.Lowers {
				vu.lower.add(measure(l))
			}
			vols[key] = vu
		}
		allocs[st.ID] = vols
	}
	if ctx.Err() != nil {
		return
	}
	end := time.Now()
	c.mu.Lock()
	if failed > 0 && c.failures == 0 {
		c.logger.Warn("cannot measure some layers; their usage counts as zero (allocfs_alloc_usage_failures_total; --log-level=debug names them)", "layers", failed)
	}
	c.failures += int64(failed)
	c.last = usageSnapshot{allocs: allocs, at: end, took: end.Sub(start)}
	c.mu.Unlock()
	c.readyOnce.Do(func() { close(c.ready) })
}

// errMoved: a directory was moved while the walk was inside it, so
// going back up through ".." would not lead where the walk came from.
var errMoved = errors.New("a directory moved during the walk")

// walkLayer measures the layer at root. It walks from directory
// descriptors, without following a link, holding two of them at most
// however deep the tree (a task may nest directories past PATH_MAX):
// it comes back up through "..", and checks that it came back to the
// directory it left, since a task may rename directories meanwhile.
func walkLayer(ctx context.Context, root string) (usage, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return usage{}, &os.PathError{Op: "open", Path: root, Err: err}
	}
	w := layerWalk{ctx: ctx, seen: make(map[uint64]bool)}
	up, err := w.dir(fd, root)
	if up >= 0 {
		unix.Close(up)
	}
	return w.u, err
}

// layerWalk is one walk of a layer.
type layerWalk struct {
	// ctx ends the walk at the next directory.
	ctx context.Context
	u   usage
	// seen holds the hard-linked files counted already, by inode.
	seen map[uint64]bool
}

// dir adds the entries under the directory dir (shown in errors as
// shown) to the usage. It owns dir, and returns in its place a
// descriptor of dir's parent, opened through "..", for the caller to go
// on with (-1 on error).
func (w *layerWalk) dir(dir int, shown string) (int, error) {
	f := os.NewFile(uintptr(dir), shown)
	if err := w.ctx.Err(); err != nil {
		f.Close()
		return -1, err
	}
	var subdirs []string
	for {
		names, err := f.Readdirnames(1024)
		for _, name := range names {
			var st unix.Stat_t
			if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue // removed since it was listed
				}
				f.Close()
				return -1, &os.PathError{Op: "lstat", Path: filepath.Join(shown, name), Err: err}
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				subdirs = append(subdirs, name)
			case unix.S_IFREG:
				if st.Nlink > 1 {
					if w.seen[st.Ino] {
						continue
					}
					w.seen[st.Ino] = true
				}
				w.u.bytes += st.Size
			}
			w.u.files++
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			f.Close()
			return -1, fmt.Errorf("failed to list %q: %w", shown, err)
		}
	}
	for _, sub := range subdirs {
		var here unix.Stat_t
		if err := unix.Fstat(dir, &here); err != nil {
			f.Close()
			return -1, &os.PathError{Op: "fstat", Path: shown, Err: err}
		}
		child, err := unix.Openat(dir, sub, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			continue // removed or replaced since it was listed
		}
		if err != nil {
			f.Close()
			return -1, &os.PathError{Op: "open", Path: filepath.Join(shown, sub), Err: err}
		}
		// Only the child stays open while it is walked.
		f.Close()
		dir, err = w.dir(child, filepath.Join(shown, sub))
		if err != nil {
			return -1, err
		}
		var back unix.Stat_t
		if err := unix.Fstat(dir, &back); err != nil || back.Dev != here.Dev || back.Ino != here.Ino {
			unix.Close(dir)
			return -1, fmt.Errorf("%q: %w", filepath.Join(shown, sub), errMoved)
		}
		f = os.NewFile(uintptr(dir), shown)
	}
	up, err := unix.Openat(dir, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	f.Close()
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: filepath.Join(shown, ".."), Err: err}
	}
	return up, nil
}

// counted reports whether the store's quota accounting counts st, whose
// usage then needs no walk.
func counted(s *store.Store, st *record.State) bool {
	return st.Disk != nil && s.Quota().Enforced()
}
