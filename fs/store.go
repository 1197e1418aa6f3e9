package fs

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/allocfs/allocfs/allocdir"
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
)

// StoreDirs are the directories the store owns inside the data dir; a
// mount point must not lie within them.
var StoreDirs = []string{stateDirName, layersDirName, stagingDirName}

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
	disk disk
	lock *dirLock

	// writeMu serializes changes, so that each one sees the state left by
	// the previous one while it works on disk with mu released. It also
	// guards the journal's bookkeeping below.
	writeMu sync.Mutex
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
	allocs map[string]*State
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
}

// OpenStore opens the store in dataDir, creating its directories if they
// are missing. It takes the data dir's lock (a second store on the same
// data dir fails with ErrLocked), empties staging/ (a half-received
// snapshot is never resumed), loads every allocation and replays what the
// journal holds beyond the state files. It refuses to start on a state
// file it cannot read, or one that references a missing layer: starting
// without it would silently lose an allocation, so the error says which
// file to move away instead. Close releases the lock.
func OpenStore(logger hclog.Logger, dataDir string) (*Store, error) {
	return openStore(logger, dataDir, osDisk{})
}

func openStore(logger hclog.Logger, dataDir string, d disk) (_ *Store, err error) {
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
		allocs:    make(map[string]*State),
		destroyed: make(map[string]struct{}),
		pins:      make(map[string]int),
		dying:     make(map[string]bool),
		making:    make(map[string]struct{}),
		hooks:     make(map[int]func(id string)),
	}
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
	lock, err := lockDataDir(abs)
	if err != nil {
		return nil, err
	}
	s.lock = lock
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	for _, name := range StoreDirs {
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
		if err := s.disk.removeAll(p); err != nil {
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
			if err := s.disk.remove(p); err != nil {
				return fmt.Errorf("failed to remove temporary state file %q: %w", p, err)
			}
			s.logger.Debug("removed temporary state file", "path", p)
		case strings.HasSuffix(e.Name(), stateSuffix):
			st, err := readState(p)
			if err != nil {
				// The journal may hold this record whole: a power cut
				// can leave a state file renamed in but empty.
				if s.journalHas(strings.TrimSuffix(e.Name(), stateSuffix)) {
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
		for _, l := range sortedKeys(st.layerIDs()) {
			if err := s.checkLayer(l); err != nil {
				return fmt.Errorf("allocation %s references layer %s, which is unusable: %w; "+
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

// LayerPath returns the directory of a layer, <dataDir>/layers/<layerID>.
// layerID must come from a State: it is not checked here.
func (s *Store) LayerPath(layerID string) string {
	return filepath.Join(s.dataDir, layersDirName, layerID)
}

// StagingDir returns <dataDir>/staging, where incoming snapshots are
// unpacked before they become layers. It is emptied at every open, so
// nothing there may be referenced by a State.
func (s *Store) StagingDir() string {
	return filepath.Join(s.dataDir, stagingDirName)
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
	return filepath.Join(s.stateDir(), id+stateSuffix)
}

// Create records a new allocation with one fresh layer per volume:
// alloc/data, alloc/logs and alloc/tmp, and each task's local/ and tmp/.
// It either succeeds completely or leaves nothing behind: no layer, no
// state file, no entry.
func (s *Store) Create(id string, tasks []allocdir.Task) (*State, error) {
	if len(tasks) == 0 {
		return nil, fmt.Errorf("failed to create allocation %s: %w", id, ErrNoTasks)
	}
	return s.create(id, tasks)
}

// Build makes sure allocation id exists, creating it with its alloc-level
// volumes and no tasks if it does not: the allocdir contract builds an
// allocation before its tasks. An existing allocation is returned as is.
func (s *Store) Build(id string) (*State, error) {
	st, err := s.create(id, nil)
	if errors.Is(err, ErrExists) {
		return s.Get(id)
	}
	return st, err
}

func (s *Store) create(id string, tasks []allocdir.Task) (*State, error) {
	st, err := s.newState(id, tasks)
	if err != nil {
		return nil, err
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.absent(id); err != nil {
		return nil, err
	}
	fresh, err := s.freshVolumes(st)
	if err == nil {
		err = s.change(&intent{Op: "create", Records: map[string]*State{id: st}, Fresh: fresh})
	}
	if err != nil {
		return nil, fmt.Errorf("failed to create allocation %s: %w", id, errors.Join(err, s.removeFresh(fresh)))
	}
	s.logger.Info("created allocation", "alloc_id", id, "tasks", len(tasks))
	return s.Get(id)
}

// EnsureTask adds task to an existing allocation, with fresh layers for
// its local/ and tmp/, or updates the secrets size and user of a task it
// already has. Adding a task that is there already is not an error:
// drivers register tasks again after a restart.
func (s *Store) EnsureTask(id string, task allocdir.Task) (*State, error) {
	if err := validTaskName(task.Name); err != nil {
		return nil, fmt.Errorf("failed to add task to allocation %s: %w", id, err)
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	// Get's copy is current: every change holds writeMu.
	st, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	changed := false
	if i := st.task(task.Name); i < 0 {
		st.Tasks = append(st.Tasks, task)
		changed = true
	} else if st.Tasks[i].SecretsMB != task.SecretsMB || st.Tasks[i].User != task.User {
		st.Tasks[i].SecretsMB = task.SecretsMB
		st.Tasks[i].User = task.User
		changed = true
	}
	// A volume may be missing for a task that is already recorded, if a
	// record was edited by hand: give it a fresh layer rather than fail.
	var specs []volumeSpec
	for _, v := range taskVolumes(task.Name) {
		if st.Volumes[v.key] == nil {
			specs = append(specs, v)
		}
	}
	if !changed && len(specs) == 0 {
		return st, nil
	}
	if err := s.commitWithLayers("update", st, specs); err != nil {
		return nil, fmt.Errorf("failed to add task %q to allocation %s: %w", task.Name, id, err)
	}
	s.logger.Debug("ensured task", "alloc_id", id, "task", task.Name)
	return s.Get(id)
}

// commitWithLayers creates a fresh upper layer for each spec, records them
// in st, and journals st as one change. On failure it removes the layers
// it created and leaves the store as it was. The caller holds writeMu.
func (s *Store) commitWithLayers(op string, st *State, specs []volumeSpec) (err error) {
	var fresh []freshLayer
	defer func() {
		if err != nil {
			err = errors.Join(err, s.removeFresh(fresh))
		}
	}()
	for _, spec := range specs {
		f, err := s.newLayer(spec.mode, "")
		if err != nil {
			return fmt.Errorf("failed to create layer for %s: %w", spec.key, err)
		}
		fresh = append(fresh, f)
		st.Volumes[spec.key] = &Volume{Upper: f.ID}
	}
	return s.change(&intent{Op: op, Records: map[string]*State{st.ID: st}, Fresh: fresh})
}

// commit journals st as the new record of its allocation. The caller holds
// writeMu and no longer touches st.
func (s *Store) commit(op string, st *State) error {
	return s.change(&intent{Op: op, Records: map[string]*State{st.ID: st}})
}

// newLayer creates an empty layer whose root has mode (forced, so the
// umask does not matter) and the store's owner, holding a MIGRATED-TO
// file with note if note is not empty. Nothing is synced: the intent that
// names the layer describes it, and a replay makes it again if a power
// cut lost it.
func (s *Store) newLayer(mode os.FileMode, note string) (freshLayer, error) {
	for range 8 {
		id, err := newLayerID()
		if err != nil {
			return freshLayer{}, err
		}
		s.mu.RLock()
		_, dying := s.dying[id]
		s.mu.RUnlock()
		if dying {
			continue
		}
		f := freshLayer{ID: id, Mode: mode, UID: -1, GID: -1, Note: note}
		if s.owner != nil {
			f.UID, f.GID = s.owner.UID, s.owner.GID
		}
		err = s.makeLayer(s.LayerPath(id), f)
		if errors.Is(err, iofs.ErrExist) {
			continue
		}
		if err != nil {
			return freshLayer{}, err
		}
		return f, nil
	}
	return freshLayer{}, errors.New("failed to find an unused layer ID")
}

// makeLayer creates the layer f describes at p: the root, its owner, then
// its mode (chown after chmod could clear mode bits), then the note.
func (s *Store) makeLayer(p string, f freshLayer) error {
	if err := s.disk.mkdir(p, 0o700); err != nil {
		return err
	}
	err := func() error {
		if f.UID >= 0 {
			if err := s.disk.lchown(p, f.UID, f.GID); err != nil {
				return err
			}
		}
		if err := s.disk.chmod(p, uint32(f.Mode.Perm())|unixModeBits(f.Mode)); err != nil {
			return err
		}
		if f.Note != "" {
			return s.disk.writeFile(filepath.Join(p, MigratedToName), []byte(f.Note), 0o444)
		}
		return nil
	}()
	if err != nil {
		return errors.Join(err, s.disk.removeAll(p))
	}
	return nil
}

// unixModeBits returns the set-id and sticky bits of m in chmod(2)'s form.
func unixModeBits(m os.FileMode) uint32 {
	var out uint32
	if m&os.ModeSetuid != 0 {
		out |= unix.S_ISUID
	}
	if m&os.ModeSetgid != 0 {
		out |= unix.S_ISGID
	}
	if m&os.ModeSticky != 0 {
		out |= unix.S_ISVTX
	}
	return out
}

// removeFresh removes layers created by a change that failed. They are
// new and referenced by nothing, so removing them cannot lose data; one
// that cannot be removed is an orphan the collector removes later.
func (s *Store) removeFresh(layers []freshLayer) error {
	var errs []error
	for _, l := range layers {
		if err := s.disk.removeAll(s.LayerPath(l.ID)); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove new layer %s: %w", l.ID, err))
		}
	}
	return errors.Join(errs...)
}

// newLayerID returns 16 random hex characters.
func newLayerID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("failed to generate a layer ID: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// lookup returns the record of id (not a copy). The caller holds mu.
func (s *Store) lookup(id string) (*State, error) {
	if st, ok := s.allocs[id]; ok {
		return st, nil
	}
	if _, ok := s.destroyed[id]; ok {
		return nil, &goneError{id: id}
	}
	return nil, fmt.Errorf("allocation %s: %w", id, allocdir.ErrUnknownAlloc)
}

// goneError is returned for an allocation destroyed since the store was
// opened. It is both ErrGone, which is what happened, and
// ErrUnknownAlloc, which is what a caller that only knows of live
// allocations needs to hear.
type goneError struct{ id string }

func (e *goneError) Error() string {
	return fmt.Sprintf("allocation %s: %v", e.id, allocdir.ErrGone)
}

func (e *goneError) Is(target error) bool {
	return target == allocdir.ErrGone || target == allocdir.ErrUnknownAlloc
}

// Get returns a copy of the record of id.
func (s *Store) Get(id string) (*State, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	return st.Clone(), nil
}

// view returns the committed record of id without copying it. It is for
// the mount's request handlers, which run on every lookup and getattr:
// committed records are never modified (every change commits a new
// record), so the result may be read freely and must never be written.
func (s *Store) view(id string) (*State, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lookup(id)
}

// ids returns the IDs of every allocation, sorted.
func (s *Store) ids() []string {
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
func (s *Store) List() []*State {
	s.mu.RLock()
	out := make([]*State, 0, len(s.allocs))
	for _, st := range s.allocs {
		out = append(out, st.Clone())
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Update applies fn to a copy of the record of id and, if fn returns nil
// and the result is valid, writes it and makes it the current record. If
// fn fails, or the write does (a full disk), nothing changes, on disk or
// in memory. Every layer the result references must exist under layers/.
//
// fn runs while other changes wait, so it must be quick and must not call
// Create, EnsureTask, Update or Destroy (Get and List are fine).
func (s *Store) Update(id string, fn func(*State) error) (*State, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	edit, err := s.Get(id)
	if err != nil {
		return nil, err
	}
	if err := fn(edit); err != nil {
		return nil, fmt.Errorf("failed to update allocation %s: %w", id, err)
	}
	// fn may have kept a reference to edit: record a copy of its own.
	st := edit.Clone()
	if st.ID != id {
		return nil, fmt.Errorf("failed to update allocation %s: the ID cannot change (got %q)", id, st.ID)
	}
	st.normalize()
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("failed to update allocation %s: %w", id, err)
	}
	for _, l := range sortedKeys(st.layerIDs()) {
		s.mu.RLock()
		_, dying := s.dying[l]
		s.mu.RUnlock()
		if dying {
			return nil, fmt.Errorf("failed to update allocation %s: layer %s is being removed", id, l)
		}
		if err := s.checkLayer(l); err != nil {
			return nil, fmt.Errorf("failed to update allocation %s: layer %s: %w", id, l, err)
		}
	}
	// The record journaled is not handed out again: return a copy.
	out := st.Clone()
	if err := s.commit("update", st); err != nil {
		return nil, fmt.Errorf("failed to update allocation %s: %w", id, err)
	}
	return out, nil
}

// Destroy removes an allocation and every layer it references that no
// other allocation does. Its record goes in one journaled intent; from
// then on the layers only it named are orphans, which Destroy removes at
// once. Every removal is attempted and all failures are returned
// together; a layer that could not be removed, or that a crash stopped
// Destroy from removing, is removed by the next sweep of the collector.
func (s *Store) Destroy(id string) error {
	s.writeMu.Lock()
	s.mu.RLock()
	st, err := s.lookup(id)
	pins := s.pins[id]
	s.mu.RUnlock()
	if err != nil {
		s.writeMu.Unlock()
		return err
	}
	if pins > 0 {
		s.writeMu.Unlock()
		return fmt.Errorf("failed to destroy allocation %s (%d readers): %w", id, pins, ErrPinned)
	}
	if err := s.change(&intent{Op: "destroy", Records: map[string]*State{id: nil}}); err != nil {
		s.writeMu.Unlock()
		return fmt.Errorf("failed to destroy allocation %s: %w", id, err)
	}
	s.mu.Lock()
	owned := s.claimLocked(sortedKeys(st.allLayerIDs()))
	s.mu.Unlock()
	// Others may change the store while the trees are deleted: the layers
	// are no longer referenced and dying keeps them from being reused.
	s.writeMu.Unlock()

	removed, err := s.removeClaimed(owned, "alloc_id", id)
	s.logger.Info("destroyed allocation", "alloc_id", id, "layers_removed", removed)
	if err != nil {
		return fmt.Errorf("allocation %s destroyed; its layers are left for the collector: %w", id, err)
	}
	return nil
}

// claimLocked marks as dying the layers that nothing references, so that
// nothing can stack on them while they are removed, and returns them. The
// caller holds mu.
func (s *Store) claimLocked(layers []string) []string {
	var owned []string
	for _, l := range layers {
		if s.dying[l] || s.referencedLocked(l) {
			continue
		}
		if _, ok := s.making[l]; ok {
			continue
		}
		s.dying[l] = true
		owned = append(owned, l)
	}
	return owned
}

// removeClaimed removes layers claimLocked returned, and logs each with
// the key/value pairs in kv. A layer that cannot be removed is released
// as failed: an orphan still out of reach, which the next sweep tries
// again.
func (s *Store) removeClaimed(owned []string, kv ...any) (int, error) {
	var errs []error
	n := 0
	for _, l := range owned {
		err := s.disk.removeAll(s.LayerPath(l))
		s.mu.Lock()
		if err != nil {
			s.dying[l] = false
		} else {
			delete(s.dying, l)
		}
		s.mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("failed to remove layer %s: %w", l, err))
			s.logger.Warn("failed to remove layer; the collector will try again", append([]any{"layer", l, "error", err}, kv...)...)
			continue
		}
		s.logger.Debug("removed layer", append([]any{"layer", l}, kv...)...)
		n++
	}
	return n, errors.Join(errs...)
}

// referencedLocked reports whether any allocation stacks or retains layer
// l. The caller holds mu.
func (s *Store) referencedLocked(l string) bool {
	for _, st := range s.allocs {
		if slices.Contains(st.Retained, l) {
			return true
		}
		for _, v := range st.Volumes {
			if v == nil {
				continue
			}
			if v.Upper == l || slices.Contains(v.Lowers, l) {
				return true
			}
		}
	}
	return false
}

// referencedAll returns every layer some allocation stacks or retains.
// The caller holds writeMu (or is opening the store).
func (s *Store) referencedAll() map[string]struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[string]struct{})
	for _, st := range s.allocs {
		for l := range st.allLayerIDs() {
			out[l] = struct{}{}
		}
	}
	return out
}

// orphansLocked lists the layers in layers/ that no allocation references,
// no change is making and nothing is removing. Changes hold writeMu from
// the moment they create a layer until the intent naming it is applied,
// so the caller holds writeMu (or is opening the store) for the answer to
// hold.
func (s *Store) orphansLocked() ([]string, error) {
	entries, err := os.ReadDir(s.layersDir())
	if err != nil {
		return nil, fmt.Errorf("failed to list layers dir: %w", err)
	}
	used := s.referencedAll()
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for _, e := range entries {
		l := e.Name()
		if _, ok := used[l]; ok {
			continue
		}
		if s.dying[l] {
			continue
		}
		if _, ok := s.making[l]; ok {
			continue
		}
		out = append(out, l)
	}
	return out, nil
}

// Sweep removes the orphan layers: those no allocation references, left
// by a crash, a failed removal or a flatten whose allocations are gone.
// Each removal is logged; a failure does not stop the sweep, and the
// layer stays an orphan for the next one. It returns how many it removed.
func (s *Store) Sweep() (int, error) {
	s.writeMu.Lock()
	orphans, err := s.orphansLocked()
	if err != nil {
		s.writeMu.Unlock()
		return 0, err
	}
	s.mu.Lock()
	owned := s.claimLocked(orphans)
	s.mu.Unlock()
	s.writeMu.Unlock()
	var n int
	for _, l := range owned {
		start := time.Now()
		if _, err := s.removeClaimed([]string{l}); err != nil {
			continue
		}
		n++
		s.logger.Info("removed orphan layer", "layer", l, "duration", time.Since(start))
	}
	if n < len(owned) {
		return n, fmt.Errorf("%d of %d orphan layers could not be removed; the next sweep tries again", len(owned)-n, len(owned))
	}
	return n, nil
}

// OnChange registers fn to be called with the ID of every allocation
// created, changed or destroyed, and returns a func that removes it. fn
// runs synchronously on the goroutine that made the change, once the
// change is on disk, so that when Create, Destroy or Remap returns, fn's
// effect (the mount forgetting what the kernel cached) has happened. fn
// must be quick and must not change the store. Changes never come from a
// FUSE request handler, so fn may send kernel notifications.
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
