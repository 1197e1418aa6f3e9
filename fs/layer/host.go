package layer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A host layer is the bottom layer of a stack that shows directories and
// files of the host at places of their own: a chroot's /bin, /etc, /usr
// under a task's directory, read-only, so that Nomad's chroot build finds
// every file there already and copies none. Nothing of the host is ever
// written: like any lower layer, a change copies the entry up into the
// stack's upper layer first.
//
// The layer has a root of its own, the skeleton: a real directory of the
// data dir holding the directories that lead to each entry (run/ for
// run/resolvconf) and, at each entry's place, a placeholder of its type,
// so that listing a directory on the way shows the right names. Every
// path at or below an entry is reached in the host instead: the entry's
// place itself in its source's parent directory, what lies below it
// beneath the source, fd-relative and without following a symbolic link,
// as in any layer. A symbolic link of the host is shown as one; the
// kernel resolves it for the task, inside its chroot.
//
// Off, a host layer is an empty directory: the tree gives each task
// directory of Nomad's one, and turns it on once Nomad starts building a
// chroot there.

// ErrChrootEntry is what a chroot environment that cannot be shown is
// refused with.
var ErrChrootEntry = errors.New("chroot entry refused")

// HostEntry is one host path shown in a host layer.
type HostEntry struct {
	// Dest is the entry's place inside the volume ("usr",
	// "run/resolvconf"), cleaned, without a leading slash.
	Dest string
	// Source is the host path shown there, absolute and with no symbolic
	// link in it (the one a configured path resolves to).
	Source string
	// Dir says whether Source is a directory.
	Dir bool
}

// HostLayer describes a host layer. Its Skeleton is the stack's last
// root; Empty is an empty directory beside it, what the layer shows while
// it is off.
type HostLayer struct {
	Skeleton string
	Empty    string
	// Entries are sorted by Dest; no Dest lies inside another, nor is
	// one the same as another.
	Entries []HostEntry
	// On reports whether the layer shows its entries.
	On func() bool
	// Removed, when set, holds the entries a task removed from the
	// layer (removals.go); without it, a removal needs a whiteout.
	Removed *Removals
}

// NewHostEntries resolves a chroot environment, host paths by the place
// they take in a task directory (Nomad's chroot_env: source to
// destination), into host entries. A source that does not exist is left
// out, as Nomad leaves it out; a destination that is the volume's root or
// lies inside another destination is refused, as is a source that is the
// host's root.
func NewHostEntries(env map[string]string) ([]HostEntry, error) {
	var out []HostEntry
	for src, dest := range env {
		d := cleanRel(dest)
		if d == "" {
			return nil, fmt.Errorf("%w: %q: its destination %q is the task directory itself", ErrChrootEntry, src, dest)
		}
		real, err := filepath.EvalSymlinks(src)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("chroot entry %q: %w", src, err)
		}
		real, err = filepath.Abs(real)
		if err != nil {
			return nil, fmt.Errorf("chroot entry %q: %w", src, err)
		}
		if real == "/" {
			return nil, fmt.Errorf("%w: %q: the host's root cannot be shown in a task directory", ErrChrootEntry, src)
		}
		fi, err := os.Stat(real)
		if err != nil {
			return nil, fmt.Errorf("chroot entry %q: %w", src, err)
		}
		out = append(out, HostEntry{Dest: d, Source: real, Dir: fi.IsDir()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dest < out[j].Dest })
	for i, a := range out {
		for _, b := range out[i+1:] {
			if a.Dest == b.Dest || strings.HasPrefix(b.Dest, a.Dest+"/") || strings.HasPrefix(a.Dest, b.Dest+"/") {
				return nil, fmt.Errorf("%w: %q and %q: the destination of one lies inside the other's", ErrChrootEntry, a.Dest, b.Dest)
			}
		}
	}
	return out, nil
}

