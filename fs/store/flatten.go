package store

import (
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/allocfs/allocfs/fs/layer"
	"github.com/allocfs/allocfs/fs/store/record"

	"github.com/allocfs/allocfs/allocdir"
)

// MaxLowers bounds the lower layers of a volume. Every snapshot migration
// adds one, and a name missing from the upper layer costs one lstat per
// lower on lookup, so without a bound a long-lived job's lookups slow down
// with every deploy. Four keeps a miss within five backing lookups (about
// what a plain path of that depth costs) while leaving room for the
// layers a stopped previous allocation still needs on its own: below it,
// each flatten relinks little more than a generation's changes.
const MaxLowers = 4

// errFlattenRaced reports that the store changed while a merged layer was
// being built, so that it no longer stands in for the pair it was built
// from. Nothing was changed; the next pass plans again.
var errFlattenRaced = errors.New("the layers changed while they were being merged")

// flattenPlan is one merge: upper sits directly on lower in every volume
// that references either.
type flattenPlan struct {
	upper, lower string
	// key is the volume over the bound that asked for the merge; other
	// volumes (the stopped previous allocation's frozen view) share it.
	key string
	// allocs are the allocations that reference the pair, sorted.
	allocs []string
	// through is set when some volume has layers below the pair, so the
	// merged layer must keep hiding what the pair hid (whiteouts, opaque
	// directories); with nothing below they are dropped.
	through bool
}

// Flatten merges adjacent lower layers until no volume has more than
// MaxLowers of them, or no pair of the deep ones can be merged: a pair
// can only be merged when every volume that references either layer
// stacks them the same way, which a stopped previous allocation's frozen
// view breaks until it is collected. It returns how many merges it made.
// Merges run one at a time; each costs one link(2) per entry of the pair
// and copies no bytes (see flatten). Layers merged away are retained by
// the allocations that stacked them, and swept once those are gone.
//
// On a store whose layers are btrfs subvolumes (disk limits on) nothing
// is merged: link(2) between two subvolumes fails (EXDEV), and a merge by
// cloning would give the merged files new inode numbers under open
// files. Such volumes keep their depth until their allocations go.
func (s *Store) Flatten() (int, error) {
	if s.quota != nil && s.quota.Subvolumes() {
		return 0, nil
	}
	var errs []error
	n := 0
	for {
		plan, err := s.nextPlan()
		if err != nil {
			errs = append(errs, err)
			break
		}
		if plan == nil {
			break
		}
		if err := s.flatten(plan); err != nil {
			// A failed or raced merge changed nothing: trying the same
			// pair again in this pass would fail the same way.
			if !errors.Is(err, errFlattenRaced) {
				errs = append(errs, err)
			}
			break
		}
		n++
	}
	return n, errors.Join(errs...)
}

// nextPlan chooses the next merge: among the mergeable adjacent lower
// layers of volumes over the bound, the pair with the fewest entries,
// because each merge relinks everything in both layers and merging the
// small, recent deltas first keeps the large base layers from being
// relinked on every generation. It returns nil when there is nothing to do.
func (s *Store) nextPlan() (*flattenPlan, error) {
	s.mu.RLock()
	var cands []*flattenPlan
	seen := make(map[[2]string]bool)
	for _, id := range sortedKeys(allocSet(s.allocs)) {
		st := s.allocs[id]
		for _, key := range st.VolumeKeys() {
			v := st.Volumes[key]
			if v == nil || len(v.Lowers) <= MaxLowers {
				continue
			}
			for i := 0; i+1 < len(v.Lowers); i++ {
				pair := [2]string{v.Lowers[i], v.Lowers[i+1]}
				if seen[pair] {
					continue
				}
				seen[pair] = true
				if p := s.mergeableLocked(pair[0], pair[1]); p != nil {
					p.key = key
					cands = append(cands, p)
				}
			}
		}
	}
	s.mu.RUnlock()
	if len(cands) == 0 {
		return nil, nil
	}
	// Layers below the writable upper never change, so they can be
	// counted without holding the store.
	counts := make(map[string]int)
	count := func(l string) (int, error) {
		if n, ok := counts[l]; ok {
			return n, nil
		}
		n, err := countEntries(s.LayerPath(l))
		if err != nil {
			return 0, fmt.Errorf("failed to count entries of layer %s: %w", l, err)
		}
		counts[l] = n
		return n, nil
	}
	var best *flattenPlan
	bestCost := 0
	for _, p := range cands {
		a, err := count(p.upper)
		if err != nil {
			return nil, err
		}
		b, err := count(p.lower)
		if err != nil {
			return nil, err
		}
		if best == nil || a+b < bestCost {
			best, bestCost = p, a+b
		}
	}
	return best, nil
}

