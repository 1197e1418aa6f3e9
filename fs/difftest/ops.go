package difftest

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Slots is the size of each side's pool of open file descriptors. Ops
// name a slot, not an fd, so that one op means the same on both sides.
const Slots = 4

// names is the alphabet of path components: small, so that generated
// operations collide with each other and with the seeded tree.
var names = []string{"a", "b", "c", "d"}

// Special nanosecond values of Op.Atime and Op.Mtime.
const (
	TimeNow  = -1 // UTIME_NOW
	TimeOmit = -2 // UTIME_OMIT
)

// Op is one file-system operation, with every argument fixed, so that
// the two sides execute exactly the same call. Paths are relative to the
// side's root.
type Op struct {
	Kind  string `json:"k"`
	Path  string `json:"p,omitempty"`
	Path2 string `json:"q,omitempty"`
	Slot  int    `json:"s,omitempty"`
	Flags int    `json:"f,omitempty"`
	Mode  uint32 `json:"m,omitempty"`
	Off   int64  `json:"o,omitempty"`
	Off2  int64  `json:"o2,omitempty"`
	Len   int64  `json:"l,omitempty"`
	UID   int    `json:"u,omitempty"`
	GID   int    `json:"g,omitempty"`
	Name  string `json:"n,omitempty"`
	Value string `json:"v,omitempty"`
	Atime int64  `json:"at,omitempty"`
	Mtime int64  `json:"mt,omitempty"`
}

func (o Op) String() string {
	var b strings.Builder
	b.WriteString(o.Kind)
	b.WriteString("(")
	var args []string
	add := func(format string, a ...any) { args = append(args, fmt.Sprintf(format, a...)) }
	switch o.Kind {
	case "open":
		add("%q, %s, %#o -> slot %d", o.Path, openFlagString(o.Flags), o.Mode, o.Slot)
	case "close", "fstat":
		add("slot %d", o.Slot)
	case "write", "read":
		add("slot %d, %d bytes", o.Slot, o.Len)
	case "pwrite", "pread":
		add("slot %d, %d bytes at %d", o.Slot, o.Len, o.Off)
	case "fchmod":
		add("slot %d, %#o", o.Slot, o.Mode)
	case "fchown":
		add("slot %d, %d:%d", o.Slot, o.UID, o.GID)
	case "ftruncate":
		add("slot %d, %d", o.Slot, o.Off)
	case "mmap":
		add("slot %d, %d bytes at %d, %s", o.Slot, o.Len, o.Off, map[int]string{MapMsync: "msync", MapMunmap: "munmap only"}[o.Flags])
	case "copy_file_range":
		add("%q at %d -> slot %d at %d, %d bytes", o.Path, o.Off, o.Slot, o.Off2, o.Len)
	case "fifo":
		add("%q, O_RDWR|O_NONBLOCK|%s -> slot %d, write %d bytes", o.Path, openFlagString(o.Flags), o.Slot, o.Len)
	case "fallocate":
		add("slot %d, mode %#x, %d+%d", o.Slot, o.Flags, o.Off, o.Len)
	case "truncate":
		add("%q, %d", o.Path, o.Off)
	case "chmod", "mkdir", "mkfifo", "mknod":
		add("%q, %#o", o.Path, o.Mode)
	case "chown", "lchown":
		add("%q, %d:%d", o.Path, o.UID, o.GID)
	case "utimensat":
		add("%q, atime %s, mtime %s, flags %#x", o.Path, timeString(o.Atime), timeString(o.Mtime), o.Flags)
	case "link", "rename":
		add("%q, %q", o.Path, o.Path2)
	case "renameat2":
		add("%q, %q, %s", o.Path, o.Path2, renameFlagString(o.Flags))
	case "symlink":
		add("target %q, %q", o.Path2, o.Path)
	case "setxattr":
		add("%q, %q, %q, flags %d", o.Path, o.Name, o.Value, o.Flags)
	case "getxattr", "removexattr":
		add("%q, %q", o.Path, o.Name)
	case "stat":
		add("%q, flags %#x", o.Path, o.Flags)
	default:
		add("%q", o.Path)
	}
	b.WriteString(strings.Join(args, ", "))
	b.WriteString(")")
	return b.String()
}

