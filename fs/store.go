package fs

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
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
// All methods are safe for concurrent use. Changes (Create, EnsureTask,
// Update, Destroy) are serialized among themselves and do their disk work
// without blocking readers: Get and List only wait for the short moment in
// which an in-memory record is swapped, never for an fsync or a removal.
type Store struct {
	logger  hclog.Logger
	dataDir string
	// owner owns fresh layer roots: "nobody" when the daemon runs as root,
	// so that tasks running as nobody can write; nil leaves ownership alone.
	owner *allocdir.Owner

	// writeMu serializes changes, so that each one sees the state left by
	// the previous one while it works on disk with mu released.
	writeMu sync.Mutex

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
	// dying holds the layers Destroy is removing (or failed to remove), so
	// that no Update can stack on a tree that is half deleted.
	dying map[string]struct{}
	// retired holds layers a flatten replaced, which live views may still
	// read; a later Flatten removes them (flatten.go).
	retired []retiredLayers

	hookMu  sync.Mutex
	hooks   map[int]func(id string)
	hookSeq int

	// events wakes followers of the store's files; see watch.go.
	events storeEvents

	// fault, when set (by tests), is called before the store's disk steps
	// ("mkdir" and "remove" of a layer, "write" of a state file) with the
	// path concerned; an error makes that step fail as the disk would.
	fault func(op, path string) error
}