// mergeableLocked returns the plan for merging upper onto lower, or nil
// if some volume references one without the other directly below it,
// writes into one of them, or belongs to a pinned allocation (a snapshot
// streaming from those paths). The caller holds mu.
func (s *Store) mergeableLocked(upper, lower string) *flattenPlan {
	if upper == lower {
		return nil
	}
	for _, l := range []string{upper, lower} {
		if _, ok := s.dying[l]; ok {
			return nil
		}
	}
	p := &flattenPlan{upper: upper, lower: lower}
	for _, id := range sortedKeys(allocSet(s.allocs)) {
		st := s.allocs[id]
		uses := false
		for _, v := range st.Volumes {
			if v == nil {
				continue
			}
			if !v.ReadOnly && (v.Upper == upper || v.Upper == lower) {
				return nil
			}
			stack := frozenStack(v)
			i, j := indexOf(stack, upper), indexOf(stack, lower)
			if i < 0 && j < 0 {
				continue
			}
			if i < 0 || j != i+1 {
				return nil
			}
			uses = true
			if j+1 < len(stack) {
				p.through = true
			}
		}
		if !uses {
			continue
		}
		if s.pins[id] > 0 {
			return nil
		}
		p.allocs = append(p.allocs, id)
	}
	if len(p.allocs) == 0 {
		return nil
	}
	return p
}

// frozenStack is the part of a volume's stack that nothing writes: its
// lowers, and its upper too when the volume is frozen (a stopped previous
// allocation keeps its sealed layer as a read-only upper).
func frozenStack(v *record.Volume) []string {
	if v.ReadOnly {
		return v.Layers()
	}
	return v.Lowers
}

func indexOf(list []string, s string) int {
	for i, e := range list {
		if e == s {
			return i
		}
	}
	return -1
}

func allocSet(m map[string]*record.State) map[string]struct{} {
	out := make(map[string]struct{}, len(m))
	for id := range m {
		out[id] = struct{}{}
	}
	return out
}

// flatten carries out one merge. The merged layer is built in staging
// (emptied at every start, so a crash while building leaves nothing to
// undo) and synced; then, under writeMu, it is renamed into layers/ and
// every record that stacked the pair is switched to it in one journaled
// intent, each record retaining the pair. The pair cannot be removed yet:
// the mount keeps serving a volume it has looked up from the layer paths
// it resolved then, for as long as the kernel holds the volume's root
// (any open file or working directory below it), because go-fuse gives a
// new lookup the live node of equal identity, and a volume's identity is
// its upper layer, which a flatten leaves alone. Those nodes read the same
// files through the pair as new ones read through the merged layer. Once
// the allocations that retain the pair are gone, it is an orphan, and the
// collector's sweep removes it.
func (s *Store) flatten(p *flattenPlan) (err error) {
	start := time.Now()
	stage, err := s.stagingDir("flatten")
	if err != nil {
		return fmt.Errorf("failed to flatten layers %s and %s: %w", p.upper, p.lower, err)
	}
	defer func() {
		if err == nil {
			return
		}
		if _, serr := os.Lstat(stage); serr != nil {
			return
		}
		if rerr := s.disk.RemoveAll(stage); rerr != nil {
			err = errors.Join(err, fmt.Errorf("failed to remove staging dir %q: %w", stage, rerr))
		}
	}()
	made, err := layer.Merge(s.disk, stage, s.LayerPath(p.upper), s.LayerPath(p.lower), p.through)
	if err != nil {
		return fmt.Errorf("failed to merge layer %s onto %s: %w", p.upper, p.lower, err)
	}
	// The links and directories must be on disk before a record names
	// them; one syncfs is cheaper than an fsync per directory.
	if err := s.disk.Syncfs(stage); err != nil {
		return fmt.Errorf("failed to sync merged layer: %w", err)
	}
	merged, allocs, err := s.switchLayers(p, stage)
	if err != nil {
		return err
	}
	s.logger.Info("flattened layers",
		"upper", p.upper, "lower", p.lower, "merged", merged, "volume", p.key,
		"allocs", strings.Join(allocs, ","), "links", made.Links, "dirs", made.Dirs,
		"duration", time.Since(start))
	return nil
}

// stagingDir creates a fresh directory in staging/ whose name starts with
// prefix.
func (s *Store) stagingDir(prefix string) (string, error) {
	for range 8 {
		id, err := newLayerID()
		if err != nil {
			return "", err
		}
		p := filepath.Join(s.StagingDir(), prefix+"-"+id)
		err = s.disk.Mkdir(p, 0o700)
		if errors.Is(err, iofs.ErrExist) {
			continue
		}
		return p, err
	}
	return "", errors.New("failed to find an unused staging name")
}

