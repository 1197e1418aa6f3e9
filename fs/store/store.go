package store

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/lock"
	"github.com/allocfs/allocfs/fs/store/quota"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
)

// Errors of the store that have no counterpart in the allocdir contract.
var (
	// ErrExists: Create was given the ID of an allocation the store
	// already holds.
	ErrExists = errors.New("allocation already exists")
	// ErrNoTasks: an allocation without tasks has nothing to lay out, and
	// would leave the store unable to tell a typo from an intent.
	ErrNoTasks = errors.New("an allocation needs at least one task")
	// ErrNotTerminal: a migration from an allocation that is still
	// running; it must be stopped first, or its tasks would keep writing
	// into data that has moved.
	ErrNotTerminal = errors.New("allocation is not terminal: stop it first")
	// ErrPinned: a Destroy of an allocation that something is still
	// reading (a migration streaming its snapshot).
	ErrPinned = errors.New("allocation is pinned by a migration in progress")
)

// Names of the directories the store owns inside the data dir. The store
// never walks the data dir's root: the default mount point lies inside it.
const (
	stateDirName   = "state"
	layersDirName  = "layers"
	stagingDirName = "staging"
	chrootDirName  = "chroot"
)

// Dirs are the directories the store owns inside the data dir; a
// mount point must not lie within them.
var Dirs = []string{stateDirName, layersDirName, stagingDirName, chrootDirName}

// Store is the backing store of the filesystem: the allocation records in
// state/ and the layers they stack in layers/. Every byte an allocation
// holds is a plain file under the data dir, so an operator can recover
// data with ordinary tools if the daemon is gone.
//
// Every change of the records is one intent of the journal (journal.go):
// changes of several records at once (a migration, a flatten) are as
// crash-atomic as changes of one. A layer that no record names is an
// orphan once no change is making it, and the collector removes it
// (Store.Sweep), so nothing a crash or a failed removal leaves behind
// stays.
//
// All methods are safe for concurrent use. Changes (Create, EnsureTask,
// Update, Destroy, the migrations) are serialized among themselves and do
// their disk work without blocking readers: Get and List only wait for the
// short moment in which an in-memory record is swapped, never for an fsync
// or a removal.
type Store struct {
	logger  hclog.Logger
	dataDir string
	// owner owns fresh layer roots: "nobody" when the daemon runs as root,
	// so that tasks running as nobody can write; nil leaves ownership alone.
	owner *allocdir.Owner
	// disk takes every step that changes the data dir; tests wrap it.
	disk disk.Disk
	lock *lock.Lock

	// writeMu serializes changes, so that each one sees the state left by
	// the previous one while it works on disk with mu released. It also
	// guards the journal's bookkeeping below. The OnChange hooks of the
	// changes made under it run as it is released (changeLock).
	writeMu changeLock
	// seq is the number of the last journaled intent.
	seq uint64
	// journalSize is how many bytes the journal holds.
	journalSize int64
	// dirty holds the allocations changed since the last checkpoint, and
	// freshSince the layers made empty since then.
	dirty      map[string]struct{}
	freshSince []freshLayer
	// broken is set when the journal could not be put back after a
	// failed append: a restart would replay what is there, so the store
	// takes no more changes.
	broken error

	// mu guards the maps below. It is held for memory operations only.
	mu     sync.RWMutex
	allocs map[string]*record.State
	// destroyed holds the IDs destroyed since the store was opened, so a
	// late request can be told "gone" rather than "never existed". It grows
	// by one short string per destroyed allocation.
	destroyed map[string]struct{}
	// pins counts, per allocation, the readers that must finish before it
	// may be destroyed (a snapshot streaming to another node).
	pins map[string]int
	// dying holds the layers being removed (true) or whose removal failed
	// (false), so that no change can stack on a tree that is half
	// deleted. A sweep claims the failed ones again; none claims a layer
	// another removal is working on.
	dying map[string]bool
	// making holds layers a change is preparing outside writeMu (a
	// flatten's merged layer) that no record names yet: not orphans.
	making map[string]struct{}

	hookMu  sync.Mutex
	hooks   map[int]func(id string)
	hookSeq int

	// events wakes followers of the store's files; see watch.go.
	events storeEvents

	// obs is told of migrations and collections (SetObserver).
	obs Observer

	// quota, when set, enforces allocations' disk limits (quota.go);
	// quotaReport says what the data dir can do either way. groups is
	// the range of group IDs the store owns, defaultLimit what a new
	// allocation gets, and unsettled is set while the kernel's groups
	// may disagree with the records (a settle failed). Guarded by
	// writeMu.
	quota        quota.Mechanism
	quotaStep    func(op, path string) error
	quotaReport  quota.Report
	groups       [2]uint64
	defaultLimit record.Limit
	unsettled    bool
	// settleErr holds the last settle's error, for health.
	settleErr atomic.Pointer[error]
}

