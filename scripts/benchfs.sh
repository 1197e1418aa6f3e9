#!/usr/bin/env bash
# benchfs.sh CMD [ARG...] runs CMD with ALLOCFS_BENCH_DIR on a fresh ext4
# filesystem (mkfs.ext4's defaults, journal included) on a loop device,
# and removes it afterwards. Every side of `make bench` (native, the mount,
# the peers) then starts on the same empty filesystem in every run.
#
# Why not the directory the machine gives: how fast ext4 creates a file
# depends on the filesystem's past. Without a journal (this project's CI
# machines' root filesystem has none), ext4 skips the inodes freed in the
# last 60 to 300 seconds when it allocates one, reading their inode tables
# to find out, so a side that creates files where another side, or an
# earlier benchmark, removed thousands pays for that removal: the same
# create workload measured 16k and 87k files/s natively on one machine in
# one run. A fresh image with a journal is what a client node's disk
# looks like, and is the same for every side.
#
# BENCH_IMG_SIZE sets the image's (sparse) size; BENCH_IMG_DIR where it is
# kept (default /var/tmp). Needs root, loop devices and e2fsprogs.
set -euo pipefail
size=${BENCH_IMG_SIZE:-24G}
work=$(mktemp -d "${BENCH_IMG_DIR:-/var/tmp}/allocfs-benchfs.XXXXXX")
cleanup() {
	if mountpoint -q "$work/mnt"; then
		umount "$work/mnt" || umount -l "$work/mnt" || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
# An interrupted run removes its image too: bash runs the EXIT trap on an
# exit, not on a death by signal.
trap 'exit 130' INT
trap 'exit 143' TERM
truncate -s "$size" "$work/ext4.img"
mkfs.ext4 -q -F "$work/ext4.img"
mkdir "$work/mnt"
mount -o loop "$work/ext4.img" "$work/mnt"
echo "benchfs: fresh ext4 ($size, journal) at $work/mnt" >&2
ALLOCFS_BENCH_DIR="$work/mnt" "$@"
