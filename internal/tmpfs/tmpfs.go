package tmpfs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Options are an instance's caps and root.
type Options struct {
	// Bytes is the byte cap (size=), more than 0.
	Bytes int64
	// Inodes is the entry cap (nr_inodes=), more than 0.
	Inodes int64
	// Mode is the root's permission bits (mode=); UID and GID its owner.
	Mode     uint32
	UID, GID int
}

// FS is one detached tmpfs.
type FS struct {
	fd     int
	noswap bool
}

// New makes a detached tmpfs with opts. A kernel without the new mount
// API, or without tmpfs, is an error that says so; one without noswap
// gives an instance whose pages may be swapped, which NoSwap reports.
func New(opts Options) (*FS, error) {
	if opts.Bytes <= 0 || opts.Inodes <= 0 {
		return nil, fmt.Errorf("tmpfs: a byte cap and an entry cap are needed (got %d bytes, %d entries)", opts.Bytes, opts.Inodes)
	}
	if opts.Mode&^0o7777 != 0 {
		return nil, fmt.Errorf("tmpfs: mode %o is not a permission mode", opts.Mode)
	}
	if opts.UID < 0 || opts.GID < 0 {
		return nil, fmt.Errorf("tmpfs: owner %d:%d is not an owner", opts.UID, opts.GID)
	}
	fd, err := create(opts, true)
	noswap := true
	if errors.Is(err, errNoSwap) {
		fd, err = create(opts, false)
		noswap = false
	}
	if err != nil {
		return nil, err
	}
	return &FS{fd: fd, noswap: noswap}, nil
}

var errNoSwap = errors.New("the kernel refuses tmpfs's noswap")

func create(opts Options, noswap bool) (int, error) {
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("tmpfs: fsopen (the new mount API, Linux 5.2): %w", err)
	}
	defer unix.Close(fsfd)
	for _, kv := range [][2]string{
		{"size", strconv.FormatInt(opts.Bytes, 10)},
		{"nr_inodes", strconv.FormatInt(opts.Inodes, 10)},
		{"mode", strconv.FormatUint(uint64(opts.Mode), 8)},
		{"uid", strconv.Itoa(opts.UID)},
		{"gid", strconv.Itoa(opts.GID)},
	} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("tmpfs: %s=%s: %w%s", kv[0], kv[1], err, messages(fsfd))
		}
	}
	if noswap {
		if err := unix.FsconfigSetFlag(fsfd, "noswap"); err != nil {
			return -1, fmt.Errorf("%w: %v%s", errNoSwap, err, messages(fsfd))
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("tmpfs: create: %w%s", err, messages(fsfd))
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return -1, fmt.Errorf("tmpfs: fsmount: %w%s", err, messages(fsfd))
	}
	defer unix.Close(mfd)
	// fsmount's descriptor is an O_PATH one, which open_by_handle_at
	// (a takeover's way back to a node) refuses: the root opened through
	// it keeps the mount as well.
	fd, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("tmpfs: open the root: %w", err)
	}
	return fd, nil
}

// messages reads what the kernel logged on the filesystem context, as
// ": <message>; <message>", or "" for nothing.
func messages(fsfd int) string {
	var out []string
	buf := make([]byte, 256)
	for range 16 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		msg := strings.TrimSpace(string(buf[:n]))
		// Each message is "e ...", "w ..." or "i ...".
		if len(msg) > 2 && msg[1] == ' ' {
			msg = msg[2:]
		}
		out = append(out, msg)
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

// Adopt takes fd, a descriptor handed over by another process, as a
// detached tmpfs's root, made with noswap or not as its maker recorded
// (no mount table shows a detached mount's options); it fails, leaving
// fd open, unless fd is the root directory of a tmpfs.
func Adopt(fd int, noswap bool) (*FS, error) {
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return nil, fmt.Errorf("tmpfs: descriptor %d: %w", fd, err)
	}
	if sfs.Type != unix.TMPFS_MAGIC {
		return nil, fmt.Errorf("tmpfs: descriptor %d is on a filesystem of type %#x, not tmpfs", fd, sfs.Type)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("tmpfs: descriptor %d: %w", fd, err)
	}
	// A directory whose ".." is itself is the root of its mount.
	var parent unix.Stat_t
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || unix.Fstatat(fd, "..", &parent, unix.AT_SYMLINK_NOFOLLOW) != nil || parent.Ino != st.Ino || parent.Dev != st.Dev {
		return nil, fmt.Errorf("tmpfs: descriptor %d is not the root of a tmpfs", fd)
	}
	return &FS{fd: fd, noswap: noswap}, nil
}

// Fd is the descriptor of the root; it stays FS's.
func (f *FS) Fd() int { return f.fd }

// Path is a path that leads to the root in this process.
func (f *FS) Path() string { return fmt.Sprintf("/proc/self/fd/%d", f.fd) }

// NoSwap says whether the instance was made with noswap.
func (f *FS) NoSwap() bool { return f.noswap }

// Close closes the descriptor: the instance ends once no other
// descriptor of it, or of a file in it, is open.
func (f *FS) Close() error {
	if f.fd < 0 {
		return nil
	}
	err := unix.Close(f.fd)
	f.fd = -1
	return err
}
