package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/allocdir/snapshot"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/migrate"
)

// create makes the allocation a request asks for and, when it names a
// previous allocation, decides what happens to that one's data and logs
// the decision in one line: remapped, sealed, or skipped and why.
func (s *Service) create(ctx context.Context, req api.CreateAllocRequest, tasks []allocdir.Task, progress func(api.ProgressEvent)) (*record.State, error) {
	policy, err := migrate.ParsePolicy(req.Migrate)
	if err != nil {
		return nil, api.Kind(api.ErrBadRequest, err)
	}
	mode, err := migrate.ParseMode(req.Mode)
	if err != nil {
		return nil, api.Kind(api.ErrBadRequest, err)
	}
	if req.DiskMB < 0 || req.DiskMB > maxDiskMB {
		return nil, api.Kind(api.ErrBadRequest, fmt.Errorf("disk_mb %d: want 0 (the node's default) to %d", req.DiskMB, maxDiskMB))
	}
	if req.DiskInodes < 0 {
		return nil, api.Kind(api.ErrBadRequest, fmt.Errorf("disk_inodes %d: want 0 (none) or more", req.DiskInodes))
	}
	if (req.DiskMB > 0 || req.DiskInodes > 0) && !s.store.Quota().Enforced() {
		return nil, api.Kind(api.ErrBadRequest, fmt.Errorf("a disk limit: %w: %s", store.ErrNoQuota, s.store.Quota().Why))
	}
	lim := limitOf(req)
	if req.Previous == "" {
		if policy != migrate.PolicyNone {
			return nil, api.Kind(api.ErrBadRequest, fmt.Errorf("migrate %q needs a previous allocation", policy))
		}
		return s.store.Create(req.ID, tasks, store.CreateOptions{Limit: lim})
	}
	if req.From != "" {
		if !policy.Remote() {
			return nil, api.Kind(api.ErrBadRequest, fmt.Errorf("fetching from %s needs migrate, not %q", req.From, policy))
		}
		return s.createRemote(ctx, req, tasks, progress)
	}
	if !policy.Local() {
		st, err := s.store.Create(req.ID, tasks, store.CreateOptions{Limit: lim})
		if err == nil {
			s.logger.Info("migration skipped", "previous_alloc_id", req.Previous, "alloc_id", req.ID, "reason", "policy none: the replacement starts empty")
		}
		return st, err
	}
	kind := store.MigrationAdopt
	if mode == migrate.ModeSnapshot {
		kind = store.MigrationSnapshot
	}
	volumes := s.handedOver(req.Previous, tasks)
	start := time.Now()
	st, err := s.store.Create(req.ID, tasks, store.CreateOptions{Limit: lim, Previous: req.Previous, Migration: kind})
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

// handedOver counts the volumes a local migration from prevID hands to a
// new allocation of tasks, for the log line: the migrated volumes that
// prevID has, as the store counts them. The store's Create returns the
// record alone; prevID is read before the change, so that the count does
// not depend on a collector that may destroy it once it has handed its
// data over.
func (s *Service) handedOver(prevID string, tasks []allocdir.Task) int {
	prev, err := s.store.Get(prevID)
	if err != nil {
		return 0
	}
	names := make([]string, 0, len(tasks))
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	keys, err := allocdir.MigratedDirs(names)
	if err != nil {
		return 0
	}
	n := 0
	for _, key := range keys {
		if _, ok := prev.Volumes[key]; ok {
			n++
		}
	}
	return n
}

// logMigration writes the one line that records a local migration, with
// what the handed-over layers hold.
func (s *Service) logMigration(st *record.State, prev string, mode migrate.Mode, volumes int, elapsed time.Duration) {
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

// createRemote fetches the previous allocation's snapshot from another
// node into staging, checked and complete, then creates the new
// allocation on it; on any failure nothing is left in staging or in the
// store.
func (s *Service) createRemote(ctx context.Context, req api.CreateAllocRequest, tasks []allocdir.Task, progress func(api.ProgressEvent)) (*record.State, error) {
	if _, err := s.store.Get(req.ID); err == nil {
		return nil, fmt.Errorf("failed to create allocation %q: %w", req.ID, store.ErrExists)
	}
	names := make([]string, 0, len(tasks))
	for _, t := range tasks {
		names = append(names, t.Name)
	}
	keys, err := allocdir.MigratedDirs(names)
	if err != nil {
		return nil, api.Kind(api.ErrBadRequest, err)
	}
	var report func(migrate.Progress)
	if progress != nil {
		report = func(p migrate.Progress) {
			ev := api.ProgressEvent{Attempt: p.Attempt, Bytes: p.Bytes, Total: p.Total, Rate: p.Rate, ElapsedMS: p.Elapsed.Milliseconds(), Done: p.Done,
				RetryInMS: p.RetryIn.Milliseconds()}
			if p.Err != nil {
				ev.Err = p.Err.Error()
			}
			progress(ev)
		}
	}
	fetched, err := migrate.Fetch(ctx, migrate.FetchOptions{
		URL:        req.From,
		AllocID:    req.Previous,
		Token:      req.Token,
		StagingDir: s.store.StagingDir(),
		TLS:        s.fetchTLS.Load(),
		Limits:     snapshot.ExtractOptions{Chown: os.Geteuid() == 0},
		Logger:     s.logger,
		Progress:   report,
		Observer:   s.cfg.Fetches,
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
	st, err := s.store.Create(req.ID, tasks, store.CreateOptions{Limit: limitOf(req), Previous: req.Previous, Migration: store.MigrationRemote, Imported: dirs})
	if err != nil {
		return nil, err
	}
	s.logger.Info("migration fetched", "previous_alloc_id", req.Previous, "alloc_id", st.ID, "from", req.From,
		"volumes", len(dirs), "bytes", fetched.Bytes, "entries", fetched.Entries, "attempts", fetched.Attempts,
		"verified", fetched.Verified, "duration", fetched.Duration)
	return st, nil
}
