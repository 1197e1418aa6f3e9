package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os/user"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/gc"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/migrate"
	"github.com/hashicorp/go-hclog"
)

// Config is what a Service is made of.
type Config struct {
	Logger hclog.Logger
	// Store holds the allocations; the service is its only writer.
	Store *store.Store
	// GC is the collector's triggers; GC.Interval 0 turns the timer off
	// (explicit collections still run).
	GC gc.Config
	// MountDir is where the mount shows allocations: <MountDir>/<id>.
	MountDir string
	// Passthrough reports whether the mount serves file data by
	// passthrough now; nil: it does not.
	Passthrough func() bool
	// AllocFS returns the read side of allocation id, read from the
	// store and never through the mount (fs.NewAllocDir).
	AllocFS func(id string) allocdir.FS
	// Health runs the node's health checks; nil: healthy when it
	// answers.
	Health func() []api.HealthCheck
	// Fetches hears how each fetch of a remote migration went (the
	// node's metrics); nil: nobody.
	Fetches migrate.FetchObserver
}

// Service is the node's lifecycle. All methods are safe for concurrent
// use.
type Service struct {
	logger    hclog.Logger
	store     *store.Store
	collector *gc.Collector
	cfg       Config
	// background is work a request started and did not wait for (the
	// migration log line); Wait waits for it.
	background sync.WaitGroup
	// fetchTLS is the TLS of remote migrations' fetches; see SetFetchTLS.
	fetchTLS atomic.Pointer[tls.Config]
}

var _ api.Node = (*Service)(nil)

// New returns the service of cfg.Store.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Passthrough == nil {
		cfg.Passthrough = func() bool { return false }
	}
	logger := cfg.Logger.Named("node")
	return &Service{
		logger:    logger,
		store:     cfg.Store,
		collector: gc.NewCollector(logger, cfg.Store, cfg.GC),
		cfg:       cfg,
	}
}

// SetFetchTLS sets the TLS configuration of the fetches of remote
// migrations: the roots that authenticate other nodes and this node's
// client certificate. A fetch takes the one set when it starts: a reload
// may set another at any time.
func (s *Service) SetFetchTLS(cfg *tls.Config) { s.fetchTLS.Store(cfg) }

// Run collects on the collector's timer until ctx is done; with no
// interval it returns at once.
func (s *Service) Run(ctx context.Context) {
	if s.cfg.GC.Interval > 0 {
		s.collector.Run(ctx)
	}
}

// Wait waits for work that requests left running in the background.
func (s *Service) Wait() { s.background.Wait() }

// Create makes the allocation req describes; see the package doc for
// what a previous allocation's data becomes.
func (s *Service) Create(ctx context.Context, req api.CreateAllocRequest, progress func(api.ProgressEvent)) (*api.Alloc, error) {
	tasks := make([]allocdir.Task, 0, len(req.Tasks))
	for _, t := range req.Tasks {
		tasks = append(tasks, allocdir.Task{Name: t.Name, SecretsMB: t.SecretsMB, User: t.User})
	}
	if err := checkTaskUsers(tasks); err != nil {
		return nil, err
	}
	st, err := s.create(ctx, req, tasks, progress)
	if err != nil {
		return nil, classify(err)
	}
	return wireAlloc(st), nil
}

// List returns every allocation, sorted by ID.
func (s *Service) List(context.Context) ([]*api.Alloc, error) {
	states := s.store.List()
	out := make([]*api.Alloc, 0, len(states))
	for _, st := range states {
		out = append(out, wireAlloc(st))
	}
	return out, nil
}

// Status returns allocation id, where it is mounted and what the upper
// layer of each of its volumes holds, measured on the backing store.
func (s *Service) Status(_ context.Context, id string) (*api.AllocStatus, error) {
	st, err := s.store.Get(id)
	if err != nil {
		return nil, classify(err)
	}
	out := &api.AllocStatus{
		Alloc:       *wireAlloc(st),
		Mount:       filepath.Join(s.cfg.MountDir, st.ID),
		Layers:      make(map[string]api.LayerUsage, len(st.Volumes)),
		Passthrough: s.cfg.Passthrough(),
	}
	for key, v := range st.Volumes {
		if v == nil {
			continue
		}
		u, err := layerUsage(s.store.LayerPath(v.Upper))
		if err != nil {
			return nil, fmt.Errorf("failed to measure layer %s of %s/%s: %w", v.Upper, id, key, err)
		}
		u.Upper, u.Lowers = v.Upper, v.Lowers
		out.Layers[key] = u
	}
	du, ok, err := s.store.Usage(id)
	if err != nil {
		return nil, err
	}
	if ok {
		out.Disk = &api.DiskStatus{LimitBytes: du.Limit.Bytes, UsedBytes: du.Bytes, Mechanism: du.Mechanism,
			LimitInodes: du.Limit.Inodes, UsedInodes: du.Inodes}
	}
	return out, nil
}

