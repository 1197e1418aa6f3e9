package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/migrate"
)

// create makes the allocation a request asks for and, when it names a
// previous allocation, decides what happens to that one's data and logs
// the decision in one line: remapped, sealed, or skipped and why.
func (s *Server) create(ctx context.Context, req CreateAllocRequest, progress func(migrate.Progress)) (*store.State, error) {
	policy, err := migrate.ParsePolicy(req.Migrate)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	mode, err := migrate.ParseMode(req.Mode)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	if req.Previous == "" {
		if policy != migrate.PolicyNone {
			return nil, fmt.Errorf("%w: migrate %q needs a previous allocation", ErrBadRequest, policy)
		}
		return s.store.Create(req.ID, req.Tasks)
	}
	if req.From != "" {
		if !policy.Remote() {
			return nil, fmt.Errorf("%w: fetching from %s needs migrate, not %q", ErrBadRequest, req.From, policy)
		}
		return s.createRemote(ctx, req, progress)
	}
	if !policy.Local() {
		st, err := s.store.Create(req.ID, req.Tasks)
		if err == nil {
			s.logger.Info("migration skipped", "previous_alloc_id", req.Previous, "alloc_id", req.ID, "reason", "policy none: the replacement starts empty")
		}
		return st, err
	}
	start := time.Now()
	st, volumes, err := s.store.CreateMigrated(req.ID, req.Tasks, req.Previous, mode == migrate.ModeSnapshot)
	if err != nil {
		s.logger.Warn("migration refused", "previous_alloc_id", req.Previous, "alloc_id", req.ID, "mode", mode, "error", err)
		return nil, err
	}
	elapsed := time.Since(start)
	// The handover is O(1); what it handed over is counted afterwards, so
	// that the request does not wait for a walk of the data.
	s.background.Add(1)
	go func() {
		defer s.background.Done()
		s.logMigration(st, req.Previous, mode, volumes, elapsed)
	}()
	return st, nil
}

// logMigration writes the one line that records a local migration, with
// what the handed-over layers hold.
func (s *Server) logMigration(st *store.State, prev string, mode migrate.Mode, volumes int, elapsed time.Duration) {
	var bytes, files int64
	for key, v := range st.Volumes {
		if key == "alloc/logs" || key == "alloc/tmp" {
			continue
		}
		for _, l := range append([]string{v.Upper}, v.Lowers...) {
			u, err := layerUsage(s.store.LayerPath(l))
			if err != nil {
				s.logger.Warn("cannot measure a migrated layer", "layer", l, "error", err)
			}
			bytes += u.Bytes
			files += u.Files
		}
	}
	decision := "remapped"
	if mode == migrate.ModeSnapshot {
		decision = "sealed"
	}
	s.logger.Info("migration "+decision, "previous_alloc_id", prev, "alloc_id", st.ID, "mode", mode,
		"volumes", volumes, "bytes", bytes, "files", files, "bytes_copied", 0, "duration", elapsed)
}

func (s *Server) stopAlloc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.store.Stop(id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, st)
}

// gcAlloc collects one terminal allocation; a running one is refused.
func (s *Server) gcAlloc(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.collector.CollectAlloc(id, "requested"); err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, GCResponse{Collected: []string{id}})
}

// gcAll collects every terminal allocation, oldest stopped first.
func (s *Server) gcAll(w http.ResponseWriter, r *http.Request) {
	collected, err := s.collector.CollectAll("node gc requested")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeJSON(w, http.StatusOK, GCResponse{Collected: collected})
}

// createRemote fetches the previous allocation's snapshot from another
// node into staging, checked and complete, then creates the new
// allocation on it; on any failure nothing is left in staging or in the
// store.
func (s *Server) createRemote(ctx context.Context, req CreateAllocRequest, progress func(migrate.Progress)) (*store.State, error) {
	if _, err := s.store.Get(req.ID); err == nil {
		return nil, fmt.Errorf("failed to create allocation %s: %w", req.ID, store.ErrExists)
	}
	names := make([]string, 0, len(req.Tasks))
	for _, t := range req.Tasks {
		names = append(names, t.Name)
	}
	keys, err := allocdir.MigratedDirs(names)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRequest, err)
	}
	fetched, err := migrate.Fetch(ctx, migrate.FetchOptions{
		URL:        req.From,
		AllocID:    req.Previous,
		Token:      req.Token,
		StagingDir: s.store.StagingDir(),
		TLS:        s.fetchTLS.Load(),
		Limits:     snapshot.ExtractOptions{Chown: os.Geteuid() == 0},
		Logger:     s.logger,
		Progress:   progress,
	})
	if err != nil {
		s.logger.Warn("remote migration failed; nothing was created", "previous_alloc_id", req.Previous, "alloc_id", req.ID, "from", req.From, "error", err)
		return nil, fmt.Errorf("failed to fetch %s from %s: %w", req.Previous, req.From, err)
	}
	defer allocdir.RemoveAll(fetched.Dir)
	dirs := make(map[string]string)
	for _, key := range keys {
		if fi, err := os.Lstat(filepath.Join(fetched.Dir, key)); err == nil && fi.IsDir() {
			dirs[key] = filepath.Join(fetched.Dir, key)
		}
	}
	st, err := s.store.CreateImported(req.ID, req.Tasks, req.Previous, dirs)
	if err != nil {
		return nil, err
	}
	s.logger.Info("migration fetched", "previous_alloc_id", req.Previous, "alloc_id", st.ID, "from", req.From,
		"volumes", len(dirs), "bytes", fetched.Bytes, "entries", fetched.Entries, "attempts", fetched.Attempts,
		"verified", fetched.Verified, "duration", fetched.Duration)
	return st, nil
}

// createStreaming answers a create with ?progress=1: 200, then one JSON
// line per progress report of a remote fetch, then the outcome.
func (s *Server) createStreaming(w http.ResponseWriter, r *http.Request, req CreateAllocRequest) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	var mu sync.Mutex
	send := func(line createLine) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(line)
		rc.Flush()
	}
	progress := func(p migrate.Progress) {
		ev := &ProgressEvent{Attempt: p.Attempt, Bytes: p.Bytes, Total: p.Total, Rate: p.Rate, ElapsedMS: p.Elapsed.Milliseconds(), Done: p.Done}
		if p.Err != nil {
			ev.Err = p.Err.Error()
		}
		send(createLine{Progress: ev})
	}
	st, err := s.create(r.Context(), req, progress)
	if err != nil {
		code := statusCode(err)
		if code == http.StatusInternalServerError {
			s.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "error", err)
		}
		send(createLine{Error: err.Error(), Status: code})
		return
	}
	send(createLine{State: st})
}