func timeString(ns int64) string {
	switch ns {
	case TimeNow:
		return "UTIME_NOW"
	case TimeOmit:
		return "UTIME_OMIT"
	}
	return fmt.Sprintf("%d", ns)
}

// Gen produces a deterministic sequence of operations from a seed. It
// knows nothing of the state of the tree: the same seed gives the same
// operations, whatever the file system answers, so that a run can be
// replayed from its seed alone.
type Gen struct {
	r *rand.Rand
	// Root enables the operations only root may do (mknod of a device,
	// RENAME_WHITEOUT); they would only give EPERM otherwise.
	root     bool
	uid, gid int
}

// NewGen returns a generator for seed. uid and gid are the unprivileged
// identity chown operations hand files to.
func NewGen(seed uint64, root bool, uid, gid int) *Gen {
	return &Gen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), root: root, uid: uid, gid: gid}
}

func (g *Gen) path() string {
	depth := 1
	switch x := g.r.IntN(20); {
	case x >= 17:
		depth = 3
	case x >= 9:
		depth = 2
	}
	parts := make([]string, depth)
	for i := range parts {
		parts[i] = names[g.r.IntN(len(names))]
	}
	return strings.Join(parts, "/")
}

func (g *Gen) mode(dir bool) uint32 {
	perms := []uint32{0o644, 0o755, 0o600, 0o777, 0o640, 0o000, 0o711, 0o666}
	m := perms[g.r.IntN(len(perms))]
	if dir {
		m = []uint32{0o755, 0o777, 0o700, 0o775}[g.r.IntN(4)]
	}
	// Set-id and sticky bits often: they are where the semantics differ.
	if g.r.IntN(3) == 0 {
		m |= []uint32{0o4000, 0o2000, 0o1000, 0o6000, 0o7000}[g.r.IntN(5)]
	}
	return m
}

func (g *Gen) owner() (int, int) {
	ids := func(own int) int {
		switch g.r.IntN(3) {
		case 0:
			return -1
		case 1:
			return 0
		}
		return own
	}
	return ids(g.uid), ids(g.gid)
}

func (g *Gen) timeValue() int64 {
	switch g.r.IntN(4) {
	case 0:
		return TimeNow
	case 1:
		return TimeOmit
	}
	// A few fixed instants, so that setting the same time twice happens.
	return []int64{1_000_000_000_000_000_000, 1_500_000_000_123_456_789, 2}[g.r.IntN(3)]
}

// Linux open(2) flags, spelled out so that this package builds its
// operations without importing the platform.
const (
	oRDONLY    = 0x0
	oWRONLY    = 0x1
	oRDWR      = 0x2
	oCREAT     = 0x40
	oEXCL      = 0x80
	oTRUNC     = 0x200
	oAPPEND    = 0x400
	oDIRECTORY = 0x10000
	oNOFOLLOW  = 0x20000
)

// How a "mmap" op flushes what it wrote into the mapping: by msync, or
// by nothing but munmap (the data reaches the file by writeback, on
// close at the latest).
const (
	MapMunmap = 0
	MapMsync  = 1
)

// renameat2(2) flags.
const (
	RenameNoreplace = 1 << 0
	RenameExchange  = 1 << 1
	RenameWhiteout  = 1 << 2
)

