package store

import (
	"fmt"
	"os"
	"slices"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// upgradeRecords gives each record of an earlier version the volumes
// every allocation has now (record.AllocVolumes: its own directory and
// alloc/, which used to be synthesised and could hold nothing but the
// layout). What the record kept of those directories moves onto the new
// layers' roots: the mode, owner and times set through the mount
// (State.Dirs), and a removed alloc/ (State.Gone) stays removed, now as a
// missing volume. Each record changes in one journaled intent, as any
// other change does; a crash half-way leaves the rest for the next open.
func (s *Store) upgradeRecords() error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	for _, id := range s.IDs() {
		st, err := s.Get(id)
		if err != nil {
			continue
		}
		if st.Volumes[record.RootVolume] != nil {
			// Of this version: its own directory's volume never goes
			// while it lives, and a missing alloc/ was removed.
			continue
		}
		goneShared := st.IsGone(record.DirShared)
		var specs []record.VolumeSpec
		attrs := make(map[string]*record.DirAttr)
		for _, spec := range record.AllocVolumes() {
			if spec.Key != record.RootVolume && spec.Key != record.SharedVolume {
				// alloc/data, logs/ or tmp/ missing were removed
				// through the mount: they stay removed.
				continue
			}
			if st.Volumes[spec.Key] != nil || spec.Key == record.SharedVolume && goneShared {
				continue
			}
			dir := record.DirRoot
			if spec.Key == record.SharedVolume {
				dir = record.DirShared
			}
			if a := st.Dirs[dir]; a != nil {
				spec.Mode = fileMode(a.Mode)
				spec.Agent = false
				if os.Geteuid() == 0 {
					spec.Owner = &allocdir.Owner{UID: int(a.UID), GID: int(a.GID)}
				}
				attrs[spec.Key] = a
			}
			specs = append(specs, spec)
		}
		st.Dirs = nil
		if goneShared {
			st.Gone = slices.DeleteFunc(st.Gone, func(d string) bool { return d == record.DirShared })
		}
		if err := s.commitWithLayers("update", st, specs); err != nil {
			return fmt.Errorf("failed to give allocation %q the volumes of its own directories: %w", id, err)
		}
		for key, a := range attrs {
			ts := []unix.Timespec{unix.NsecToTimespec(a.Atime.UnixNano()), unix.NsecToTimespec(a.Mtime.UnixNano())}
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, s.LayerPath(st.Volumes[key].Upper), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				s.logger.Warn("could not keep a directory's times", "alloc_id", id, "volume", key, "error", err)
			}
		}
		s.logger.Info("gave an allocation of an earlier version the volumes of its own directories", "alloc_id", id, "volumes", len(specs))
	}
	return nil
}