// Stop makes allocation id terminal.
func (s *Service) Stop(_ context.Context, id string) (*api.Alloc, error) {
	if err := s.notNomads(id, "stop"); err != nil {
		return nil, err
	}
	st, err := s.store.Stop(id)
	if err != nil {
		return nil, classify(err)
	}
	return wireAlloc(st), nil
}

// Destroy removes allocation id now, running or not; a pinned one is
// refused.
func (s *Service) Destroy(_ context.Context, id string) error {
	if err := s.notNomads(id, "destroy"); err != nil {
		return err
	}
	return classify(s.store.Destroy(id))
}

// Collect collects allocation id through the node's collector.
func (s *Service) Collect(_ context.Context, id, reason string) error {
	if err := s.notNomads(id, "collect"); err != nil {
		return err
	}
	return classify(s.collector.CollectAlloc(id, reason))
}

// notNomads refuses to verb an allocation Nomad's client made through the
// mount: Nomad does not hear of it, and would find its directory gone
// while it still runs the allocation; it removes the directory itself
// when it collects the allocation.
func (s *Service) notNomads(id, verb string) error {
	st, err := s.store.Get(id)
	if err != nil {
		return classify(err)
	}
	if st.Origin == record.OriginMount {
		return classify(fmt.Errorf("cannot %s allocation %q: %w by Nomad's client, which removes it itself when it collects it", verb, id, store.ErrOwnedByMount))
	}
	return nil
}

// CollectAll collects every terminal, unpinned allocation through the
// node's collector.
func (s *Service) CollectAll(_ context.Context, reason string) ([]string, error) {
	collected, err := s.collector.CollectAll(reason)
	return collected, classify(err)
}

// NodeStatus returns the node as the store sees it.
func (s *Service) NodeStatus(context.Context) (*api.NodeStatus, error) {
	sf, err := s.store.Statfs()
	if err != nil {
		return nil, err
	}
	bsize := uint64(sf.Bsize)
	if sf.Frsize > 0 {
		// f_blocks, f_bfree and f_bavail count fragments.
		bsize = uint64(sf.Frsize)
	}
	return &api.NodeStatus{
		DataDir:     s.store.DataDir(),
		Mount:       s.cfg.MountDir,
		Passthrough: s.cfg.Passthrough(),
		Allocs:      s.store.Len(),
		Goroutines:  runtime.NumGoroutine(),
		Backing: api.BackingStatus{
			BytesTotal:     sf.Blocks * bsize,
			BytesFree:      sf.Bfree * bsize,
			BytesAvailable: sf.Bavail * bsize,
			FilesTotal:     sf.Files,
			FilesFree:      sf.Ffree,
			BlockSize:      sf.Bsize,
			NameMax:        sf.Namelen,
		},
		Quota: quotaStatus(s.store),
	}, nil
}

// Health runs the node's checks.
func (s *Service) Health(context.Context) []api.HealthCheck {
	if s.cfg.Health == nil {
		return nil
	}
	return s.cfg.Health()
}

// FS returns the read side of allocation id for the client API and for
// snapshots. Its Snapshot pins the allocation while it streams, so that
// the collector cannot take it from under a transfer to another node.
func (s *Service) FS(id string) (allocdir.FS, error) {
	if _, err := s.store.Get(id); err != nil {
		return nil, err
	}
	if s.cfg.AllocFS == nil {
		return nil, fmt.Errorf("allocation %q: this node serves no files", id)
	}
	return pinnedFS{FS: s.cfg.AllocFS(id), store: s.store, id: id}, nil
}

// pinnedFS keeps its allocation from being collected while its snapshot
// streams to another node.
type pinnedFS struct {
	allocdir.FS
	store *store.Store
	id    string
}

func (p pinnedFS) Snapshot(w io.Writer) error {
	unpin, err := p.store.Pin(p.id)
	if err != nil {
		return err
	}
	defer unpin()
	return p.FS.Snapshot(w)
}

// checkTaskUsers refuses a create whose task names a user this node does
// not have, before anything is created, with the message `allocfs exec
// --user` gives: accepted, it would only make the task's secrets silently
// the agent's alone. A lookup that fails for another reason is the
// node's trouble, not the request's.
func checkTaskUsers(tasks []allocdir.Task) error {
	for _, t := range tasks {
		if t.User == "" {
			continue
		}
		_, err := allocdir.LookupUser(t.User)
		var (
			unknownName user.UnknownUserError
			unknownID   user.UnknownUserIdError
		)
		switch {
		case err == nil:
		case errors.As(err, &unknownName), errors.As(err, &unknownID):
			return api.Kind(api.ErrBadRequest, fmt.Errorf("task %q: %w", t.Name, err))
		default:
			return fmt.Errorf("task %q: %w", t.Name, err)
		}
	}
	return nil
}
