package fs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allocfs/allocfs/allocdir"
	"github.com/allocfs/allocfs/fs/difftest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/disk"
	"github.com/allocfs/allocfs/fs/store/storetest"
	"golang.org/x/sys/unix"
)

// The differential test: see the difftest package doc for what it
// compares and every normalisation it applies.
//
// Environment:
//
//	ALLOCFS_DIFF_OPS=N   operations per seed, shape and identity (default 200)
//	ALLOCFS_DIFF_SEED=N  run only seed N (to replay a failure); no ratchet check
//	ALLOCFS_DIFF_ONLY=S/I  run only shape S as identity I (snapshot/user...)
//	ALLOCFS_DIFF_TRACE=A-B log every op of steps A to B with both results
const (
	diffDefaultOps = 200
	// The unprivileged identity is nobody:nogroup, Nomad's default task
	// user, who owns the volume roots as Nomad makes them.
	diffUID      = 65534
	diffGID      = 65534
	diffChildEnv = "ALLOCFS_DIFF_CHILD"
)

// diffFixedSeeds run on every run, with one fresh seed.
var diffFixedSeeds = []uint64{201, 207, 208}

// knownDivergence is a divergence of allocfs from ext4 that is known and
// waiting for its fix: its signature and the item of work that fixes
// it.
type knownDivergence struct {
	sig  string
	item string
	// witness is "<shape>/<identity>/<seed>", a sequence of the default
	// number of ops that shows the divergence when the fixed seeds do
	// not: the test runs it too, so that a stale entry is caught all the
	// same.
	witness string
	// rare marks a divergence seen only in runs of 5,000 ops (with the
	// seed in the item): it is listed so that a fresh seed that hits it
	// does not fail, and it is NOT checked for staleness, since no short
	// sequence is known to show it. Check these by hand with long runs
	// (ALLOCFS_DIFF_OPS=5000 ALLOCFS_DIFF_SEED=N) when fixing their item.
	rare bool
}

// knownDivergences is the ratchet. A divergence whose signature is not
// listed fails the test (for the fresh seed only under
// ALLOCFS_DIFF_STRICT=1: otherwise it is logged with its replay line, so
// that exploring never fails an unrelated change); so does a listed
// signature (not marked rare) that the fixed seeds and its witness no
// longer produce, so that a fix removes its entry. A signature names
// what differed (a field of the comparison, never a message) and where:
//
//   - "<op>[ on lower]: errno": the op's errno, by op kind (open with
//     O_CREAT, each renameat2 flag and chown -1:-1 are kinds of their
//     own);
//   - "<class>, op result: <field>" and "<class>, tree: <field>": a
//     field of the op's result (bytes, data, fstat) or of the tree after
//     it, by class of op (create, write, metadata, chown -1:-1, rename,
//     exchange, whiteout, remove, read, setup);
//   - "lower object, op result|tree: <field>": the same for an object of
//     the seeded tree of a snapshot-migrated volume, that is of its
//     lower layer, whatever the op: a copy-up shows through every op
//     that writes, and one entry per op class would list one cause many
//     times;
//   - "reading or listing changes times": the snapshot's own reads
//     changed an mtime or ctime.
//
// It is empty. Full runs of the fixed seeds and a fresh one, 5,000 ops
// each in every shape and as both identities, showed no divergence
// (2026-12-01). The last one this test found was timing, not a result: an
// open right after the close of a daemon-served handle of the same file
// got EIO from the kernel about one run in 40 (seed 207, adopt, as the
// user, step 1726); releaseOrder (fs/releaseorder.go) fixed it, and
// TestOpensOfAFileWhoseSetidBitsChange reproduces it in most runs.
var knownDivergences = []knownDivergence{}

// diffShapes are the volume shapes the test runs on.
var diffShapes = []string{"plain", "adopt", "snapshot"}

