package layer

import (
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Ctimes keeps a task from seeing allocfs's own changes in an entry's
// change time. A copy-up makes a new upper entry, links a file's other
// names, and creates entries in directories whose times it then puts
// back; on a local filesystem none of that happened, so the entry must
// show the ctime it had before. Ctimes remembers, for each upper inode
// allocfs changed, the ctime the inode got from that change (the seal)
// and the one to show instead; the moment the inode's ctime differs from
// the seal, a task changed it, and its own ctime shows. The backing
// filesystem must give a change after a stat a later ctime than the stat
// saw (multigrain timestamps, Linux 6.13 and later on ext4 and xfs), or
// a task's change in the same clock tick as a copy-up would stay hidden.
//
// The masks live in memory: after a restart, an entry copied up by the
// previous daemon shows the ctime of its copy-up. One Ctimes serves every
// stack of a mount; a nil one masks nothing.
type Ctimes struct {
	mu    sync.Mutex
	masks map[uint64]ctimeMask
}

type ctimeMask struct {
	seal, shown syscall.Timespec
}

// Shown is the ctime a task sees for the upper entry whose lstat is st.
func (c *Ctimes) Shown(st *syscall.Stat_t) syscall.Timespec {
	if c == nil {
		return st.Ctim
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.masks[st.Ino]
	if !ok {
		return st.Ctim
	}
	if m.seal != st.Ctim {
		delete(c.masks, st.Ino) // changed by a task since
		return st.Ctim
	}
	return m.shown
}

// seal records that the entry at l, changed by allocfs just now, shows
// the ctime shown.
func (c *Ctimes) seal(l Loc, shown syscall.Timespec) error {
	if c == nil {
		return nil
	}
	var st syscall.Stat_t
	if err := l.Lstat(&st); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.masks == nil {
		c.masks = make(map[uint64]ctimeMask)
	}
	c.masks[st.Ino] = ctimeMask{seal: st.Ctim, shown: shown}
	return nil
}

// quietly returns, before allocfs changes the upper entry rel on its own
// account, a function to call after the change: it hides the change from
// rel's ctime and, with keepTimes, puts rel's access and modification
// times back (entries a copy-up makes in a directory are not a task's
// change of it).
func (s *Stack) quietly(rel string, keepTimes bool) func() error {
	var st syscall.Stat_t
	l, err := s.Loc(0, rel)
	if err == nil {
		err = l.Lstat(&st)
		l.Close()
	}
	if err != nil {
		return func() error { return err }
	}
	shown := s.Ctimes.Shown(&st)
	return func() error {
		l, err := s.Loc(0, rel)
		if err != nil {
			return err
		}
		defer l.Close()
		if keepTimes {
			ts := []unix.Timespec{unix.NsecToTimespec(st.Atim.Nano()), unix.NsecToTimespec(st.Mtim.Nano())}
			if err := l.Utimes(ts); err != nil {
				return err
			}
		}
		return s.Ctimes.seal(l, shown)
	}
}
