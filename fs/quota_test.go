package fs

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/fs/store"
	"github.com/allocfs/allocfs/fs/store/record"
	"golang.org/x/sys/unix"
)

// newQuotaMount mounts a store with disk limits on a fresh btrfs image.
func newQuotaMount(t *testing.T) *testMount {
	t.Helper()
	fstest.RequireFUSE(t)
	img := fstest.Image(t, "btrfs", 600, "")
	s := openTestStore(t, filepath.Join(img, "data"), store.Options{Quotas: true})
	if !s.Quota().Enforced() {
		t.Fatalf("no quotas on a btrfs image: %+v", s.Quota())
	}
	return mountTestStore(t, s, nil)
}

// TestQuotaThroughTheMount: a task's writes past its allocation's limit
// fail with EDQUOT however they reach the disk (passthrough, the daemon
// for a set-id file, fallocate), near the limit; another allocation
// writes on; df inside the allocation shows its size; and two volumes'
// files, whose subvolumes number inodes alike, keep apart.
func TestQuotaThroughTheMount(t *testing.T) {
	tm := newQuotaMount(t)
	const limit = 32 << 20
	if _, err := tm.store.Create("a1", tasks("web"), store.CreateOptions{Limit: record.Limit{Bytes: limit}}); err != nil {
		t.Fatal(err)
	}
	must(t, errOnly(tm.store.Create("a2", tasks("web"), store.CreateOptions{})))
	data := filepath.Join(tm.dir, "a1", "alloc", "data")

	n, err := fstest.WriteUntil(filepath.Join(data, "dd"), 0o644, 2*limit)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("passthrough write of twice the limit: %d bytes, %v; want EDQUOT", n, err)
	}
	t.Logf("passthrough: EDQUOT after %d of %d bytes", n, limit)
	if n > limit || n < limit-4<<20 {
		t.Fatalf("passthrough wrote %d bytes under a limit of %d", n, limit)
	}
	if n, err := fstest.WriteUntil(filepath.Join(tm.dir, "a2", "alloc", "data", "big"), 0o644, 2*limit); err != nil {
		t.Fatalf("the allocation without a limit: %d bytes, %v", n, err)
	}

	var sfs unix.Statfs_t
	if err := unix.Statfs(data, &sfs); err != nil {
		t.Fatal(err)
	}
	if got := int64(sfs.Blocks) * sfs.Frsize; got != limit || sfs.Bavail > sfs.Blocks/8 {
		t.Fatalf("df in the full allocation: %d bytes of which %d free, want %d and about none", got, int64(sfs.Bavail)*sfs.Frsize, limit)
	}
	for _, p := range []string{filepath.Join(tm.dir, "a1"), filepath.Join(tm.dir, "a1", "alloc"), filepath.Join(tm.dir, "a1", "web", "local")} {
		var in unix.Statfs_t
		if err := unix.Statfs(p, &in); err != nil || int64(in.Blocks)*in.Frsize != limit {
			t.Fatalf("df of %s: %d blocks of %d (%v)", p, in.Blocks, in.Frsize, err)
		}
	}
	var root unix.Statfs_t
	if err := unix.Statfs(tm.dir, &root); err != nil || int64(root.Blocks)*root.Frsize == limit {
		t.Fatalf("df at the mount root shows the allocation's limit (%v)", err)
	}

	// Room again, then the daemon's own writes: a set-id file's are
	// served by the daemon, which clears the bits.
	if err := os.Remove(filepath.Join(data, "dd")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	n, err = fstest.WriteUntil(filepath.Join(tm.dir, "a1", "web", "local", "suid"), 0o4755, 2*limit)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("daemon-served write of twice the limit: %d bytes, %v; want EDQUOT", n, err)
	}
	t.Logf("daemon-served: EDQUOT after %d of %d bytes", n, limit)
	if n > limit || n < limit-4<<20 {
		t.Fatalf("daemon-served write of %d bytes under a limit of %d", n, limit)
	}
	if err := os.Remove(filepath.Join(tm.dir, "a1", "web", "local", "suid")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()

	// A hard link or a rename into another allocation, which would move
	// bytes out of this one's count, is refused and changes nothing.
	other := filepath.Join(tm.dir, "a2", "alloc", "data")
	if err := os.WriteFile(filepath.Join(data, "mine"), []byte("counted here"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(data, "mine"), filepath.Join(other, "linked")); !errors.Is(err, unix.EXDEV) {
		t.Fatalf("a hard link into another allocation: %v, want EXDEV", err)
	}
	if err := os.Rename(filepath.Join(data, "mine"), filepath.Join(other, "moved")); !errors.Is(err, unix.EXDEV) {
		t.Fatalf("a rename into another allocation: %v, want EXDEV", err)
	}
	if b, err := os.ReadFile(filepath.Join(data, "mine")); err != nil || string(b) != "counted here" {
		t.Fatalf("the file after the refused link and rename: %q, %v", b, err)
	}
	for _, name := range []string{"linked", "moved"} {
		if _, err := os.Lstat(filepath.Join(other, name)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s in the other allocation: %v", name, err)
		}
	}

	// fallocate and a sparse file far beyond the limit.
	f, err := os.Create(filepath.Join(data, "falloc"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, 2*limit); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("fallocate of twice the limit: %v, want EDQUOT", err)
	}
	f.Close()
	sparse := filepath.Join(data, "sparse")
	if err := os.WriteFile(sparse, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(sparse, 1<<40); err != nil {
		t.Fatalf("a sparse file of 1 TiB: %v", err)
	}
	if n, err := fstest.WriteUntil(sparse, 0, 2*limit); !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("filling a sparse file: %d bytes, %v; want EDQUOT", n, err)
	}
}

// TestQuotaKeepsLayersApart: every layer is a subvolume, whose inode
// numbers start over at 256, so the mount's numbers must still tell two
// volumes' files and two layers' files apart.
func TestQuotaKeepsLayersApart(t *testing.T) {
	tm := newQuotaMount(t)
	if _, err := tm.store.Create("a1", tasks("web"), store.CreateOptions{Limit: record.Limit{Bytes: 64 << 20}}); err != nil {
		t.Fatal(err)
	}
	seen := make(map[uint64]string)
	for _, p := range []string{"alloc/data", "alloc/logs", "alloc/tmp", "web/local", "web/tmp", "web"} {
		full := filepath.Join(tm.dir, "a1", p)
		if err := os.WriteFile(filepath.Join(full, "first"), []byte(p), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"", "first"} {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(full, name), &st); err != nil {
				t.Fatal(err)
			}
			if other, ok := seen[st.Ino]; ok {
				t.Fatalf("%s/%s and %s show inode %d", p, name, other, st.Ino)
			}
			seen[st.Ino] = p + "/" + name
		}
		// The listing agrees with stat.
		ents, err := os.ReadDir(full)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			if e.Name() != "first" {
				continue
			}
			info, err := e.Info()
			if err != nil {
				t.Fatal(err)
			}
			if seen[info.Sys().(*syscall.Stat_t).Ino] != p+"/first" {
				t.Fatalf("%s/first: listing and stat disagree", p)
			}
		}
	}
	// A snapshot migration stacks a1's layer under a2's fresh one: a file
	// of each, both the first of their subvolume, stay two files, and a
	// copy-up keeps the lower file's number.
	must(t, errOnly(tm.store.Stop("a1")))
	if _, err := tm.store.Create("a2", tasks("web"), store.CreateOptions{Limit: record.Limit{Bytes: 64 << 20}, Previous: "a1", Migration: store.MigrationSnapshot}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(tm.dir, "a2", "alloc", "data")
	if err := os.WriteFile(filepath.Join(data, "new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	var old, fresh unix.Stat_t
	if err := unix.Lstat(filepath.Join(data, "first"), &old); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lstat(filepath.Join(data, "new"), &fresh); err != nil {
		t.Fatal(err)
	}
	if old.Ino == fresh.Ino {
		t.Fatalf("the lower's file and the upper's show one inode %d", old.Ino)
	}
	f, err := os.OpenFile(filepath.Join(data, "first"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("more"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var after unix.Stat_t
	if err := unix.Lstat(filepath.Join(data, "first"), &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != old.Ino {
		t.Fatalf("a copy-up changed the file's inode from %d to %d", old.Ino, after.Ino)
	}
	if b, err := os.ReadFile(filepath.Join(data, "first")); err != nil || string(b) != "alloc/datamore" {
		t.Fatalf("after the copy-up: %q, %v", b, err)
	}
}

// TestMountListingOpenedBeforeACreate: on btrfs a directory descriptor
// lists only what its directory held when it was opened, until it is
// rewound; the kernel keeps the listing of the mount's first READDIR, so
// a name made between an opendir and its first readdir must be in it, or
// every later listing misses it.
func TestMountListingOpenedBeforeACreate(t *testing.T) {
	tm := newQuotaMount(t)
	must(t, errOnly(tm.store.Create("a1", tasks("web"), store.CreateOptions{})))
	dir := filepath.Join(tm.dir, "a1", "alloc", "data")
	for i := range 3 {
		d, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		name := "made-" + string(rune('a'+i))
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		first, err := d.Readdirnames(-1)
		d.Close()
		if err != nil {
			t.Fatal(err)
		}
		again, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range again {
			names = append(names, e.Name())
		}
		if len(names) != i+1 || names[i] != name {
			t.Fatalf("listing after %s was made while a handle was open: %v (that handle read %v)", name, names, first)
		}
	}
}

// TestQuotaUsageMatchesDu: what the quota accounting says an allocation
// holds is what du says of its directory in the mount, within 1 %, for a
// mix of large, small, sparse and hard-linked files in its data, logs and
// task directories (the <task>/alloc views, which show alloc/ again, and
// the memory volumes, which hold no disk, left out of du).
func TestQuotaUsageMatchesDu(t *testing.T) {
	if _, err := exec.LookPath("du"); err != nil {
		fstest.Lacks(t, "du is needed: %v", err)
	}
	tm := newQuotaMount(t)
	if _, err := tm.store.Create("a1", tasks("web"), store.CreateOptions{Limit: record.Limit{Bytes: 400 << 20}}); err != nil {
		t.Fatal(err)
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	root := filepath.Join(tm.dir, "a1")
	dirs := []string{"alloc/data", "alloc/logs", "alloc/tmp", "web/local", "web/tmp", "web"}
	for i := 0; i < 20; i++ {
		p := filepath.Join(root, dirs[i%len(dirs)], fmt.Sprintf("big%d", i))
		if _, err := fstest.WriteUntil(p, 0o644, 3<<20+rng.Intn(3<<20)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 600; i++ {
		d := filepath.Join(root, dirs[rng.Intn(len(dirs))], fmt.Sprintf("d%d", i%7))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("small%d", i)), bytes.Repeat([]byte{byte(i)}, 1+rng.Intn(32<<10)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sparse := filepath.Join(root, "alloc/data/sparse")
	f, err := os.Create(sparse)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("end"), 1<<30)
	f.WriteAt(bytes.Repeat([]byte{1}, 1<<20), 1<<20)
	f.Close()
	if err := os.Link(filepath.Join(root, "alloc/data/big0"), filepath.Join(root, "alloc/data/link")); err != nil {
		t.Fatal(err)
	}
	unix.Sync()
	out, err := exec.Command("du", "-s", "--block-size=1", "--exclude=web/alloc", "--exclude=web/secrets", "--exclude=web/private", root).CombinedOutput()
	if err != nil {
		t.Fatalf("du: %v: %s", err, out)
	}
	du, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	u, ok, err := tm.store.Usage("a1")
	if err != nil || !ok {
		t.Fatalf("Usage: %v, %v", ok, err)
	}
	diff := math.Abs(float64(u.Bytes-du)) / float64(du)
	t.Logf("accounting %d bytes, du %d bytes: %.2f %% apart", u.Bytes, du, 100*diff)
	if diff > 0.01 {
		t.Fatalf("accounting %d bytes, du %d bytes: %.2f %% apart, want within 1 %%", u.Bytes, du, 100*diff)
	}
}

// TestProjectQuotaThroughTheMount: on a filesystem with project quotas,
// passthrough and daemon-served writes alike stop with EDQUOT at the
// allocation's limit, files at its inode limit, and df and df -i inside
// the allocation show both.
func TestProjectQuotaThroughTheMount(t *testing.T) {
	fstest.RequireFUSE(t)
	dir := fstest.ProjectQuotaDir(t)
	s := openTestStore(t, filepath.Join(dir, "data"), store.Options{Quotas: true})
	r := s.Quota()
	if r.Filesystem == "ext4" && strings.Contains(r.Why, "CAP_SYS_RESOURCE") {
		t.Skip("ext4 lets CAP_SYS_RESOURCE past project quotas, and this test has it: run it without (setpriv --bounding-set=-sys_resource)")
	}
	if r.Mechanism != "project quotas" {
		t.Fatalf("Quota() = %+v", r)
	}
	// xfs reports a project's limit as a full disk, ext4 as a quota.
	over := error(unix.EDQUOT)
	if r.Filesystem == "xfs" {
		over = unix.ENOSPC
	}
	mnt := mountTestStore(t, s, nil).dir
	const limit = 32 << 20
	if _, err := s.Create("a1", tasks("web"), store.CreateOptions{Limit: record.Limit{Bytes: limit, Inodes: 500}}); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(mnt, "a1", "alloc", "data")
	n, err := fstest.WriteUntil(filepath.Join(data, "dd"), 0o644, 2*limit)
	if !errors.Is(err, over) || n > limit || n < limit-4<<20 {
		t.Fatalf("passthrough write of twice the limit: %d bytes, %v; want EDQUOT near %d", n, err, limit)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(data, &sfs); err != nil {
		t.Fatal(err)
	}
	if got := int64(sfs.Blocks) * sfs.Frsize; got != limit || sfs.Files != 500 {
		t.Fatalf("df in the allocation: %d bytes, %d inodes; want %d and 500", got, sfs.Files, limit)
	}
	must(t, os.Remove(filepath.Join(data, "dd")))
	n, err = fstest.WriteUntil(filepath.Join(mnt, "a1", "web", "local", "suid"), 0o4755, 2*limit)
	if !errors.Is(err, over) || n > limit || n < limit-4<<20 {
		t.Fatalf("daemon-served write of twice the limit: %d bytes, %v; want EDQUOT near %d", n, err, limit)
	}
	must(t, os.Remove(filepath.Join(mnt, "a1", "web", "local", "suid")))
	made := 0
	for ; made < 1000; made++ {
		if err := os.WriteFile(filepath.Join(mnt, "a1", "alloc", "tmp", strconv.Itoa(made)), nil, 0o644); err != nil {
			if !errors.Is(err, over) {
				t.Fatalf("file %d: %v, want EDQUOT", made, err)
			}
			break
		}
	}
	if made >= 500 || made < 400 {
		t.Fatalf("%d files made under an inode limit of 500", made)
	}
}

// TestQuotaCountsTheAllocationsOwnDirectories: what a task writes into
// alloc/ or the allocation's own directory, outside every volume of the
// layout, counts against the allocation's limit as its data does.
func TestQuotaCountsTheAllocationsOwnDirectories(t *testing.T) {
	tm := newQuotaMount(t)
	const limit = 16 << 20
	if _, err := tm.store.Create("a1", tasks("web"), store.CreateOptions{Limit: record.Limit{Bytes: limit}}); err != nil {
		t.Fatal(err)
	}
	must(t, os.Mkdir(filepath.Join(tm.dir, "a1", "alloc", "container"), 0o711))
	for _, p := range []string{filepath.Join(tm.dir, "a1", "alloc", "container", "state"), filepath.Join(tm.dir, "a1", "ready")} {
		n, err := fstest.WriteUntil(p, 0o644, 2*limit)
		if !errors.Is(err, unix.EDQUOT) || n > limit || n < limit-4<<20 {
			t.Errorf("%s: wrote %d bytes under a limit of %d, then %v; want EDQUOT near the limit", p, n, limit, err)
		}
		must(t, os.Remove(p))
		unix.Sync()
	}
}