// TestDifferential runs seeded random operations on allocfs volumes and on
// a reference directory of the backing ext4, step by step, as root and as
// an unprivileged uid, and checks every divergence against the ratchet of
// knownDivergences.
//
// For each of the fixed seeds and one fresh seed, each shape (a plain
// volume; a volume adopt-migrated from a previous allocation; one
// snapshot-migrated, so that the seeded tree is its lower layer) and each
// identity, it builds the seeded tree (difftest.Populate) in the volume
// through the mount (in the previous allocation's volume before the
// migration) and in a fresh directory of the ext4 that holds the test's
// temp dir, whose root gets the volume root's mode and owner. Then, for
// every op: both sides run it, their results are compared, both trees are
// snapshotted and compared, and whatever differs is recorded under its
// signature, with the seed, the step and the op the first time.
//
// Resynchronisation: after a step with a divergence, both sides are
// thrown away and the sequence goes on, from the next op, on a fresh
// volume and a fresh reference holding the seeded tree. A divergence
// therefore never causes further ones, each is reported once, and every
// op is compared from equal states. The only differences that outlive a
// restart are those of the seeded tree itself (a snapshot volume's lower
// layer shows them): they are reported once per run, and an op's result
// is not compared when it depends on one of them (its path, a parent
// that differs in existence, type, mode or owner, its subtree for rename,
// rmdir and readdir, or the object under an fd), nor is a tree
// difference that a rename or link only carried from there.
//
// The unprivileged identity runs in a helper process (childExecutor);
// its umask is 022, where root's is this process's (the mount library
// sets 0).
func TestDifferential(t *testing.T) {
	// Durability is not what this test is about, and every restart
	// makes and destroys allocations: the store's fsyncs would only
	// slow each one down.
	tm := newTestMountWith(t, store.Options{Disk: noSyncDisk{}})
	refBase := t.TempDir()
	var sfs unix.Statfs_t
	if err := unix.Statfs(refBase, &sfs); err != nil {
		t.Fatal(err)
	}
	// With every store on btrfs (scripts/test-btrfs.sh) the reference
	// is a btrfs directory beside the data dir.
	onBtrfs := storetest.Subvolumes() && sfs.Type == unix.BTRFS_SUPER_MAGIC
	if sfs.Type != unix.EXT4_SUPER_MAGIC && !onBtrfs {
		if os.Getenv("ALLOCFS_REQUIRE_FUSE") == "1" {
			t.Fatalf("the reference directory %s is on a file system with magic %#x, not ext4", refBase, sfs.Type)
		}
		t.Skipf("the reference directory %s is on a file system with magic %#x, not ext4: set TMPDIR to a directory on ext4", refBase, sfs.Type)
	}
	nops := diffDefaultOps
	if v := os.Getenv("ALLOCFS_DIFF_OPS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("ALLOCFS_DIFF_OPS=%q: want a positive number", v)
		}
		nops = n
	}
	seeds := append([]uint64{}, diffFixedSeeds...)
	replay := false
	if v := os.Getenv("ALLOCFS_DIFF_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("ALLOCFS_DIFF_SEED=%q: want a number", v)
		}
		seeds, replay = []uint64{n}, true
	} else {
		seeds = append(seeds, uint64(time.Now().UnixNano()))
	}
	t.Logf("seeds %v (the last one fresh unless replaying), %d ops each; replay one with ALLOCFS_DIFF_SEED=N", seeds, nops)

	known := map[string]string{}
	for _, k := range knownDivergences {
		known[k.sig] = k.item
	}
	fixedCounts := map[string]int{}
	allCounts := map[string]int{}
	only := os.Getenv("ALLOCFS_DIFF_ONLY")
	runSeq := func(t *testing.T, shape, who string, seed uint64, nops int, fixed bool) {
		if only != "" && only != shape+"/"+who {
			return
		}
		run := &diffRun{t: t, tm: tm, shape: shape, who: who, seed: seed, nops: nops, refBase: refBase, known: known, counts: map[string]int{}, fresh: !fixed && !replay}
		run.run()
		for sig, n := range run.counts {
			allCounts[sig] += n
			if fixed {
				fixedCounts[sig] += n
			}
		}
	}
	for _, shape := range diffShapes {
		for _, who := range []string{"root", "user"} {
			t.Run(shape+"/"+who, func(t *testing.T) {
				for i, seed := range seeds {
					runSeq(t, shape, who, seed, nops, !replay && i < len(diffFixedSeeds))
				}
			})
		}
	}
	checkStale := !replay && only == "" && nops >= diffDefaultOps
	if checkStale {
		witnessed := map[string]bool{}
		for _, k := range knownDivergences {
			if k.witness == "" || fixedCounts[k.sig] > 0 || witnessed[k.witness] {
				continue
			}
			witnessed[k.witness] = true
			parts := strings.Split(k.witness, "/")
			seed, err := strconv.ParseUint(parts[len(parts)-1], 10, 64)
			if len(parts) != 3 || err != nil {
				t.Fatalf("witness %q of %q: want shape/identity/seed", k.witness, k.sig)
			}
			t.Run("witness/"+k.witness, func(t *testing.T) {
				runSeq(t, parts[0], parts[1], seed, diffDefaultOps, true)
			})
		}
	}
	var sigs []string
	for sig := range allCounts {
		sigs = append(sigs, sig)
	}
	sort.Strings(sigs)
	var report strings.Builder
	for _, sig := range sigs {
		fmt.Fprintf(&report, "\n%6d  %s", allCounts[sig], sig)
		if item, ok := known[sig]; ok {
			fmt.Fprintf(&report, "  [known: %s]", item)
		} else {
			report.WriteString("  [NEW]")
		}
	}
	t.Logf("divergences by signature over all seeds, shapes and identities:%s", report.String())
	if !checkStale {
		return
	}
	for _, k := range knownDivergences {
		if k.rare {
			continue
		}
		if fixedCounts[k.sig] == 0 {
			t.Errorf("known divergence %q (%s) no longer occurs over the fixed seeds and its witness %q: remove it from knownDivergences", k.sig, k.item, k.witness)
		}
	}
}

