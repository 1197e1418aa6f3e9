package node

import (
	"errors"
	iofs "io/fs"
	"net"
	"path/filepath"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/api"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"github.com/allocfs/allocfs/migrate"
)

// wireAlloc is the control API's view of a record.
func wireAlloc(st *record.State) *api.Alloc {
	a := &api.Alloc{
		ID:         st.ID,
		Tasks:      make([]api.Task, 0, len(st.Tasks)),
		Status:     string(st.Status),
		Created:    st.Created,
		Volumes:    make(map[string]api.Volume, len(st.Volumes)),
		Previous:   st.Previous,
		MigratedTo: st.MigratedTo,
		Origin:     st.Origin,
	}
	for _, t := range st.Tasks {
		a.Tasks = append(a.Tasks, api.Task{Name: t.Name, SecretsMB: t.SecretsMB, User: t.User})
	}
	if !st.Stopped.IsZero() {
		stopped := st.Stopped
		a.Stopped = &stopped
	}
	for key, v := range st.Volumes {
		if v == nil {
			continue
		}
		a.Volumes[key] = api.Volume{Upper: v.Upper, Lowers: append([]string(nil), v.Lowers...), ReadOnly: v.ReadOnly}
	}
	return a
}

// classify marks err with the api kind its cause stands for, so that
// callers of the service, over HTTP or not, tell failures apart with
// errors.Is on the api sentinels.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrExists), errors.Is(err, store.ErrNotTerminal), errors.Is(err, store.ErrPinned),
		errors.Is(err, store.ErrOwnedByMount):
		return api.Kind(api.ErrConflict, err)
	case errors.Is(err, migrate.ErrPermissionDenied):
		return api.Kind(api.ErrForbidden, err)
	case errors.Is(err, allocdir.ErrArchive), errors.Is(err, migrate.ErrIntegrity),
		errors.Is(err, migrate.ErrDeadline), errors.Is(err, migrate.ErrTooSlow), upstream(err):
		return api.Kind(api.ErrUpstream, err)
	case errors.Is(err, store.ErrNoTasks), errors.Is(err, store.ErrNoQuota), errors.Is(err, record.ErrBadLimit):
		return api.Kind(api.ErrBadRequest, err)
	case errors.Is(err, store.ErrTooBig):
		return api.Kind(api.ErrConflict, err)
	}
	return err
}

// upstream reports whether err is the other node's failure to answer: a
// status that stands for no sentinel (a 5xx after the retries), or no
// connection at all.
func upstream(err error) bool {
	var se *migrate.StatusError
	if errors.As(err, &se) && se.Unwrap() == nil {
		return true
	}
	var oe *net.OpError
	return errors.As(err, &oe)
}

// layerUsage walks a layer directory on the backing store without
// following symbolic links and counts its non-directory entries and the
// bytes of its regular files. Entries removed while it walks (a task
// deleting files) are skipped, not errors.
func layerUsage(dir string) (api.LayerUsage, error) {
	var u api.LayerUsage
	err := filepath.WalkDir(dir, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) && p != dir {
				return nil
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		u.Files++
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info() // lstat
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) {
				u.Files--
				return nil
			}
			return err
		}
		u.Bytes += fi.Size()
		return nil
	})
	return u, err
}

// maxDiskMB bounds a requested limit: 1 EiB, far past any disk, and
// far from overflowing a byte count.
const maxDiskMB = 1 << 40

// limitOf is the disk limit a request asks for.
func limitOf(req api.CreateAllocRequest) record.Limit {
	return record.Limit{Bytes: req.DiskMB << 20, Inodes: req.DiskInodes}
}

// quotaStatus says what the store's data dir enforces.
func quotaStatus(s *store.Store) api.QuotaStatus {
	r := s.Quota()
	return api.QuotaStatus{
		Enforced:   r.Enforced(),
		Mechanism:  r.Mechanism,
		Filesystem: r.Filesystem,
		Why:        r.Why,
		DefaultMB:  s.DefaultLimit().Bytes >> 20,
	}
}
