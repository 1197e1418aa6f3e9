package allocdir

import (
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path"
	"sort"
	"strconv"
	"sync"
)

// Owner is a numeric uid/gid pair.
type Owner struct {
	UID, GID int
}

var (
	nobodyOnce  sync.Once
	nobodyOwner *Owner
)

// Nobody returns the owner of the layout's shared directories: "nobody"
// when the agent runs as root (so that tasks running as nobody can write),
// nil (leave ownership alone) otherwise or when the system has no such
// user. It is looked up once per process.
func Nobody() *Owner {
	if os.Geteuid() != 0 {
		return nil
	}
	nobodyOnce.Do(func() {
		o, err := LookupOwner("nobody")
		if err == nil {
			nobodyOwner = o
		}
	})
	return nobodyOwner
}

// LookupOwner resolves a user name (or numeric uid) to its uid and
// primary gid.
func LookupOwner(name string) (*Owner, error) {
	u, err := user.Lookup(name)
	if err != nil {
		if _, numErr := strconv.Atoi(name); numErr == nil {
			u, err = user.LookupId(name)
		}
		if err != nil {
			return nil, err
		}
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return nil, fmt.Errorf("user %q has non-numeric uid %q", name, u.Uid)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return nil, fmt.Errorf("user %q has non-numeric gid %q", name, u.Gid)
	}
	return &Owner{UID: uid, GID: gid}, nil
}

// LookupUser is LookupOwner with the message every entry point gives for
// a user it cannot resolve ("failed to look up user ..."), so that a
// create and an exec that name the same unknown user say the same thing.
// The error wraps os/user's (user.UnknownUserError for an unknown name,
// user.UnknownUserIdError for an unknown uid).
func LookupUser(name string) (*Owner, error) {
	o, err := LookupOwner(name)
	if err != nil {
		return nil, fmt.Errorf("failed to look up user %q: %w", name, err)
	}
	return o, nil
}

// beneathFS is an fs.FS over a directory fd in which every open refuses
// symbolic links, so a snapshot walk cannot be redirected by a link
// planted while it runs. It implements fs.ReadDirFS and fs.ReadLinkFS.
type beneathFS struct {
	fd int
}

var (
	_ fs.ReadDirFS  = beneathFS{}
	_ fs.ReadLinkFS = beneathFS{}
)

func (b beneathFS) check(op, name string) error {
	if !fs.ValidPath(name) {
		return &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return nil
}

// Open opens a file for reading; a FIFO does not block the open.
func (b beneathFS) Open(name string) (fs.File, error) {
	fd, err := b.OpenFd(name)
	if err != nil {
		return nil, err
	}
	return fdFile(fd, name), nil
}

// ReadDir lists a directory with lstat information, sorted by name.
func (b beneathFS) ReadDir(name string) ([]fs.DirEntry, error) {
	if err := b.check("readdir", name); err != nil {
		return nil, err
	}
	infos, err := readDirBeneath(b.fd, name)
	if err != nil {
		return nil, err
	}
	out := make([]fs.DirEntry, len(infos))
	for i, fi := range infos {
		out[i] = fs.FileInfoToDirEntry(fi)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out, nil
}

// Lstat stats name without following a final link.
func (b beneathFS) Lstat(name string) (fs.FileInfo, error) {
	if err := b.check("lstat", name); err != nil {
		return nil, err
	}
	st, err := LstatBeneath(b.fd, name)
	if err != nil {
		return nil, err
	}
	return NewStatInfo(path.Base(name), st), nil
}

// ReadLink returns a link's raw target.
func (b beneathFS) ReadLink(name string) (string, error) {
	if err := b.check("readlink", name); err != nil {
		return "", err
	}
	target, isLink, err := ReadlinkBeneath(b.fd, name)
	if err != nil {
		return "", err
	}
	if !isLink {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	return target, nil
}

// NewBeneathFS returns a ReadFS over the directory fd: every open refuses
// symbolic links and stays beneath fd. The caller keeps fd open while the
// ReadFS is in use and closes it afterwards.
func NewBeneathFS(fd int) ReadFS { return beneathFS{fd: fd} }