// BuildSkeleton makes dir, a directory that does not exist, the skeleton
// of a host layer of entries: the directories leading to each entry, and
// a placeholder at its place (a directory, or an empty file), owned by
// root with mode 0755 (0644 for a file).
func BuildSkeleton(dir string, entries []HostEntry) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		parent := filepath.Join(dir, filepath.Dir(e.Dest))
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return err
		}
		p := filepath.Join(dir, e.Dest)
		if e.Dir {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// place is where rel, a path inside the volume, lies in the host layer:
// the root to reach it beneath and its path there.
func (h *HostLayer) place(rel string) (string, string, error) {
	if !h.On() {
		if rel == "" {
			return h.Empty, "", nil
		}
		return "", "", syscall.ENOENT
	}
	for _, e := range h.Entries {
		switch {
		case rel == e.Dest:
			return filepath.Dir(e.Source), filepath.Base(e.Source), nil
		case strings.HasPrefix(rel, e.Dest+"/"):
			if !e.Dir {
				return "", "", syscall.ENOTDIR
			}
			return e.Source, rel[len(e.Dest)+1:], nil
		}
	}
	return h.Skeleton, rel, nil
}

// EntryOf numbers the entry rel lies at or below, from 1 in the order of
// Entries; 0 for a path of the skeleton.
func (h *HostLayer) EntryOf(rel string) int {
	rel = cleanRel(rel)
	for i, e := range h.Entries {
		if rel == e.Dest || strings.HasPrefix(rel, e.Dest+"/") {
			return i + 1
		}
	}
	return 0
}

// where is the root, and the path beneath it, that rel in the layer at
// position i is reached by: the layer's own root, but for a host layer.
func (s *Stack) where(i int, rel string) (string, string, error) {
	rel = cleanRel(rel)
	if s.Host == nil || i != len(s.Roots)-1 {
		return s.Roots[i], rel, nil
	}
	return s.Host.place(rel)
}

// rootAt gives the descriptor of the directory root (a layer's root, or a
// host layer's source), from the stack's cache when it has one, and the
// function that gives it back.
func (s *Stack) rootAt(root string) (int, func(), error) {
	if s.held(root) {
		return s.Held.Root()
	}
	if s.Cache != nil {
		return s.Cache.open(root)
	}
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, nil, &os.PathError{Op: "open layer", Path: root, Err: err}
	}
	return fd, func() { unix.Close(fd) }, nil
}

// held reports whether root is the upper layer's root reached by
// descriptor only (Held).
func (s *Stack) held(root string) bool { return s.Held != nil && root == s.Roots[0] }

// IsHost reports whether the layer at position i is a host layer.
func (s *Stack) IsHost(i int) bool { return s.Host != nil && i == len(s.Roots)-1 }

// removed reports whether rel in the layer at position i is hidden by a
// removal recorded for a host layer.
func (s *Stack) removed(i int, rel string) bool {
	return s.IsHost(i) && s.Host.Removed.Hides(rel)
}

// HostRemovals returns the removals the host layer at position i
// records; nil for another layer, or a host layer that records none.
func (s *Stack) HostRemovals(i int) *Removals {
	if !s.IsHost(i) {
		return nil
	}
	return s.Host.Removed
}

// HostOnly reports whether rel, in a directory visible in dirLayers, is
// visible from no lower layer but the host layer, which records its
// removal without a whiteout (RemoveFromHost).
func (s *Stack) HostOnly(rel string, dirLayers []int) bool {
	if s.Host == nil || s.Host.Removed == nil {
		return false
	}
	layers, _, err := s.Visible(rel, Lowers(dirLayers))
	return err == nil && len(layers) == 1 && s.IsHost(layers[0])
}

// RemoveFromHost hides rel, and all below it, in the host layer.
func (s *Stack) RemoveFromHost(rel string) error {
	if s.Host == nil || s.Host.Removed == nil {
		return fmt.Errorf("failed to remove %q from a host layer: %w", rel, syscall.EINVAL)
	}
	return s.Host.Removed.Remove(rel)
}

// SyncRemovals makes the removals recorded for the stack's host layer
// durable.
func (s *Stack) SyncRemovals() error {
	if s.Host == nil || s.Host.Removed == nil {
		return nil
	}
	return s.Host.Removed.Sync()
}
