package difftest

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Populate builds the starting tree under the directory open at root:
// directories with set-id and sticky bits, a hard-link group across
// directories, a FIFO, symlinks, a character device 0/0 (what overlayfs
// stores a whiteout as), user xattrs on files and directories, a sparse
// file, a set-id file and directories owned by uid:gid (so that an
// unprivileged run can act on them), and a tree deeper than generated
// paths reach. It must run as root.
func Populate(root int, uid, gid int) error {
	steps := []struct {
		what string
		do   func() error
	}{
		{"mkdir a", func() error { return unix.Mkdirat(root, "a", 0o777) }},
		{"chmod a", func() error { return unix.Fchmodat(root, "a", 0o777, 0) }},
		{"file a/a", func() error { return writeFile(root, "a/a", "alpha\n", 0o644) }},
		{"link a/b", func() error { return unix.Linkat(root, "a/a", root, "a/b", 0) }},
		{"mkdir a/c", func() error { return unix.Mkdirat(root, "a/c", 0o775) }},
		{"chown a/c", func() error { return unix.Fchownat(root, "a/c", uid, gid, 0) }},
		{"chmod a/c", func() error { return unix.Fchmodat(root, "a/c", 0o2775, 0) }},
		{"file a/c/a", func() error { return writeFile(root, "a/c/a", "set-id\n", 0o755) }},
		{"chown a/c/a", func() error { return unix.Fchownat(root, "a/c/a", uid, gid, 0) }},
		{"chmod a/c/a", func() error { return unix.Fchmodat(root, "a/c/a", 0o6755, 0) }},
		{"link a/c/b", func() error { return unix.Linkat(root, "a/a", root, "a/c/b", 0) }},
		{"mkdir b", func() error { return unix.Mkdirat(root, "b", 0o777) }},
		{"chmod b", func() error { return unix.Fchmodat(root, "b", 0o1777, 0) }},
		{"fifo b/a", func() error { return unix.Mknodat(root, "b/a", unix.S_IFIFO|0o666, 0) }},
		{"chmod b/a", func() error { return unix.Fchmodat(root, "b/a", 0o666, 0) }},
		{"symlink b/b", func() error { return unix.Symlinkat("../a/a", root, "b/b") }},
		{"sparse b/c", func() error { return sparseFile(root, "b/c") }},
		{"chown b/c", func() error { return unix.Fchownat(root, "b/c", uid, gid, 0) }},
		{"chardev b/d", func() error { return unix.Mknodat(root, "b/d", unix.S_IFCHR|0o644, 0) }},
		{"mkdir c", func() error { return unix.Mkdirat(root, "c", 0o755) }},
		{"chown c", func() error { return unix.Fchownat(root, "c", uid, gid, 0) }},
		{"file c/a", func() error { return writeFile(root, "c/a", "private\n", 0o600) }},
		{"chown c/a", func() error { return unix.Fchownat(root, "c/a", uid, gid, 0) }},
		{"file c/d", func() error { return writeFile(root, "c/d", "set-uid\n", 0o755) }},
		{"chown c/d", func() error { return unix.Fchownat(root, "c/d", uid, gid, 0) }},
		{"chmod c/d", func() error { return unix.Fchmodat(root, "c/d", 0o4755, 0) }},
		{"symlink c/b", func() error { return unix.Symlinkat("a", root, "c/b") }},
		{"deep c/c/...", func() error { return deepTree(root, "c/c", 6, uid, gid) }},
		{"xattr a", func() error { return setxattr(root, "a", "user.a", "dir") }},
		{"xattr a/a", func() error { return setxattr(root, "a/a", "user.b", "file") }},
		{"xattr c/a", func() error { return setxattr(root, "c/a", "user.a", "owned") }},
		{"xattr c/c", func() error { return setxattr(root, "c/c", "user.c", "deep") }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("failed to populate (%s): %w", s.what, err)
		}
	}
	return nil
}

func writeFile(root int, rel, content string, mode uint32) error {
	fd, err := unix.Openat(root, rel, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, mode)
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, []byte(content))
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Fchmodat(root, rel, mode, 0)
	}
	return err
}

// sparseFile writes a 256 KiB file with data at its start and middle and
// holes elsewhere.
func sparseFile(root int, rel string) error {
	fd, err := unix.Openat(root, rel, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 256<<10); err != nil {
		return err
	}
	for _, off := range []int64{0, 128 << 10} {
		if _, err := unix.Pwrite(fd, []byte("data in a sparse file\n"), off); err != nil {
			return err
		}
	}
	return nil
}

func deepTree(root int, rel string, depth, uid, gid int) error {
	for range depth {
		if err := unix.Mkdirat(root, rel, 0o755); err != nil {
			return err
		}
		if err := unix.Fchownat(root, rel, uid, gid, 0); err != nil {
			return err
		}
		rel += "/c"
	}
	return writeFile(root, rel[:len(rel)-1]+"a", "deep\n", 0o644)
}

func setxattr(root int, rel, name, value string) error {
	return unix.Setxattr(fmt.Sprintf("/proc/self/fd/%d/%s", root, rel), name, []byte(value), 0)
}