// noSyncDisk is the store's disk without its syncs.
type noSyncDisk struct{ disk.OS }

func (noSyncDisk) Fsync(string) error  { return nil }
func (noSyncDisk) Syncfs(string) error { return nil }

// diffRun is one seed's sequence on one shape as one identity.
type diffRun struct {
	// fresh marks the run of the fresh seed: see record.
	fresh bool
	// failedWhiteout marks a step that was a failed RENAME_WHITEOUT:
	// ext4 stamps the parents' times even then (see difftest's doc).
	failedWhiteout bool
	t              *testing.T
	tm             *testMount
	shape, who     string
	seed           uint64
	nops           int
	refBase        string
	known          map[string]string
	counts         map[string]int
	volFd, refFd   int
	vol, ref       *os.File
	refRoot        string
	allocs         []string // the allocations of the current volume, oldest first
	gen            int      // how many times the sides were set up
	resets         int
	ex             diffExecutor
	lower          map[uint64]bool // reference inode numbers of the lower layer's objects
	step           int
	op             difftest.Op
	prevStateDiffs map[string]bool
	// taintedSlots are the fd slots whose object had already diverged,
	// or whose results did: what they answer next is not compared.
	taintedSlots [difftest.Slots]bool
	// skipped counts the results not compared because what they depend
	// on had already diverged.
	skipped int
}

