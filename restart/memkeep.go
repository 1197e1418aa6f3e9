//go:build linux

package restart

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/store"
	"golang.org/x/sys/unix"
)

// Memory volumes (a task's secrets/ and private/) are tmpfs instances
// that live while a descriptor of theirs is open (fs/memvol.go). What
// keeps the FUSE connection while no daemon runs keeps those descriptors
// too: the holder, under the volume's key, or systemd's descriptor store,
// under a name derived from it.

// HolderKeeper keeps memory volumes in the holder at socket.
type HolderKeeper struct{ Socket string }

func (k HolderKeeper) Keep(key string, fd int) error {
	answer, _, err := askHolderWith(k.Socket, "keep "+url.PathEscape(key), fd)
	if err != nil {
		return fmt.Errorf("the holder did not take memory volume %s: %w", key, err)
	}
	if a := strings.TrimSpace(answer); a != "ok" {
		return fmt.Errorf("the holder refused memory volume %s: %s", key, a)
	}
	return nil
}

func (k HolderKeeper) Drop(key string) error {
	answer, _, err := askHolderWith(k.Socket, "drop "+url.PathEscape(key), -1)
	if holderGone(err) {
		// What a holder keeps ends with it; at a full stop it ends with
		// the connection, before the mount drops its volumes.
		return nil
	}
	if err != nil {
		return fmt.Errorf("the holder did not drop memory volume %s: %w", key, err)
	}
	if a := strings.TrimSpace(answer); a != "ok" {
		return fmt.Errorf("the holder refused to drop memory volume %s: %s", key, a)
	}
	return nil
}

// holderGone reports whether err, of a request to a holder, says that
// none listens on its socket: the socket is gone (a holder removes it as
// it exits) or nothing accepts on it (a holder killed).
func holderGone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED)
}

// HeldMemory takes a copy of every memory volume the holder at socket
// keeps, by key.
func HeldMemory(socket string) (map[string]int, error) {
	names, _, err := askHolderWith(socket, "names", -1)
	if err != nil {
		return nil, fmt.Errorf("asking the holder for its memory volumes: %w", err)
	}
	held := make(map[string]int)
	for _, name := range strings.Fields(names) {
		key, err := url.PathUnescape(name)
		if err != nil {
			continue
		}
		answer, fd, err := askHolderWith(socket, "get "+name, -1)
		if err != nil {
			CloseAll(held)
			return nil, fmt.Errorf("asking the holder for memory volume %s: %w", key, err)
		}
		if strings.TrimSpace(answer) == "ok" && fd >= 0 {
			held[key] = fd
		}
	}
	return held, nil
}

func CloseAll(fds map[string]int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// SystemdKeeper keeps memory volumes in the unit's descriptor store.
// FDPOLL=0: a directory's descriptor has nothing to poll for.
type SystemdKeeper struct{}

func (SystemdKeeper) Keep(key string, fd int) error {
	return Notify("FDSTORE=1\nFDPOLL=0\nFDNAME="+memFDName(key), fd)
}

func (SystemdKeeper) Drop(key string) error {
	return Notify("FDSTOREREMOVE=1\nFDNAME=" + memFDName(key))
}

// memFDName names a memory volume in systemd's descriptor store, whose
// names are at most 255 characters and have no colon: a task's name may
// be longer, and hold anything.
func memFDName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "mem-" + hex.EncodeToString(sum[:16])
}

// StoredMemory turns the memory volumes systemd passed, by descriptor
// store name, into the keys of s's tasks; a descriptor of no task is
// closed and removed from the store.
func StoredMemory(s *store.Store, byName map[string]int) map[string]int {
	held := make(map[string]int)
	for _, st := range s.List() {
		for _, t := range st.Tasks {
			for _, name := range []string{allocdir.TaskSecrets, allocdir.TaskPrivate} {
				key := st.ID + "/" + t.Name + "/" + name
				if fd, ok := byName[memFDName(key)]; ok {
					held[key] = fd
					delete(byName, memFDName(key))
				}
			}
		}
	}
	for name, fd := range byName {
		unix.Close(fd)
		Notify("FDSTOREREMOVE=1\nFDNAME=" + name)
	}
	return held
}