// switchLayers renames the merged layer built in stage into layers/ and
// makes every allocation that stacks the pair name it instead, retaining
// the pair, in one journaled intent. If the store moved on while the layer
// was built, nothing changes and the error is errFlattenRaced. It returns
// the merged layer and the allocations switched.
func (s *Store) switchLayers(p *flattenPlan, stage string) (string, []string, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.RLock()
	now := s.mergeableLocked(p.upper, p.lower)
	s.mu.RUnlock()
	// A merged layer built without whiteouts cannot stand over layers
	// that something stacked under the pair since.
	if now == nil || (now.through && !p.through) {
		return "", nil, fmt.Errorf("failed to flatten layers %s and %s: %w", p.upper, p.lower, errFlattenRaced)
	}
	records := make(map[string]*record.State, len(now.allocs))
	for _, id := range now.allocs {
		st, err := s.Get(id)
		if err != nil {
			return "", nil, err
		}
		records[id] = st
	}
	merged, err := s.importLocked(stage)
	if err != nil {
		return "", nil, fmt.Errorf("failed to flatten layers %s and %s: %w", p.upper, p.lower, err)
	}
	for _, st := range records {
		for _, v := range st.Volumes {
			if v != nil {
				replacePair(v, p.upper, p.lower, merged)
			}
		}
		for _, l := range []string{p.upper, p.lower} {
			if !slices.Contains(st.Retained, l) {
				st.Retained = append(st.Retained, l)
			}
		}
	}
	err = s.disk.Fsync(s.layersDir())
	if err == nil {
		err = s.change(&intent{Op: "flatten", Records: records})
	}
	if err != nil {
		err = fmt.Errorf("failed to switch to merged layer %s: %w", merged, err)
		if rerr := s.disk.RemoveAll(s.LayerPath(merged)); rerr != nil {
			err = errors.Join(err, fmt.Errorf("merged layer %s left for the collector: %w", merged, rerr))
		}
		return "", nil, err
	}
	return merged, now.allocs, nil
}

// replacePair puts merged in the place of upper stacked on lower.
func replacePair(v *record.Volume, upper, lower, merged string) {
	if v.ReadOnly && v.Upper == upper && len(v.Lowers) > 0 && v.Lowers[0] == lower {
		v.Upper = merged
		v.Lowers = v.Lowers[1:]
	} else if i := indexOf(v.Lowers, upper); i >= 0 && i+1 < len(v.Lowers) && v.Lowers[i+1] == lower {
		v.Lowers = append(append(append([]string(nil), v.Lowers[:i]...), merged), v.Lowers[i+2:]...)
	}
	if len(v.Lowers) == 0 {
		v.Lowers = nil
	}
}

// retiredFile is where an earlier version of allocfs recorded the layers a
// flatten replaced. Its layers are now retained by the allocations that
// stacked them (record.State.Retained); adoptRetiredFile moves them there.
const retiredFile = "retired-layers.json"

// retiredRecord is one entry of retiredFile.
type retiredRecord struct {
	Layers []string `json:"layers"`
	Allocs []string `json:"allocs"`
}

// adoptRetiredFile moves the layers an earlier version retired into the
// records of the allocations that stacked them, in one journaled intent,
// and then removes the file. Layers whose allocations are all gone become
// orphans for the collector. It runs in Open, with writeMu held.
func (s *Store) adoptRetiredFile() error {
	p := filepath.Join(s.dataDir, retiredFile)
	data, err := os.ReadFile(p)
	if errors.Is(err, iofs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("failed to read %q: %w", p, err)
	}
	var records []retiredRecord
	if err := json.Unmarshal(data, &records); err != nil {
		s.logger.Warn("ignoring an unreadable list of retired layers; they are orphans now", "path", p, "error", err)
		records = nil
	}
	changed := make(map[string]*record.State)
	for _, r := range records {
		for _, id := range r.Allocs {
			st := changed[id]
			if st == nil {
				var err error
				if st, err = s.Get(id); err != nil {
					continue
				}
			}
			for _, l := range r.Layers {
				// Only names the store could have made: a layer ID is
				// joined to a path.
				if allocdir.ValidName(l) == nil && !slices.Contains(st.Retained, l) {
					st.Retained = append(st.Retained, l)
				}
			}
			changed[id] = st
		}
	}
	if len(changed) > 0 {
		if err := s.change(&intent{Op: "update", Records: changed}); err != nil {
			return fmt.Errorf("failed to adopt %q: %w", p, err)
		}
	}
	if err := s.disk.Remove(p); err != nil {
		return fmt.Errorf("failed to remove %q: %w", p, err)
	}
	return nil
}

// countEntries counts the entries of a tree, directories included.
func countEntries(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(_ string, _ iofs.DirEntry, err error) error {
		n++
		return err
	})
	return n, err
}
