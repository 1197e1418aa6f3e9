// Command handles reports the file handles a backing filesystem gives and
// what resolving them costs. See ../README.md.
//
//	handles info PATH...   type and size of each path's handle, its inode
//	                       number, and whether open_by_handle_at accepts
//	                       the handle with the generation zeroed
//	handles bench DIR      DIR holds directories of files (mktree): µs per
//	                       open_by_handle_at vs openat(parent fd, name),
//	                       both O_PATH, warm, then each after drop_caches
//	handles mktree DIR D F D directories of F empty files under DIR
//	handles deep DIR W L   W chains of L nested directories under DIR,
//	                       then µs per cold open of each chain's deepest
//	                       directory: open_by_handle_at (the kernel
//	                       reconnects it to the root) vs openat2 of its
//	                       path from DIR with RESOLVE_BENEATH
//	handles bulkstat DIR   xfs only: µs per XFS_IOC_BULKSTAT of one
//	                       inode, what finds the generation that xfs's
//	                       open_by_handle_at insists on, warm
package main

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 3 {
		log.Fatal("usage: handles info PATH... | bench DIR | mktree DIR D F")
	}
	var err error
	switch os.Args[1] {
	case "info":
		err = info(os.Args[2:])
	case "bench":
		err = bench(os.Args[2])
	case "mktree":
		err = mktree(os.Args[2:])
	case "deep":
		err = deep(os.Args[2:])
	case "bulkstat":
		err = bulkstat(os.Args[2])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

func info(paths []string) error {
	for _, p := range paths {
		h, mid, err := unix.NameToHandleAt(unix.AT_FDCWD, p, 0)
		if err != nil {
			return fmt.Errorf("name_to_handle_at %s: %w", p, err)
		}
		var st unix.Stat_t
		var sfs unix.Statfs_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if err := unix.Statfs(filepath.Dir(p), &sfs); err != nil {
			return err
		}
		// open_by_handle_at refuses an O_PATH mount fd (EBADF).
		mfd, err := unix.Open(filepath.Dir(p), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		fmt.Printf("%s fs_magic=%#x mnt_id=%d ino=%d ino_bits=%d handle_type=%#x handle_bytes=%d handle=%s gen0_open=%s\n",
			p, sfs.Type, mid, st.Ino, 64-leadingZeros(st.Ino), h.Type(), h.Size(), hex.EncodeToString(h.Bytes()), gen0(mfd, h))
		unix.Close(mfd)
	}
	return nil
}

func leadingZeros(x uint64) int {
	n := 0
	for i := 63; i >= 0 && x&(1<<uint(i)) == 0; i-- {
		n++
	}
	return n
}

// gen0 tries the handle with its generation (the 32 bits after a 32- or
// 64-bit inode number in FILEID_INO32_GEN and xfs's 64-bit form) zeroed.
func gen0(mfd int, h unix.FileHandle) string {
	b := append([]byte(nil), h.Bytes()...)
	switch {
	case h.Type() == 1 && len(b) == 8: // FILEID_INO32_GEN (ext4; tmpfs puts the generation first)
		binary.LittleEndian.PutUint32(b[4:], 0)
	case h.Type() == 0x81 && len(b) >= 12: // xfs FILEID_INO32_GEN | XFS_FILEID_TYPE_64FLAG
		binary.LittleEndian.PutUint32(b[8:], 0)
	default:
		return "n/a"
	}
	fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(h.Type(), b), unix.O_PATH)
	if err != nil {
		return "refused(" + err.Error() + ")"
	}
	defer unix.Close(fd)
	// The handle of what was opened carries the real generation: this is
	// how a node ID with only its low bits is checked.
	real, _, err := unix.NameToHandleAt(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return "accepted, but name_to_handle_at(AT_EMPTY_PATH): " + err.Error()
	}
	if hex.EncodeToString(real.Bytes()) != hex.EncodeToString(h.Bytes()) {
		return "accepted, generation not recovered"
	}
	return "accepted,generation-recovered"
}

func mktree(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: mktree DIR D F")
	}
	d, err1 := strconv.Atoi(args[1])
	f, err2 := strconv.Atoi(args[2])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("bad counts %q %q", args[1], args[2])
	}
	for i := range d {
		dir := filepath.Join(args[0], fmt.Sprintf("d%04d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for j := range f {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%04d", j)), nil, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

type entry struct {
	parent int
	name   string
	h      unix.FileHandle
}

func bench(root string) error {
	mfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	dirs, err := os.ReadDir(root)
	if err != nil {
		return err
	}
	var files, dirEntries []entry
	for _, d := range dirs {
		pfd, err := unix.Open(filepath.Join(root, d.Name()), unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		dh, _, err := unix.NameToHandleAt(mfd, d.Name(), 0)
		if err != nil {
			return err
		}
		dirEntries = append(dirEntries, entry{mfd, d.Name(), dh})
		names, err := os.ReadDir(filepath.Join(root, d.Name()))
		if err != nil {
			return err
		}
		for _, n := range names {
			h, _, err := unix.NameToHandleAt(pfd, n.Name(), 0)
			if err != nil {
				return err
			}
			files = append(files, entry{pfd, n.Name(), h})
		}
	}
	byHandle := func(es []entry) error {
		for _, e := range es {
			fd, err := unix.OpenByHandleAt(mfd, e.h, unix.O_PATH)
			if err != nil {
				return fmt.Errorf("open_by_handle_at: %w", err)
			}
			unix.Close(fd)
		}
		return nil
	}
	byName := func(es []entry) error {
		for _, e := range es {
			fd, err := unix.Openat(e.parent, e.name, unix.O_PATH|unix.O_NOFOLLOW, 0)
			if err != nil {
				return fmt.Errorf("openat: %w", err)
			}
			unix.Close(fd)
		}
		return nil
	}
	byNameStat := func(es []entry) error {
		var st unix.Stat_t
		for _, e := range es {
			if err := unix.Fstatat(e.parent, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return fmt.Errorf("fstatat: %w", err)
			}
		}
		return nil
	}
	toHandle := func(es []entry) error {
		for _, e := range es {
			if _, _, err := unix.NameToHandleAt(e.parent, e.name, 0); err != nil {
				return fmt.Errorf("name_to_handle_at: %w", err)
			}
		}
		return nil
	}
	run := func(label string, es []entry, cold bool, fn func([]entry) error) error {
		if cold {
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
				return err
			}
		}
		t := time.Now()
		if err := fn(es); err != nil {
			return err
		}
		el := time.Since(t)
		state := "warm"
		if cold {
			state = "cold"
		}
		fmt.Printf("%-28s %s n=%-6d %.2f µs/op\n", label, state, len(es), float64(el.Microseconds())/float64(len(es)))
		return nil
	}
	for _, cold := range []bool{false, true} {
		for _, c := range []struct {
			label string
			es    []entry
			fn    func([]entry) error
		}{
			{"open_by_handle_at file", files, byHandle},
			{"openat(parent,name) file", files, byName},
			{"fstatat(parent,name) file", files, byNameStat},
			{"name_to_handle_at(parent,name)", files, toHandle},
			{"open_by_handle_at dir", dirEntries, byHandle},
			{"openat(root,name) dir", dirEntries, byName},
		} {
			if !cold {
				// One pass to warm the caches, then the measured one.
				if err := c.fn(c.es); err != nil {
					return err
				}
			}
			if err := run(c.label, c.es, cold, c.fn); err != nil {
				return err
			}
		}
	}
	return nil
}

func dropCaches() error {
	unix.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

func deep(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("usage: deep DIR W L")
	}
	w, err1 := strconv.Atoi(args[1])
	l, err2 := strconv.Atoi(args[2])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("bad counts %q %q", args[1], args[2])
	}
	root := args[0]
	mfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(mfd)
	var rels []string
	var hs []unix.FileHandle
	for i := range w {
		rel := fmt.Sprintf("c%03d", i)
		for j := range l {
			rel = filepath.Join(rel, fmt.Sprintf("l%02d", j))
		}
		if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
			return err
		}
		h, _, err := unix.NameToHandleAt(mfd, rel, 0)
		if err != nil {
			return err
		}
		rels, hs = append(rels, rel), append(hs, h)
	}
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_SYMLINKS}
	for _, m := range []struct {
		label string
		open  func(i int) (int, error)
	}{
		{"open_by_handle_at deep dir", func(i int) (int, error) { return unix.OpenByHandleAt(mfd, hs[i], unix.O_PATH) }},
		{"openat2(root,path) deep dir", func(i int) (int, error) { return unix.Openat2(mfd, rels[i], how) }},
	} {
		for _, cold := range []bool{true, false} {
			if cold {
				if err := dropCaches(); err != nil {
					return err
				}
			}
			t := time.Now()
			for i := range hs {
				fd, err := m.open(i)
				if err != nil {
					return fmt.Errorf("%s: %w", m.label, err)
				}
				unix.Close(fd)
			}
			state := "warm"
			if cold {
				state = "cold"
			}
			fmt.Printf("%-28s %s depth=%d n=%-4d %.2f µs/op\n", m.label, state, l, len(hs), float64(time.Since(t).Microseconds())/float64(len(hs)))
		}
	}
	return nil
}

