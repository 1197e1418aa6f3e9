package volume

import (
	"errors"
	"io/fs"
	"syscall"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/hashicorp/go-hclog"
)

// ToErrno is the one place where errors become errnos. Every FUSE handler
// that can see a non-errno error returns ToErrno(err). Domain sentinels get
// the errno a shell user would expect; an error nobody mapped is logged and
// becomes EIO, so that it is noticed instead of masquerading as ENOENT.
func ToErrno(logger hclog.Logger, err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		return errno
	case errors.Is(err, allocdir.ErrUnknownAlloc), errors.Is(err, allocdir.ErrGone), errors.Is(err, fs.ErrNotExist):
		return syscall.ENOENT
	case errors.Is(err, allocdir.ErrEscapes):
		return syscall.EXDEV
	case errors.Is(err, allocdir.ErrSecret), errors.Is(err, allocdir.ErrPrivate), errors.Is(err, fs.ErrPermission):
		return syscall.EACCES
	case errors.Is(err, allocdir.ErrInvalidName), errors.Is(err, fs.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, fs.ErrExist), errors.Is(err, store.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, store.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, store.ErrPinned):
		return syscall.EBUSY
	}
	if logger != nil {
		logger.Error("unmapped error returned as EIO", "error", err)
	}
	return syscall.EIO
}