func (r *diffRun) run() {
	t := r.t
	r.setup()
	defer func() {
		if err := r.teardown(true); err != nil {
			t.Errorf("%s as %s, seed %d: %v", r.shape, r.who, r.seed, err)
		}
	}()
	prevV, prevR := r.snapshotSetup(true)
	gen := difftest.NewGen(r.seed, r.who == "root", diffUID, diffGID)
	for r.step = 0; r.step < r.nops; r.step++ {
		r.op = gen.Next()
		before := total(r.counts)
		escapes := r.escapes(r.op)
		v, rr, err := r.ex.exec(r.op)
		if err != nil {
			t.Fatalf("%s as %s, seed %d step %d %v: %v", r.shape, r.who, r.seed, r.step, r.op, err)
		}
		if r.traced(r.step) {
			t.Logf("trace %s as %s, seed %d, step %d: %v\n\tallocfs   %v\n\treference %v", r.shape, r.who, r.seed, r.step, r.op, v, rr)
		}
		tainted := r.resultTainted(rr.Ino, prevR)
		if escapes {
			tainted = true
			if r.op.Kind == "open" {
				r.taintedSlots[r.op.Slot] = true
			}
		}
		if tainted {
			r.skipped++
		} else {
			diffs := difftest.CompareResults(v, rr)
			for _, d := range diffs {
				switch {
				case d.Field == "errno":
					r.record(r.label(rr.Ino)+": errno", d)
				case r.lower[rr.Ino] && rr.Ino != 0:
					r.record("lower object, op result: "+d.Field, d)
				default:
					r.record(opClass(r.op)+", op result: "+d.Field, d)
				}
			}
			if len(diffs) > 0 && (r.op.Path == "" || r.op.Kind == "open") {
				r.taintedSlots[r.op.Slot] = true
			}
		}
		r.failedWhiteout = r.op.Kind == "renameat2" && r.op.Flags&unix.RENAME_WHITEOUT != 0 && rr.Errno != ""
		curV, touchedV := difftest.Snapshot(r.volFd, prevV)
		curR, touchedR := difftest.Snapshot(r.refFd, prevR)
		r.compareTrees(curV, curR, prevV, prevR, touchedV, touchedR, tainted)
		prevV, prevR = curV, curR
		if total(r.counts) > before || r.failedWhiteout {
			// Resynchronise: both sides start again from the seeded
			// tree, so that what follows is compared from equal states
			// and one cause is reported once, not in every later op
			// that depends on it. A failed RENAME_WHITEOUT is one too:
			// ext4 stamped the reference's parents (see difftest's doc).
			r.resets++
			if err := r.teardown(false); err != nil {
				t.Fatalf("%s as %s, seed %d: %v", r.shape, r.who, r.seed, err)
			}
			r.setup()
			prevV, prevR = r.snapshotSetup(false)
			continue
		}
		// An inode number the reference no longer has may be reused
		// by a new object, which is not from the lower layer.
		present := map[uint64]bool{}
		for _, e := range curR {
			present[e.Ino] = true
		}
		for ino := range r.lower {
			if !present[ino] {
				delete(r.lower, ino)
			}
		}
	}
	t.Logf("%s as %s, seed %d: %d ops, %d divergences, %d restarts from the seeded tree (after each divergence and each failed RENAME_WHITEOUT), %d results or tree differences not compared (they depend on a divergence of the seeded tree)", r.shape, r.who, r.seed, r.nops, total(r.counts), r.resets, r.skipped)
}