// xfsBulkstat is XFS_IOC_BULKSTAT, _IOR('X', 127, struct xfs_bulkstat_req)
// with its 64-byte header; the generation sits 64 bytes into each 192-byte
// struct xfs_bulkstat that follows (include/uapi/xfs/xfs_fs.h).
const (
	xfsBulkstat   = 0x8040587f
	bulkstatSize  = 192
	bulkstatGenAt = 64
)

// xfsGen returns the generation of inode ino of the xfs at fd.
func xfsGen(fd int, ino uint64) (uint32, error) {
	var buf [64 + bulkstatSize]byte
	binary.LittleEndian.PutUint64(buf[0:], ino) // ino: start here
	binary.LittleEndian.PutUint32(buf[12:], 1)  // icount
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), xfsBulkstat, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return 0, e
	}
	if binary.LittleEndian.Uint32(buf[16:]) != 1 || binary.LittleEndian.Uint64(buf[64:]) != ino {
		return 0, unix.ESTALE
	}
	return binary.LittleEndian.Uint32(buf[64+bulkstatGenAt:]), nil
}

func bulkstat(root string) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	type pair struct {
		ino uint64
		gen uint32
	}
	var want []pair
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, p, 0)
		if err != nil {
			return err
		}
		if h.Type() != 0x81 {
			return fmt.Errorf("%s: handle type %#x, not xfs's 64-bit form", p, h.Type())
		}
		b := h.Bytes()
		want = append(want, pair{binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint32(b[8:])})
		return nil
	})
	if err != nil {
		return err
	}
	t := time.Now()
	for _, w := range want {
		gen, err := xfsGen(fd, w.ino)
		if err != nil {
			return fmt.Errorf("bulkstat %d: %w", w.ino, err)
		}
		if gen != w.gen {
			return fmt.Errorf("bulkstat %d: generation %#x, handle says %#x", w.ino, gen, w.gen)
		}
	}
	fmt.Printf("%-28s warm n=%-6d %.2f µs/op (every generation matched the handle's)\n", "XFS_IOC_BULKSTAT one inode", len(want), float64(time.Since(t).Microseconds())/float64(len(want)))
	return nil
}