// Open opens the store in dataDir, creating its directories if they are
// missing. It takes the data dir's lock (a second store on the same data
// dir fails with lock.ErrLocked), empties staging/ (a half-received snapshot
// is never resumed), loads every allocation and replays what the journal
// holds beyond the state files. It refuses to start on a state file it
// cannot read, or one that references a missing layer: starting without
// it would silently lose an allocation, so the error says which file to
// move away instead. Close releases the lock.
func Open(logger hclog.Logger, dataDir string) (*Store, error) {
	return OpenWith(logger, dataDir, Options{})
}

// Options are what OpenWith may change about a store.
type Options struct {
	// Disk takes every step that changes the data dir; nil is disk.OS.
	// Crash and fault tests pass one that stops or fails steps, and
	// tests about something other than durability one without syncs.
	Disk disk.Disk
	// Quotas turns on disk limits where the data dir's filesystem can
	// enforce them (btrfs: quota accounting is enabled, and every new
	// layer is a subvolume). Where it cannot, the store opens without
	// them and Quota says why.
	Quotas bool
	// Groups is the range of quota group IDs the store may take;
	// quota.DefaultGroups when zero.
	Groups [2]uint64
	// DefaultLimit is given to every new allocation that asks for none.
	DefaultLimit record.Limit
	// quotaStep, when set, takes every change the quota makes in the
	// kernel as a step of Disk's (the crash tests').
	quotaStep func(op, path string) error
}

// OpenWith is Open with options.
func OpenWith(logger hclog.Logger, dataDir string, opts Options) (_ *Store, err error) {
	d := opts.Disk
	if d == nil {
		d = disk.OS{}
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return nil, fmt.Errorf("failed to resolve data dir %q: %w", dataDir, err)
	}
	s := &Store{
		logger:    logger.Named("store"),
		dataDir:   abs,
		disk:      d,
		dirty:     make(map[string]struct{}),
		allocs:    make(map[string]*record.State),
		destroyed: make(map[string]struct{}),
		pins:      make(map[string]int),
		dying:     make(map[string]bool),
		making:    make(map[string]struct{}),
		hooks:     make(map[int]func(id string)),
		obs:       nopObserver{},
	}
	s.writeMu.publish = s.publish
	// Modes are forced on what we create, so the umask does not matter;
	// what exists already is the operator's choice and is left alone.
	if _, err := os.Lstat(abs); errors.Is(err, iofs.ErrNotExist) {
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, fmt.Errorf("failed to create data dir: %w", err)
		}
		if err := os.Chmod(abs, 0o755); err != nil {
			return nil, fmt.Errorf("failed to create data dir: %w", err)
		}
	}
	l, err := lock.Take(abs)
	if err != nil {
		return nil, err
	}
	s.lock = l
	defer func() {
		if err != nil {
			l.Release()
		}
	}()
	for _, name := range Dirs {
		p := filepath.Join(abs, name)
		err := os.Mkdir(p, 0o700)
		if err == nil {
			err = os.Chmod(p, 0o700)
		}
		if err != nil && !errors.Is(err, iofs.ErrExist) {
			return nil, fmt.Errorf("failed to create %q: %w", p, err)
		}
		// A link or a file in place of one of these directories would
		// send the daemon's writes somewhere else.
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("failed to inspect %q: %w", p, err)
		}
		if !fi.IsDir() {
			return nil, fmt.Errorf("%q is not a directory (%s): move it out of the data dir", p, fi.Mode().Type())
		}
	}

	s.owner = allocdir.Nobody()
	if os.Geteuid() == 0 && s.owner == nil {
		s.logger.Warn("no user nobody: layers stay owned by root, so tasks running as nobody cannot write to them")
	}

	s.groups, s.defaultLimit, s.quotaStep = opts.Groups, opts.DefaultLimit, opts.quotaStep
	if s.groups == ([2]uint64{}) {
		s.groups = quota.DefaultGroups
	}
	if s.groups[0] == 0 || s.groups[0] > s.groups[1] || s.groups[1] >= 1<<48 {
		return nil, fmt.Errorf("quota group range %d-%d: %w", s.groups[0], s.groups[1], record.ErrBadLimit)
	}
	if err := s.openQuota(opts.Quotas); err != nil {
		return nil, err
	}
	if !s.defaultLimit.IsZero() {
		if err := s.checkLimit(s.defaultLimit); err != nil {
			return nil, fmt.Errorf("default disk limit: %w", err)
		}
	}
	if err := s.cleanStaging(); err != nil {
		return nil, err
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	s.writeMu.Lock()
	err = s.replayJournal()
	if err == nil {
		err = s.adoptRetiredFile()
	}
	s.writeMu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := s.checkLayers(); err != nil {
		return nil, err
	}
	if err := s.upgradeRecords(); err != nil {
		return nil, err
	}
	s.writeMu.Lock()
	s.unsettled = true
	s.settleQuota(nil, nil)
	s.writeMu.Unlock()
	s.logger.Info("opened store", "data_dir", abs, "allocations", len(s.allocs))
	return s, nil
}

