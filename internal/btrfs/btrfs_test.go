package btrfs_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/allocfs/allocfs/fs/fstest"
	"github.com/allocfs/allocfs/internal/btrfs"
	"golang.org/x/sys/unix"
)

// TestQgroupLimitsASubvolumeGroup runs the store's use of qgroups on a
// real btrfs: two subvolumes in a level-1 qgroup with a limit share it,
// a third outside writes on, and moving a member between groups moves
// its usage.
func TestQgroupLimitsASubvolumeGroup(t *testing.T) {
	mnt := fstest.Image(t, "btrfs", 300, "")
	if ok, err := btrfs.Is(mnt); err != nil || !ok {
		t.Fatalf("Is(%s) = %v, %v", mnt, ok, err)
	}
	if err := btrfs.EnableQuotas(mnt); err != nil {
		t.Fatal(err)
	}
	if err := btrfs.EnableQuotas(mnt); err != nil {
		t.Fatalf("enabling twice: %v", err)
	}
	fsid, err := btrfs.FSID(mnt)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, name := range []string{"a", "b", "c"} {
		p := filepath.Join(mnt, name)
		if err := btrfs.CreateSubvolume(p); err != nil {
			t.Fatal(err)
		}
		if ok, err := btrfs.IsSubvolume(p); err != nil || !ok {
			t.Fatalf("IsSubvolume(%s) = %v, %v", p, ok, err)
		}
		id, err := btrfs.SubvolumeID(p)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := btrfs.CreateSubvolume(filepath.Join(mnt, "a")); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("creating a subvolume over a name: %v, want EEXIST", err)
	}
	group := btrfs.Qgroup(1, 2000001)
	if err := btrfs.CreateQgroup(mnt, group); err != nil {
		t.Fatal(err)
	}
	if err := btrfs.CreateQgroup(mnt, group); err != nil {
		t.Fatalf("creating twice: %v", err)
	}
	for _, id := range ids[:2] {
		if _, err := btrfs.Assign(mnt, btrfs.Qgroup(0, id), group, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := btrfs.Assign(mnt, btrfs.Qgroup(0, ids[0]), group, true); err != nil {
		t.Fatalf("assigning twice: %v", err)
	}
	rel, err := btrfs.Relations(mnt)
	if err != nil {
		t.Fatal(err)
	}
	if len(rel[btrfs.Qgroup(0, ids[0])]) != 1 || rel[btrfs.Qgroup(0, ids[0])][0] != group || len(rel[btrfs.Qgroup(0, ids[2])]) != 0 {
		t.Fatalf("relations = %v", rel)
	}
	const limit = 20 << 20
	if err := btrfs.Limit(mnt, group, limit); err != nil {
		t.Fatal(err)
	}
	n1, err := fstest.WriteUntil(filepath.Join(mnt, "a", "f"), 0o644, 12<<20)
	if err != nil {
		t.Fatalf("12 MiB into a: %v", err)
	}
	n2, err := fstest.WriteUntil(filepath.Join(mnt, "b", "f"), 0o644, 12<<20)
	if !errors.Is(err, unix.EDQUOT) {
		t.Fatalf("12 MiB more into b of a 20 MiB group: %d bytes, %v; want EDQUOT", n2, err)
	}
	if n1+n2 > limit {
		t.Fatalf("wrote %d bytes into a 20 MiB group", n1+n2)
	}
	if _, err := fstest.WriteUntil(filepath.Join(mnt, "c", "f"), 0o644, 30<<20); err != nil {
		t.Fatalf("the subvolume outside the group: %v", err)
	}
	if err := exec.Command("sync").Run(); err != nil {
		t.Fatal(err)
	}
	u, err := btrfs.ReadUsage(fsid, group)
	if err != nil {
		t.Fatal(err)
	}
	if u.MaxReferenced != limit || u.Bytes() < uint64(n1) || u.Bytes() > limit {
		t.Fatalf("usage %+v after %d+%d bytes", u, n1, n2)
	}
	// Moving b out of the group frees its bytes from the group's count.
	if _, err := btrfs.Assign(mnt, btrfs.Qgroup(0, ids[1]), group, false); err != nil {
		t.Fatal(err)
	}
	if inc, err := btrfs.Inconsistent(mnt); err != nil || inc {
		t.Fatalf("inconsistent after moving an unshared member: %v, %v", inc, err)
	}
	after, err := btrfs.ReadUsage(fsid, group)
	if err != nil {
		t.Fatal(err)
	}
	if after.Referenced >= u.Referenced {
		t.Fatalf("usage %d before and %d after moving b out", u.Referenced, after.Referenced)
	}
	if err := btrfs.DestroyQgroup(mnt, group); !errors.Is(err, unix.EBUSY) {
		t.Logf("destroying a group with a member: %v", err)
	}
	if _, err := btrfs.Assign(mnt, btrfs.Qgroup(0, ids[0]), group, false); err != nil {
		t.Fatal(err)
	}
	if err := btrfs.DestroyQgroup(mnt, group); err != nil {
		t.Fatal(err)
	}
	if err := btrfs.DestroyQgroup(mnt, group); err != nil {
		t.Fatalf("destroying twice: %v", err)
	}
	if err := btrfs.Rescan(mnt); err != nil {
		t.Fatal(err)
	}
	// A removed subvolume is an empty directory removed.
	if err := os.RemoveAll(filepath.Join(mnt, "c")); err != nil {
		t.Fatalf("removing a subvolume as a tree: %v", err)
	}
}

func TestNotBtrfs(t *testing.T) {
	dir := t.TempDir()
	if ok, err := btrfs.Is(dir); err != nil || ok {
		t.Skipf("the temporary directory is on btrfs (%v)", err)
	}
	if err := btrfs.CreateSubvolume(filepath.Join(dir, "x")); err == nil {
		t.Fatal("a subvolume on a filesystem that is not btrfs")
	}
	if _, err := btrfs.FSID(dir); err == nil {
		t.Fatal("a btrfs fsid of a filesystem that is not btrfs")
	}
}
