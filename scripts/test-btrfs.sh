#!/usr/bin/env bash
# Runs the tree's tests (package fs and below; BTRFS_PKGS others) with
# every store on a btrfs image with disk limits on
# (ALLOCFS_TEST_DATA_FS=btrfs, which every test's store honours through
# storetest.Open): layers are subvolumes and inode numbers carry layer
# tags. BTRFS_TESTFLAGS adds flags to go test: with -v each test says what
# its stores' layers are on. Needs root, loop devices and btrfs-progs.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
work=$(mktemp -d /tmp/allocfs-test-btrfs.XXXXXX)
cleanup() {
	umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
truncate -s 6G "$work/btrfs.img"
mkfs.btrfs -q -f "$work/btrfs.img"
mkdir "$work/mnt"
chmod 0755 "$work"
mount -o loop "$work/btrfs.img" "$work/mnt"
chmod 0755 "$work" "$work/mnt"
mkdir -m 1777 "$work/mnt/tmp"
TMPDIR="$work/mnt/tmp" ALLOCFS_TEST_DATA_FS=btrfs $GO test -race -count=1 -timeout "${TEST_TIMEOUT:-10m}" ${BTRFS_TESTFLAGS:-} ${BTRFS_PKGS:-./fs/...}