func openFlagString(f int) string {
	acc := []string{"O_RDONLY", "O_WRONLY", "O_RDWR", "O_ACCMODE"}[f&3]
	parts := []string{acc}
	for _, fl := range []struct {
		bit  int
		name string
	}{{oCREAT, "O_CREAT"}, {oEXCL, "O_EXCL"}, {oTRUNC, "O_TRUNC"}, {oAPPEND, "O_APPEND"}, {oDIRECTORY, "O_DIRECTORY"}, {oNOFOLLOW, "O_NOFOLLOW"}} {
		if f&fl.bit != 0 {
			parts = append(parts, fl.name)
		}
	}
	return strings.Join(parts, "|")
}

func renameFlagString(f int) string {
	switch f {
	case RenameNoreplace:
		return "RENAME_NOREPLACE"
	case RenameExchange:
		return "RENAME_EXCHANGE"
	case RenameWhiteout:
		return "RENAME_WHITEOUT"
	}
	return fmt.Sprintf("%#x", f)
}

func (g *Gen) openFlags() int {
	f := []int{oRDONLY, oWRONLY, oRDWR}[g.r.IntN(3)]
	for _, fl := range []struct{ bit, oneIn int }{{oCREAT, 2}, {oEXCL, 4}, {oTRUNC, 4}, {oAPPEND, 4}, {oDIRECTORY, 8}, {oNOFOLLOW, 6}} {
		if g.r.IntN(fl.oneIn) == 0 {
			f |= fl.bit
		}
	}
	return f
}