// OpenStore opens the store in dataDir, creating its directories if they
// are missing. It empties staging/ (a half-received snapshot is never
// resumed), removes temporary state files left by a crash, and loads every
// allocation. It refuses to start on a state file it cannot read, or one
// that references a missing layer: starting without it would silently lose
// an allocation, so the error says which file to move away instead.
func OpenStore(logger hclog.Logger, dataDir string) (*Store, error) {
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
		allocs:    make(map[string]*State),
		destroyed: make(map[string]struct{}),
		pins:      make(map[string]int),
		dying:     make(map[string]struct{}),
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
	if err := s.loadRetired(); err != nil {
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
		if err := allocdir.RemoveAll(p); err != nil {
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
		case strings.HasSuffix(e.Name(), ".tmp"):
			if err := os.Remove(p); err != nil {
				return fmt.Errorf("failed to remove temporary state file %q: %w", p, err)
			}
			s.logger.Debug("removed temporary state file", "path", p)
		case strings.HasSuffix(e.Name(), stateSuffix):
			st, err := readState(p)
			if err != nil {
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

// checkLayers checks that every layer an allocation references exists, and
// reports layers that none references. Those are left alone, for an
// operator to look at: they are the leftovers of a crash between creating
// a layer and recording it, or of a Destroy that did not finish, and the
// store cannot tell them from data a crash in the middle of a handover
// left unrecorded.
func (s *Store) checkLayers() error {
	used := make(map[string]struct{})
	ids := make([]string, 0, len(s.allocs))
	for id := range s.allocs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		st := s.allocs[id]
		layers := sortedKeys(st.layerIDs())
		for _, l := range layers {
			used[l] = struct{}{}
			if err := s.checkLayer(l); err != nil {
				return fmt.Errorf("allocation %s references layer %s, which is unusable: %w; "+
					"restore the layer, or move %q out of the data dir to start without that allocation",
					id, l, err, s.statePath(id))
			}
		}
	}
	entries, err := os.ReadDir(filepath.Join(s.dataDir, layersDirName))
	if err != nil {
		return fmt.Errorf("failed to list layers dir: %w", err)
	}
	for _, e := range entries {
		if _, ok := used[e.Name()]; !ok {
			s.logger.Warn("orphan layer", "layer", e.Name())
		}
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
	if err := validAllocID(id); err != nil {
		return nil, err
	}
	if err := validTasks(tasks); err != nil {
		return nil, fmt.Errorf("failed to create allocation %s: %w", id, err)
	}

	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.RLock()
	_, exists := s.allocs[id]
	s.mu.RUnlock()
	if exists {
		return nil, fmt.Errorf("failed to create allocation %s: %w", id, ErrExists)
	}

	st := &State{
		ID:      id,
		Tasks:   append([]allocdir.Task(nil), tasks...),
		Status:  StatusRunning,
		Created: time.Now().UTC().Round(0),
		Volumes: make(map[string]*Volume),
	}
	specs := allocVolumes()
	for _, t := range tasks {
		specs = append(specs, taskVolumes(t.Name)...)
	}
	if err := s.commitWithLayers(st, specs); err != nil {
		return nil, fmt.Errorf("failed to create allocation %s: %w", id, err)
	}
	s.mu.Lock()
	delete(s.destroyed, id)
	s.mu.Unlock()
	s.logger.Info("created allocation", "alloc_id", id, "tasks", len(tasks))
	return st.Clone(), nil
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
	if err := s.commitWithLayers(st, specs); err != nil {
		return nil, fmt.Errorf("failed to add task %q to allocation %s: %w", task.Name, id, err)
	}
	s.logger.Debug("ensured task", "alloc_id", id, "task", task.Name)
	return st.Clone(), nil
}

// commitWithLayers creates a fresh upper layer for each spec, records them
// in st, writes st and makes it the current record. On failure it removes
// the layers it created and leaves the store as it was. The caller holds
// writeMu.
func (s *Store) commitWithLayers(st *State, specs []volumeSpec) (err error) {
	var created []string
	defer func() {
		if err != nil {
			err = errors.Join(err, s.removeFresh(created))
		}
	}()
	for _, spec := range specs {
		l, err := s.newLayer(spec.mode)
		if err != nil {
			return fmt.Errorf("failed to create layer for %s: %w", spec.key, err)
		}
		created = append(created, l)
		st.Volumes[spec.key] = &Volume{Upper: l}
	}
	if len(created) > 0 {
		// The layers must be on disk before any record that names them,
		// or a crash could leave a state that OpenStore refuses.
		dir := filepath.Join(s.dataDir, layersDirName)
		if err := syncDir(dir); err != nil {
			return fmt.Errorf("failed to sync %q: %w", dir, err)
		}
	}
	return s.commit(st)
}

// commit writes st to its state file and, once that succeeded, makes it the
// in-memory record and calls the OnChange hooks. The caller holds writeMu and no
// longer touches st.
func (s *Store) commit(st *State) error {
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("failed to encode state: %w", err)
	}
	data = append(data, '\n')
	file := s.statePath(st.ID)
	var hook func() error
	if s.fault != nil {
		hook = func() error { return s.fault("write", file) }
	}
	if err := writeFileAtomic(file, data, hook); err != nil {
		return fmt.Errorf("failed to write state %q: %w", file, err)
	}
	// The rename is done and visible: failing here would leave memory
	// and disk disagreeing, so a failed directory sync is only logged.
	if err := syncDir(s.stateDir()); err != nil {
		s.logger.Warn("state written but not synced; a power loss may undo it", "alloc_id", st.ID, "error", err)
	}
	s.mu.Lock()
	s.allocs[st.ID] = st
	s.mu.Unlock()
	s.publish(st.ID)
	return nil
}

// newLayer creates an empty layer whose root has mode (forced, so the
// umask does not matter) and the store's owner.
func (s *Store) newLayer(mode os.FileMode) (string, error) {
	for range 8 {
		id, err := newLayerID()
		if err != nil {
			return "", err
		}
		s.mu.RLock()
		_, dying := s.dying[id]
		s.mu.RUnlock()
		if dying {
			continue
		}
		p := s.LayerPath(id)
		if s.fault != nil {
			if err := s.fault("mkdir", p); err != nil {
				return "", &os.PathError{Op: "mkdir", Path: p, Err: err}
			}
		}
		if err := os.Mkdir(p, 0o700); err != nil {
			if errors.Is(err, iofs.ErrExist) {
				continue
			}
			return "", err
		}
		if err := s.setupRoot(p, mode); err != nil {
			return "", errors.Join(err, os.Remove(p))
		}
		return id, nil
	}
	return "", errors.New("failed to find an unused layer ID")
}

// setupRoot gives a fresh layer root its owner, then its mode: chown
// after chmod could clear mode bits on some systems.
func (s *Store) setupRoot(p string, mode os.FileMode) error {
	if s.owner != nil {
		if err := os.Lchown(p, s.owner.UID, s.owner.GID); err != nil {
			return err
		}
	}
	return os.Chmod(p, mode)
}

// removeFresh removes layers created by a change that failed. They are
// new and referenced by nothing, so removing them cannot lose data.
func (s *Store) removeFresh(layers []string) error {
	var errs []error
	for _, l := range layers {
		if err := allocdir.RemoveAll(s.LayerPath(l)); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove new layer %s: %w", l, err))
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
	if err := s.commit(st); err != nil {
		return nil, fmt.Errorf("failed to update allocation %s: %w", id, err)
	}
	return st.Clone(), nil
}

// Destroy removes an allocation and every layer it references that no
// other allocation does. The steps are ordered so that a crash between any
// two leaves a store that opens: the record goes first (so nothing new
// finds it), then its state file, and only then the layers, which are
// orphans by that time. If the state file cannot be removed, the
// allocation is kept whole and the error returned. Once it is gone, every
// layer removal is attempted and all failures are returned together; a
// layer that could not be removed stays as an orphan for GC.
func (s *Store) Destroy(id string) error {
	s.writeMu.Lock()
	s.mu.Lock()
	st, err := s.lookup(id)
	if err != nil {
		s.mu.Unlock()
		s.writeMu.Unlock()
		return err
	}
	if n := s.pins[id]; n > 0 {
		s.mu.Unlock()
		s.writeMu.Unlock()
		return fmt.Errorf("failed to destroy allocation %s (%d readers): %w", id, n, ErrPinned)
	}
	delete(s.allocs, id)
	s.mu.Unlock()

	var errs []error
	file := s.statePath(id)
	if err := os.Remove(file); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		s.mu.Lock()
		s.allocs[id] = st
		s.mu.Unlock()
		s.writeMu.Unlock()
		return fmt.Errorf("failed to destroy allocation %s: %w", id, err)
	}
	if err := syncDir(s.stateDir()); err != nil {
		errs = append(errs, fmt.Errorf("failed to sync state dir: %w", err))
	}

	s.mu.Lock()
	s.destroyed[id] = struct{}{}
	var owned []string
	for _, l := range sortedKeys(st.layerIDs()) {
		if _, ok := s.dying[l]; ok || s.referencedLocked(l) {
			continue
		}
		s.dying[l] = struct{}{}
		owned = append(owned, l)
	}
	s.mu.Unlock()
	// Others may change the store while the trees are deleted: the layers
	// are no longer referenced and dying keeps them from being reused.
	s.writeMu.Unlock()
	s.publish(id)

	for _, l := range owned {
		if err := s.removeLayer(l); err != nil {
			errs = append(errs, fmt.Errorf("failed to remove layer %s of allocation %s: %w", l, id, err))
			s.logger.Warn("failed to remove layer; left for GC", "alloc_id", id, "layer", l, "error", err)
			continue
		}
		s.mu.Lock()
		delete(s.dying, l)
		s.mu.Unlock()
	}
	s.logger.Info("destroyed allocation", "alloc_id", id, "layers_removed", len(owned))
	if len(errs) > 0 {
		return fmt.Errorf("allocation %s destroyed with errors: %w", id, errors.Join(errs...))
	}
	return nil
}

// removeLayer deletes a layer's tree.
func (s *Store) removeLayer(l string) error {
	p := s.LayerPath(l)
	if s.fault != nil {
		if err := s.fault("remove", p); err != nil {
			return &os.PathError{Op: "remove", Path: p, Err: err}
		}
	}
	return allocdir.RemoveAll(p)
}

// referencedLocked reports whether any allocation references layer l. The
// caller holds mu.
func (s *Store) referencedLocked(l string) bool {
	for _, st := range s.allocs {
		for _, v := range st.Volumes {
			if v == nil {
				continue
			}
			if v.Upper == l {
				return true
			}
			for _, low := range v.Lowers {
				if low == l {
					return true
				}
			}
		}
	}
	return false
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