// cleanStaging removes everything in staging/: whatever is there was being
// received when the daemon stopped, and nothing references it.
func (s *Store) cleanStaging() error {
	entries, err := os.ReadDir(s.StagingDir())
	if err != nil {
		return fmt.Errorf("failed to list staging dir: %w", err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(s.StagingDir(), e.Name())
		if err := s.disk.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove leftover %q: %w", p, err))
			continue
		}
		s.logger.Debug("removed leftover from staging", "path", p)
	}
	return errors.Join(errs...)
}

// load reads every state file into memory and removes temporary files
// left by a write that did not complete.
func (s *Store) load() error {
	dir := s.stateDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("failed to list state dir: %w", err)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case e.Name() == journalName:
		case strings.HasSuffix(e.Name(), ".tmp"):
			if err := s.disk.Remove(p); err != nil {
				return fmt.Errorf("failed to remove temporary state file %q: %w", p, err)
			}
			s.logger.Debug("removed temporary state file", "path", p)
		case strings.HasSuffix(e.Name(), record.Suffix):
			st, err := record.Read(p)
			if err != nil {
				// The journal may hold this record whole: a power cut
				// can leave a state file renamed in but empty.
				if s.journalHas(strings.TrimSuffix(e.Name(), record.Suffix)) {
					s.logger.Warn("unreadable state file; the journal has its record", "path", p, "error", err)
					continue
				}
				return fmt.Errorf("failed to load allocation state %q: %w; "+
					"move the file out of %q to start without that allocation", p, err, dir)
			}
			s.allocs[st.ID] = st
		default:
			s.logger.Warn("ignoring unexpected file in state dir", "path", p)
		}
	}
	return nil
}

// journalHas reports whether the journal holds a record of id.
func (s *Store) journalHas(id string) bool {
	data, err := os.ReadFile(s.journalPath())
	if err != nil {
		return false
	}
	intents, _, err := decodeJournal(data)
	if err != nil {
		return false
	}
	for _, in := range intents {
		if _, ok := in.Records[id]; ok {
			return true
		}
	}
	return false
}

// checkLayers checks that every layer an allocation stacks exists, and
// reports the layers none references: the leftovers of a crash between
// creating a layer and journaling the change that names it, or of a
// removal that did not finish. Every change that hands layers over is one
// journaled intent, so nothing unreferenced can hold data a record still
// needs: the collector removes them (Sweep).
func (s *Store) checkLayers() error {
	ids := make([]string, 0, len(s.allocs))
	for id := range s.allocs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		st := s.allocs[id]
		for _, l := range sortedKeys(st.LayerIDs()) {
			if err := s.checkLayer(l); err != nil {
				return fmt.Errorf("allocation %q references layer %s, which is unusable: %w; "+
					"restore the layer, or move %q out of the data dir to start without that allocation",
					id, l, err, s.statePath(id))
			}
		}
	}
	orphans, err := s.orphansLocked()
	if err != nil {
		return err
	}
	for _, l := range orphans {
		s.logger.Info("orphan layer: the collector will remove it", "layer", l)
	}
	return nil
}

// checkLayer checks that a layer exists and is a directory.
func (s *Store) checkLayer(id string) error {
	fi, err := os.Lstat(s.LayerPath(id))
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%q is not a directory", s.LayerPath(id))
	}
	return nil
}

// DataDir returns the absolute path of the data dir.
func (s *Store) DataDir() string { return s.dataDir }

// Announce records the mount point in the data dir's lock, so that a
// second daemon started on the same data dir says where the first one
// serves.
func (s *Store) Announce(mount string) error {
	return s.lock.Describe(mount)
}

// LayerPath returns the directory of a layer, <dataDir>/layers/<layerID>.
// layerID must come from a State: it is not checked here.
func (s *Store) LayerPath(layerID string) string {
	return filepath.Join(s.dataDir, layersDirName, layerID)
}

// StagingDir returns <dataDir>/staging, where incoming snapshots are
// unpacked before they become layers. It is emptied at every open, so
// nothing there may be referenced by a record.
func (s *Store) StagingDir() string {
	return filepath.Join(s.dataDir, stagingDirName)
}

// ChrootDir returns <dataDir>/chroot, where the mount keeps the skeleton
// of its chroot environment (derived from its configuration, rebuilt as
// needed, never named by a record).
func (s *Store) ChrootDir() string {
	return filepath.Join(s.dataDir, chrootDirName)
}