// setup makes a fresh volume of the run's shape and a fresh reference
// directory, both holding the seeded tree, and starts the executor.
func (r *diffRun) setup() {
	t := r.t
	r.gen++
	id := fmt.Sprintf("%s-%s-%d-%d", r.shape, r.who, r.seed, r.gen)
	web := []allocdir.Task{{Name: "web"}}
	r.allocs = nil
	switch r.shape {
	case "plain":
		if _, err := r.tm.store.Create(id, web, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r.allocs = append(r.allocs, id)
		r.populate(filepath.Join(r.tm.dir, id, "alloc/data"))
	default:
		prev := id + "-prev"
		if _, err := r.tm.store.Create(prev, web, store.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		r.allocs = append(r.allocs, prev)
		r.populate(filepath.Join(r.tm.dir, prev, "alloc/data"))
		if _, err := r.tm.store.Stop(prev); err != nil {
			t.Fatal(err)
		}
		kind := store.MigrationAdopt
		if r.shape == "snapshot" {
			kind = store.MigrationSnapshot
		}
		if _, err := r.tm.store.Create(id, web, store.CreateOptions{Previous: prev, Migration: kind}); err != nil {
			t.Fatal(err)
		}
		r.allocs = append(r.allocs, id)
	}
	vol, err := os.Open(filepath.Join(r.tm.dir, id, "alloc/data"))
	if err != nil {
		t.Fatal(err)
	}
	r.vol = vol
	var st unix.Stat_t
	if err := unix.Fstat(int(vol.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	r.refRoot = filepath.Join(r.refBase, id)
	if err := os.Mkdir(r.refRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(r.refRoot, os.FileMode(st.Mode&0o777)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(r.refRoot, int(st.Uid), int(st.Gid)); err != nil {
		t.Fatal(err)
	}
	ref, err := os.Open(r.refRoot)
	if err != nil {
		t.Fatal(err)
	}
	r.ref = ref
	if err := difftest.Populate(int(ref.Fd()), diffUID, diffGID); err != nil {
		t.Fatal(err)
	}
	r.volFd, r.refFd = int(vol.Fd()), int(ref.Fd())
	switch {
	case r.ex != nil:
		err = r.ex.reset(vol, ref)
	case r.who == "user":
		r.ex, err = startDiffChild(vol, ref)
	default:
		r.ex = &localExecutor{}
		err = r.ex.reset(vol, ref)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.taintedSlots = [difftest.Slots]bool{}
}

// snapshotSetup takes the first snapshots of a fresh pair of sides. The
// differences of the seeded tree itself are recorded only the first time
// (record); after a restart they are the baseline, as they were before.
func (r *diffRun) snapshotSetup(record bool) (difftest.Tree, difftest.Tree) {
	prevV, touchedV := difftest.Snapshot(r.volFd, nil)
	prevR, touchedR := difftest.Snapshot(r.refFd, nil)
	r.lower = map[uint64]bool{}
	if r.shape == "snapshot" {
		for _, e := range prevR {
			r.lower[e.Ino] = true
		}
	}
	op, step := r.op, r.step
	r.op, r.step = difftest.Op{Kind: "setup"}, -1
	if record {
		r.compareTrees(prevV, prevR, nil, nil, touchedV, touchedR, false)
	} else {
		r.prevStateDiffs = map[string]bool{}
		for _, d := range difftest.CompareTrees(prevV, prevR, nil, nil) {
			r.prevStateDiffs[d.Path+"\x00"+d.Field] = true
		}
	}
	r.op, r.step = op, step
	return prevV, prevR
}

// teardown removes both sides; at the end of the run (final) it also
// stops the executor.
func (r *diffRun) teardown(final bool) error {
	var err error
	if final {
		err = r.ex.close()
	}
	err = errors.Join(err, r.vol.Close(), r.ref.Close(), os.RemoveAll(r.refRoot))
	for i := len(r.allocs) - 1; i >= 0; i-- {
		err = errors.Join(err, r.tm.store.Destroy(r.allocs[i]))
	}
	return err
}

func total(counts map[string]int) int {
	n := 0
	for _, c := range counts {
		n += c
	}
	return n
}

// resultTainted reports whether the current op's result depends on
// something that had already diverged at the previous snapshot, so that
// a difference in it would only repeat an earlier divergence: its path
// (or, for the ops that depend on what is below it, its subtree), a
// parent whose existence, type, mode or owner differs, or, for an fd, the
// object it was opened on. ino is the reference object's inode number.
func (r *diffRun) resultTainted(ino uint64, prevR difftest.Tree) bool {
	op := r.op
	switch op.Kind {
	case "open":
		t := r.pathTainted(op.Path, false)
		r.taintedSlots[op.Slot] = t
		return t
	case "close":
		t := r.taintedSlots[op.Slot]
		r.taintedSlots[op.Slot] = false
		return t
	}
	if op.Path == "" {
		if r.taintedSlots[op.Slot] {
			return true
		}
		for p, e := range prevR {
			if ino != 0 && e.Ino == ino && r.pathTainted(p, false) {
				return true
			}
		}
		return false
	}
	subtree := false
	switch op.Kind {
	case "rename", "renameat2", "rmdir", "readdir":
		subtree = true
	}
	if r.pathTainted(op.Path, subtree) {
		return true
	}
	return op.Path2 != "" && op.Kind != "symlink" && r.pathTainted(op.Path2, subtree)
}

// ancestorFields are the differences of a directory that change what an
// operation below it does.
var ancestorFields = map[string]bool{"presence": true, "type": true, "mode permission bits": true, "mode set-id/sticky bits": true, "owner": true, "read error": true}

func (r *diffRun) pathTainted(p string, subtree bool) bool {
	for key := range r.prevStateDiffs {
		q, field, _ := strings.Cut(key, "\x00")
		if q == p || (subtree && under(q, p)) || (under(p, q) && ancestorFields[field]) {
			return true
		}
	}
	return false
}

// under reports whether q is strictly below p.
func under(q, p string) bool {
	return q != p && (p == "." || strings.HasPrefix(q, p+"/"))
}

// origin is where the object now at path p was before the current op,
// for the ops that move or link names; "" for the others.
func (r *diffRun) origin(p string) string {
	op := r.op
	moved := func(from, to string) string {
		if p == to {
			return from
		}
		if strings.HasPrefix(p, to+"/") {
			return from + p[len(to):]
		}
		return ""
	}
	switch op.Kind {
	case "rename", "renameat2":
		if o := moved(op.Path, op.Path2); o != "" {
			return o
		}
		if op.Flags == difftest.RenameExchange {
			return moved(op.Path2, op.Path)
		}
	case "link":
		if p == op.Path2 {
			return op.Path
		}
	}
	return ""
}

// opClass groups op kinds for the signatures of attribute and tree
// differences: one cause (a copy-up, say) shows through many ops, and a
// signature per op kind would list it many times.
func opClass(op difftest.Op) string {
	switch op.Kind {
	case "open":
		if op.Flags&unix.O_CREAT != 0 {
			return "create"
		}
		if op.Flags&unix.O_TRUNC != 0 {
			return "write"
		}
		return "read"
	case "mkdir", "mkfifo", "mknod", "symlink", "link":
		return "create"
	case "write", "pwrite", "truncate", "ftruncate", "fallocate", "mmap", "copy_file_range", "fifo":
		return "write"
	case "chmod", "fchmod", "chown", "lchown", "fchown", "utimensat", "setxattr", "removexattr":
		if (op.Kind == "chown" || op.Kind == "lchown" || op.Kind == "fchown") && op.UID == -1 && op.GID == -1 {
			return "chown -1:-1"
		}
		return "metadata"
	case "rename":
		return "rename"
	case "renameat2":
		return map[int]string{difftest.RenameNoreplace: "rename", difftest.RenameExchange: "exchange", difftest.RenameWhiteout: "whiteout"}[op.Flags]
	case "unlink", "rmdir":
		return "remove"
	case "setup":
		return "setup"
	}
	return "read"
}

func (r *diffRun) onLower(ino uint64) string {
	if ino != 0 && r.lower[ino] {
		return " on lower"
	}
	return ""
}

// populate builds the starting tree in a volume through the mount.
func (r *diffRun) populate(dir string) {
	f, err := os.Open(dir)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	if err := difftest.Populate(int(f.Fd()), diffUID, diffGID); err != nil {
		r.t.Fatalf("populate the volume: %v", err)
	}
}

// label names the current op for a signature: its kind, the variant that
// matters for classification, and whether it acted on a lower object.
func (r *diffRun) label(ino uint64) string {
	l := r.op.Kind
	switch r.op.Kind {
	case "open":
		if r.op.Flags&unix.O_CREAT != 0 {
			l = "open(O_CREAT)"
		}
	case "renameat2":
		l = "renameat2(" + map[int]string{difftest.RenameNoreplace: "NOREPLACE", difftest.RenameExchange: "EXCHANGE", difftest.RenameWhiteout: "WHITEOUT"}[r.op.Flags] + ")"
	case "chown", "lchown", "fchown":
		if r.op.UID == -1 && r.op.GID == -1 {
			l += " -1:-1"
		}
	}
	return l + r.onLower(ino)
}

// compareTrees records how the trees differ after the current op. When
// the op itself depended on a divergence of the seeded tree (tainted),
// what it changed is not compared either: the new differences join the
// baseline.
func (r *diffRun) compareTrees(curV, curR, prevV, prevR difftest.Tree, touchedV, touchedR []string, tainted bool) {
	state := map[string]bool{}
	for _, d := range difftest.CompareTrees(curV, curR, prevV, prevR) {
		var ino uint64
		if e := curR[d.Path]; e != nil {
			ino = e.Ino
		} else if e := prevR[d.Path]; e != nil {
			ino = e.Ino
		}
		if !difftest.StepField(d.Field) {
			key := d.Path + "\x00" + d.Field
			state[key] = true
			if r.prevStateDiffs[key] {
				continue // still the same difference, reported when it appeared
			}
			if o := r.origin(d.Path); o != "" && r.prevStateDiffs[o+"\x00"+d.Field] {
				r.skipped++
				continue // an earlier difference, moved or linked here
			}
		}
		timeField := d.Field == "mtime changed" || d.Field == "ctime changed"
		fifoIO := (r.op.Kind == "write" || r.op.Kind == "read" || r.op.Kind == "fifo") && curR[d.Path] != nil && curR[d.Path].Type == "fifo"
		if tainted || timeField && (fifoIO || r.failedWhiteout && (d.Path == opParent(r.op.Path) || d.Path == opParent(r.op.Path2))) {
			r.skipped++
			continue
		}
		if ino != 0 && r.lower[ino] {
			r.record("lower object, tree: "+d.Field, d)
		} else {
			r.record(opClass(r.op)+", tree: "+d.Field, d)
		}
	}
	r.prevStateDiffs = state
	tv := strings.Join(touchedV, " ")
	if tr := strings.Join(touchedR, " "); tv != tr {
		r.record("reading or listing changes times", difftest.Diff{Field: "names whose times reading changed", Vol: "[" + tv + "]", Ref: "[" + tr + "]"})
	}
}

// traced reports whether ALLOCFS_DIFF_TRACE asks for step's op.
func (r *diffRun) traced(step int) bool {
	v := os.Getenv("ALLOCFS_DIFF_TRACE")
	if v == "" {
		return false
	}
	var from, to int
	if _, err := fmt.Sscanf(v, "%d-%d", &from, &to); err != nil {
		r.t.Fatalf("ALLOCFS_DIFF_TRACE=%q: want A-B, a range of steps", v)
	}
	return step >= from && step <= to
}

// escapes reports whether a path of op leads out of the reference root
// through a symbolic link ("../b"): the two roots sit in different
// surroundings (an allocation's alloc/ against a temporary directory), so
// what such an op finds or makes outside is not compared.
func (r *diffRun) escapes(op difftest.Op) bool {
	for _, p := range []string{op.Path, op.Path2} {
		if p == "" || (op.Kind == "symlink" && p == op.Path2) {
			continue
		}
		for _, q := range []string{filepath.Dir(p), p} {
			fd, err := unix.Openat2(r.refFd, q, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH})
			if err == nil {
				unix.Close(fd)
			}
			if errors.Is(err, unix.EXDEV) {
				return true
			}
		}
	}
	return false
}

// opParent is the snapshot path of the directory that holds an op's
// path.
func opParent(p string) string {
	if p == "" {
		return ""
	}
	return filepath.Dir(p)
}

func (r *diffRun) record(sig string, d difftest.Diff) {
	r.counts[sig]++
	if r.counts[sig] > 1 {
		return
	}
	where := fmt.Sprintf("%s as %s, seed %d (ALLOCFS_DIFF_SEED=%d), step %d: %v: %v", r.shape, r.who, r.seed, r.seed, r.step, r.op, d)
	if item, ok := r.known[sig]; ok {
		r.t.Logf("known divergence %q (%s), first at %s", sig, item, where)
		return
	}
	if r.fresh && os.Getenv("ALLOCFS_DIFF_STRICT") != "1" {
		// The fresh seed explores: while known divergences' fixes are
		// under way, a divergence no fixed seed has shown yet is a finding to
		// replay and list (or fix), not a failure of an unrelated
		// change's CI. ALLOCFS_DIFF_STRICT=1 makes it one; the fixed
		// seeds and the witnesses always are.
		r.t.Logf("NEW divergence %q found by the fresh seed at %s", sig, where)
		return
	}
	r.t.Errorf("NEW divergence %q at %s", sig, where)
}
