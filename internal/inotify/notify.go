//go:build linux

package inotify

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchMask is every event that can change what a follower of a name in
// the watched directory would see. IN_ONLYDIR and IN_DONT_FOLLOW make a
// watch refuse a path that is (or was swapped for) anything but a real
// directory.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE |
	unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_DONT_FOLLOW

// ErrClosed is returned by Arm once the notifier is closed.
var ErrClosed = errors.New("notifier closed")

// Notifier turns inotify events into wake-ups for subscriptions. Each
// subscription watches one name in one directory and is woken when an
// event names it or its directory; it is also woken by Wake with its tag
// (an allocation whose layout changed) and when events were lost. A wake-up
// only says "look again": subscribers re-stat and decide what changed, so
// coalesced or spurious wake-ups cost a stat and nothing else.
type Notifier struct {
	file *os.File
	done chan struct{}

	mu      sync.Mutex
	closed  bool
	watches map[int32]*dirWatch
	byDir   map[string]int32
	subs    map[*Subscription]struct{}
}

// dirWatch is one inotify watch and the subscriptions that share it.
type dirWatch struct {
	dir  string
	subs map[*Subscription]struct{}
}

// Subscription is one follower's interest. C receives a value (coalesced:
// it has room for one) whenever the follower should look again.
type Subscription struct {
	C   chan struct{}
	n   *Notifier
	tag string
	wd  int32 // -1 when not armed
	// name filters the events of the watched directory: only those about
	// this entry (and those about the directory itself) wake the follower.
	name string
}

// Woken is C, for those that take a subscription through an interface
// (allocdir.Subscription).
func (s *Subscription) Woken() <-chan struct{} { return s.C }

// New starts a notifier. Close releases its inotify instance and
// stops its goroutine.
func New() (*Notifier, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	n := &Notifier{
		// A non-blocking fd wrapped by os.NewFile is read through the
		// runtime's poller, so Close unblocks the reader.
		file:    os.NewFile(uintptr(fd), "inotify"),
		done:    make(chan struct{}),
		watches: make(map[int32]*dirWatch),
		byDir:   make(map[string]int32),
		subs:    make(map[*Subscription]struct{}),
	}
	go n.read()
	return n, nil
}

// Close stops the notifier. Subscriptions stay valid but are never woken
// again, so followers must also be cancelled; Close wakes them once so
// they notice.
func (n *Notifier) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	for s := range n.subs {
		s.wake()
	}
	n.mu.Unlock()
	err := n.file.Close()
	<-n.done
	return err
}

// Subscribe returns a subscription that Wake(tag) wakes, not yet armed.
func (n *Notifier) Subscribe(tag string) *Subscription {
	s := &Subscription{C: make(chan struct{}, 1), n: n, tag: tag, wd: -1}
	n.mu.Lock()
	n.subs[s] = struct{}{}
	n.mu.Unlock()
	return s
}

// Wake wakes every subscription with tag: what their paths resolve to may
// have changed without any event in the directories they watch.
func (n *Notifier) Wake(tag string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.subs {
		if s.tag == tag {
			s.wake()
		}
	}
}

func (s *Subscription) wake() {
	select {
	case s.C <- struct{}{}:
	default:
	}
}

// Arm points the subscription at root/rel: it watches the deepest
// directory of that path that exists now, at or below root, for events
// about the next component. A follower re-arms after every wake-up, so a
// path whose directories appear one by one is followed down as they do.
// rel must be clean and relative; "" or "." watches root itself. An error
// (the watch limit reached, say) leaves the subscription unarmed: the
// caller must then fall back to polling.
func (s *Subscription) Arm(root, rel string) error {
	dir, name := deepestDir(root, rel)
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	if s.wd >= 0 {
		if w := n.watches[s.wd]; w != nil && w.dir == dir {
			s.name = name
			return nil
		}
		n.releaseLocked(s)
	}
	wd, ok := n.byDir[dir]
	if !ok {
		raw, err := unix.InotifyAddWatch(int(n.file.Fd()), dir, watchMask)
		if err != nil {
			return fmt.Errorf("watch %s: %w", dir, err)
		}
		wd = int32(raw)
		// The kernel hands out one watch per inode: a directory reached by
		// two paths (or renamed) comes back with a wd we already hold.
		if w, held := n.watches[wd]; held {
			delete(n.byDir, w.dir)
			w.dir = dir
		} else {
			n.watches[wd] = &dirWatch{dir: dir, subs: make(map[*Subscription]struct{})}
		}
		n.byDir[dir] = wd
	}
	n.watches[wd].subs[s] = struct{}{}
	s.wd, s.name = wd, name
	return nil
}

// Close ends the subscription and drops its watch if it was the last one
// on that directory.
func (s *Subscription) Close() {
	n := s.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.releaseLocked(s)
	delete(n.subs, s)
}

func (n *Notifier) releaseLocked(s *Subscription) {
	if s.wd < 0 {
		return
	}
	if w := n.watches[s.wd]; w != nil {
		delete(w.subs, s)
		if len(w.subs) == 0 {
			delete(n.watches, s.wd)
			delete(n.byDir, w.dir)
			if !n.closed {
				// EINVAL here means the kernel dropped the watch already
				// (its directory is gone) and an IN_IGNORED is on its way.
				_, _ = unix.InotifyRmWatch(int(n.file.Fd()), uint32(s.wd))
			}
		}
	}
	s.wd = -1
}

// deepestDir returns the deepest existing directory on the way from root
// to root/rel, and the name under it that leads on (or is the target).
// Symbolic links are not followed: a link is where the way ends.
func deepestDir(root, rel string) (dir, next string) {
	dir = root
	rel = strings.Trim(filepath.Clean("/"+rel), "/")
	if rel == "" {
		return root, ""
	}
	comps := strings.Split(rel, "/")
	for i, c := range comps {
		if i == len(comps)-1 {
			return dir, c
		}
		var st unix.Stat_t
		p := filepath.Join(dir, c)
		if unix.Lstat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return dir, c
		}
		dir = p
	}
	return dir, ""
}

// read delivers events until the inotify fd is closed.
func (n *Notifier) read() {
	defer close(n.done)
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		got, err := n.file.Read(buf)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return
		}
		n.dispatch(buf[:got])
	}
}

func (n *Notifier) dispatch(buf []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for off := 0; off+unix.SizeofInotifyEvent <= len(buf); {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
		end := off + unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			break
		}
		name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:end]), "\x00")
		off = end
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
			// Events were lost: everyone looks again.
			for s := range n.subs {
				s.wake()
			}
			continue
		}
		w := n.watches[ev.Wd]
		if w == nil {
			continue
		}
		for s := range w.subs {
			if name == "" || name == s.name || s.name == "" {
				s.wake()
			}
		}
		if ev.Mask&(unix.IN_IGNORED|unix.IN_MOVE_SELF) != 0 {
			// The directory is gone (the kernel dropped the watch) or was
			// renamed: a watch follows its inode, so it no longer watches
			// the path it was placed for, and whatever is created at that
			// path next must get a watch of its own. Its followers were
			// just woken and re-arm.
			for s := range w.subs {
				s.wd = -1
			}
			delete(n.watches, ev.Wd)
			delete(n.byDir, w.dir)
			if ev.Mask&unix.IN_MOVE_SELF != 0 {
				_, _ = unix.InotifyRmWatch(int(n.file.Fd()), uint32(ev.Wd))
			}
		}
	}
}