// Next returns the next operation of the sequence.
func (g *Gen) Next() Op {
	slot := g.r.IntN(Slots)
	type choice struct {
		weight int
		make   func() Op
	}
	choices := []choice{
		{8, func() Op {
			return Op{Kind: "open", Path: g.path(), Flags: g.openFlags(), Mode: g.mode(false), Slot: slot}
		}},
		{3, func() Op { return Op{Kind: "close", Slot: slot} }},
		{3, func() Op { return Op{Kind: "write", Slot: slot, Len: int64(1 + g.r.IntN(3000))} }},
		{3, func() Op {
			return Op{Kind: "pwrite", Slot: slot, Len: int64(1 + g.r.IntN(3000)), Off: int64(g.r.IntN(3) * (1 + g.r.IntN(200_000)))}
		}},
		{2, func() Op { return Op{Kind: "read", Slot: slot, Len: int64(1 + g.r.IntN(4096))} }},
		{2, func() Op {
			return Op{Kind: "pread", Slot: slot, Len: int64(1 + g.r.IntN(4096)), Off: int64(g.r.IntN(140_000))}
		}},
		{3, func() Op { return Op{Kind: "fstat", Slot: slot} }},
		{2, func() Op { return Op{Kind: "fchmod", Slot: slot, Mode: g.mode(false)} }},
		{1, func() Op { u, gr := g.owner(); return Op{Kind: "fchown", Slot: slot, UID: u, GID: gr} }},
		{2, func() Op { return Op{Kind: "ftruncate", Slot: slot, Off: int64(g.r.IntN(3) * g.r.IntN(300_000))} }},
		{2, func() Op {
			mode := []int{0, 1, 3}[g.r.IntN(3)] // 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE
			return Op{Kind: "fallocate", Slot: slot, Flags: mode, Off: int64(g.r.IntN(100_000)), Len: int64(1 + g.r.IntN(100_000))}
		}},
		{2, func() Op { return Op{Kind: "truncate", Path: g.path(), Off: int64(g.r.IntN(3) * g.r.IntN(300_000))} }},
		{4, func() Op { return Op{Kind: "chmod", Path: g.path(), Mode: g.mode(g.r.IntN(2) == 0)} }},
		{2, func() Op { u, gr := g.owner(); return Op{Kind: "chown", Path: g.path(), UID: u, GID: gr} }},
		{1, func() Op { u, gr := g.owner(); return Op{Kind: "lchown", Path: g.path(), UID: u, GID: gr} }},
		{2, func() Op {
			var fl int
			if g.r.IntN(4) == 0 {
				fl = 0x100 // AT_SYMLINK_NOFOLLOW
			}
			return Op{Kind: "utimensat", Path: g.path(), Atime: g.timeValue(), Mtime: g.timeValue(), Flags: fl}
		}},
		{3, func() Op { return Op{Kind: "link", Path: g.path(), Path2: g.path()} }},
		{2, func() Op {
			target := g.path()
			if g.r.IntN(2) == 0 {
				target = "../" + target
			}
			return Op{Kind: "symlink", Path: g.path(), Path2: target}
		}},
		{1, func() Op { return Op{Kind: "readlink", Path: g.path()} }},
		{3, func() Op { return Op{Kind: "rename", Path: g.path(), Path2: g.path()} }},
		{3, func() Op {
			flags := []int{RenameNoreplace, RenameExchange}
			if g.root {
				flags = append(flags, RenameWhiteout)
			}
			return Op{Kind: "renameat2", Path: g.path(), Path2: g.path(), Flags: flags[g.r.IntN(len(flags))]}
		}},
		{4, func() Op { return Op{Kind: "mkdir", Path: g.path(), Mode: g.mode(true)} }},
		{2, func() Op { return Op{Kind: "rmdir", Path: g.path()} }},
		{3, func() Op { return Op{Kind: "unlink", Path: g.path()} }},
		{2, func() Op { return Op{Kind: "mkfifo", Path: g.path(), Mode: g.mode(false)} }},
		// A write through a shared mapping of the slot's file, within
		// its size: at its start, in its second page, or in the middle
		// of the seeded sparse file.
		{3, func() Op {
			return Op{Kind: "mmap", Slot: slot, Off: []int64{0, 4096, 128 << 10}[g.r.IntN(3)], Len: int64(1 + g.r.IntN(6000)), Flags: g.r.IntN(2)}
		}},
		{2, func() Op {
			return Op{Kind: "copy_file_range", Path: g.path(), Slot: slot, Off: int64(g.r.IntN(2) * g.r.IntN(4096)), Off2: int64(g.r.IntN(3) * g.r.IntN(8192)), Len: int64(1 + g.r.IntN(6000))}
		}},
		// A FIFO opened for reading and writing (what a task's logger
		// does with its own pipe), into the slot, and written: often
		// more than the pipe holds, so that the write stops short.
		{2, func() Op {
			fl := []int{0, oAPPEND, oCREAT | oTRUNC}[g.r.IntN(3)]
			return Op{Kind: "fifo", Path: g.path(), Slot: slot, Flags: fl, Len: []int64{0, 100, 70000}[g.r.IntN(3)]}
		}},
		{2, func() Op {
			return Op{Kind: "setxattr", Path: g.path(), Name: "user." + names[g.r.IntN(3)], Value: fmt.Sprintf("v%d", g.r.IntN(4)), Flags: g.r.IntN(3)}
		}},
		{1, func() Op { return Op{Kind: "getxattr", Path: g.path(), Name: "user." + names[g.r.IntN(3)]} }},
		{1, func() Op { return Op{Kind: "listxattr", Path: g.path()} }},
		{1, func() Op { return Op{Kind: "removexattr", Path: g.path(), Name: "user." + names[g.r.IntN(3)]} }},
		{2, func() Op {
			var fl int
			if g.r.IntN(2) == 0 {
				fl = 0x100
			}
			return Op{Kind: "stat", Path: g.path(), Flags: fl}
		}},
		{2, func() Op { return Op{Kind: "readdir", Path: []string{".", g.path()}[g.r.IntN(2)]} }},
	}
	if g.root {
		choices = append(choices, choice{1, func() Op { return Op{Kind: "mknod", Path: g.path(), Mode: 0o644} }})
	}
	total := 0
	for _, c := range choices {
		total += c.weight
	}
	x := g.r.IntN(total)
	for _, c := range choices {
		if x < c.weight {
			return c.make()
		}
		x -= c.weight
	}
	panic("unreachable")
}