// Statfs reports the filesystem that holds the data dir, which is what
// the mount's statfs and the GC's disk thresholds are about.
func (s *Store) Statfs() (unix.Statfs_t, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.dataDir, &st); err != nil {
		return st, &os.PathError{Op: "statfs", Path: s.dataDir, Err: err}
	}
	return st, nil
}

func (s *Store) stateDir() string { return filepath.Join(s.dataDir, stateDirName) }

func (s *Store) layersDir() string { return filepath.Join(s.dataDir, layersDirName) }

func (s *Store) statePath(id string) string {
	return filepath.Join(s.stateDir(), id+record.Suffix)
}

// lookup returns the record of id (not a copy). The caller holds mu.
func (s *Store) lookup(id string) (*record.State, error) {
	if st, ok := s.allocs[id]; ok {
		return st, nil
	}
	if _, ok := s.destroyed[id]; ok {
		return nil, &goneError{id: id}
	}
	return nil, fmt.Errorf("%w %q", allocdir.ErrUnknownAlloc, id)
}

// goneError is returned for an allocation destroyed since the store was
// opened. It is both ErrGone, which is what happened, and
// ErrUnknownAlloc, which is what a caller that only knows of live
// allocations needs to hear.
type goneError struct{ id string }

func (e *goneError) Error() string {
	return fmt.Sprintf("allocation %q has been garbage collected", e.id)
}

func (e *goneError) Is(target error) bool {
	return target == allocdir.ErrGone || target == allocdir.ErrUnknownAlloc
}

// stateError is a refusal for an allocation's state whose message says
// it all: it is its kind (errors.Is) without repeating the kind's text.
type stateError struct {
	msg  string
	kind error
}

func (e *stateError) Error() string        { return e.msg }
func (e *stateError) Is(target error) bool { return target == e.kind }

// Get returns a copy of the record of id.
func (s *Store) Get(id string) (*record.State, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	return st.Clone(), nil
}

// View returns the committed record of id without copying it. It is for
// the mount's request handlers, which run on every lookup and getattr:
// committed records are never modified (every change commits a new
// record), so the result may be read freely and must never be written.
func (s *Store) View(id string) (*record.State, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lookup(id)
}

// IDs returns the IDs of every allocation, sorted.
func (s *Store) IDs() []string {
	s.mu.RLock()
	out := make([]string, 0, len(s.allocs))
	for id := range s.allocs {
		out = append(out, id)
	}
	s.mu.RUnlock()
	sort.Strings(out)
	return out
}

// Len is the number of allocations the store holds.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.allocs)
}

// List returns a copy of every record, sorted by ID.
func (s *Store) List() []*record.State {
	s.mu.RLock()
	out := make([]*record.State, 0, len(s.allocs))
	for _, st := range s.allocs {
		out = append(out, st.Clone())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// OnChange registers fn to be called with the ID of every allocation
// created, changed or destroyed, and returns a func that removes it. fn
// runs synchronously on the goroutine that made the change, once the
// change is on disk and the store takes changes again, so that when
// Create, Destroy or Migrate returns, fn's effect (the mount forgetting what
// the kernel cached) has happened. fn must be quick and must not change
// the store. It may send kernel notifications: the mount defers those of
// changes its own request handlers make.
func (s *Store) OnChange(fn func(id string)) func() {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.hookSeq++
	key := s.hookSeq
	s.hooks[key] = fn
	return func() {
		s.hookMu.Lock()
		defer s.hookMu.Unlock()
		delete(s.hooks, key)
	}
}

// changeLock is the lock changes hold (Store.writeMu). The OnChange hooks
// of what changed under it run once it is released, still before the
// change's method returns: a hook's kernel notification may wait for a
// directory that a FUSE request holds locked while its handler waits for
// this lock (a mkdir at the mount root while the API creates another
// allocation), and held, the lock would make that a deadlock.
type changeLock struct {
	sync.Mutex
	// pending are the allocations changed since the lock was taken.
	pending []string
	publish func(id string)
}

// Unlock releases the lock, then tells the hooks of what changed.
func (l *changeLock) Unlock() {
	pending := l.pending
	l.pending = nil
	l.Mutex.Unlock()
	for _, id := range pending {
		l.publish(id)
	}
}

// publish calls every OnChange hook with id.
func (s *Store) publish(id string) {
	s.hookMu.Lock()
	fns := make([]func(string), 0, len(s.hooks))
	for _, fn := range s.hooks {
		fns = append(fns, fn)
	}
	s.hookMu.Unlock()
	for _, fn := range fns {
		fn(id)
	}
}

// sortedKeys returns the keys of a set in order, so that checks and
// removals happen in a reproducible order.
func sortedKeys(set map[string]struct{}) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
