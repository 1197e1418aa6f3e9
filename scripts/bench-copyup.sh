#!/bin/sh
# bench-copyup.sh measures what a copy-up costs a task: the time of the
# first write to a file that a snapshot migration left in a lower layer,
# against the same write once the file is copied up and against a plain
# file on the same filesystem (docs/benchmarks.md, "Copy-up cost").
#
# For each backing filesystem and round it makes a fresh filesystem, starts
# the real `allocfs serve` with its data dir there, creates allocation A,
# writes through the mount a 1 GiB file with every block written ("dense")
# and a 1 GiB file holding 16 MiB of data in 1 MiB pieces ("sparse"), stops
# A and creates B from A with --migrate-mode snapshot. Then, per file, with
# the page cache dropped first, it times open(O_WRONLY) + a 1-byte pwrite +
# close in B: allocfs copies the file up inside that open. The backing
# filesystems:
#
#   ext4-host   a directory on the machine's own TMPDIR filesystem, no loop
#               device (the filesystem allocfs normally runs on here; it
#               is shared with whatever else runs, so it is the noisiest)
#   ext4-loop   a fresh ext4 image on a loop device: no FICLONE, so the
#               copy-up copies the data (copy_file_range between holes)
#   xfs-loop    a fresh xfs image made with reflink=1: FICLONE shares the
#               extents and the copy-up writes metadata only
#   btrfs-loop  a fresh btrfs image: FICLONE, as on xfs
#
# Every round starts from a fresh filesystem so that no round inherits the
# previous one's fragmentation or free-space layout, and the filesystems
# take turns within a round so that a slow period of the shared disk does
# not land on one of them only. Loop devices use direct I/O where the kernel
# allows it, so that their reads reach the disk instead of being served
# from the page cache of the image file.
#
# Needs root (loop devices, mount, drop_caches), /dev/fuse, python3 (the
# timing helper, bench-copyup.py), filefrag, and mkfs.ext4, mkfs.xfs,
# mkfs.btrfs for the loop filesystems (a filesystem whose mkfs is missing is
# skipped with a message). With strace installed, each round also records
# which call copied an untimed probe file up: FICLONE, or copy_file_range
# after FICLONE failed. Writes 3 to /proc/sys/vm/drop_caches, which
# empties the whole machine's page cache, several times per round.
#
# Settings (environment):
#   COPYUP_FS           filesystems to measure (default "ext4-host ext4-loop xfs-loop btrfs-loop")
#   COPYUP_ROUNDS       rounds (default 3)
#   COPYUP_SIZE_MIB     size of both files in MiB (default 1024)
#   COPYUP_SPARSE_MIB   data in the sparse file, in 1 MiB pieces (default 16)
#   COPYUP_OUT          raw results, one "fs round file metric value" a line (default bin/copyup.txt)
#   ALLOCFS_BIN         the allocfs binary (default: built from this checkout into the work dir)
#   TMPDIR              where the work dir, the images and ext4-host live (default /tmp)
set -eu

FSLIST=${COPYUP_FS:-"ext4-host ext4-loop xfs-loop btrfs-loop"}
ROUNDS=${COPYUP_ROUNDS:-3}
SIZE_MIB=${COPYUP_SIZE_MIB:-1024}
SPARSE_MIB=${COPYUP_SPARSE_MIB:-16}
OUT=${COPYUP_OUT:-bin/copyup.txt}

REPO=$(cd "$(dirname "$0")/.." && pwd)
HELPER="$REPO/scripts/bench-copyup.py"

# State that cleanup undoes; each is set right after the thing exists.
WORK=""
DAEMON_PID=""
STRACE_PID=""
FUSE_MNT=""
FS_MNT=""
LOOPDEV=""

log() { printf '%s\n' "$*" >&2; }
die() { log "bench-copyup: $*"; exit 1; }

is_mounted() { awk -v m="$1" '$2 == m { found = 1 } END { exit !found }' /proc/self/mounts; }

# stop_daemon ends the daemon this script started (by its PID, never by
# name): SIGTERM detaches the mount; SIGKILL after 20 s if it hangs, and
# then the mount is detached here.
stop_daemon() {
	if [ -n "$STRACE_PID" ]; then
		kill -TERM "$STRACE_PID" 2>/dev/null || true
		wait "$STRACE_PID" 2>/dev/null || true
		STRACE_PID=""
	fi
	if [ -n "$DAEMON_PID" ]; then
		kill -TERM "$DAEMON_PID" 2>/dev/null || true
		i=0
		while kill -0 "$DAEMON_PID" 2>/dev/null && [ $i -lt 200 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		if kill -0 "$DAEMON_PID" 2>/dev/null; then
			log "bench-copyup: daemon $DAEMON_PID ignored SIGTERM for 20 s: killing it"
			kill -KILL "$DAEMON_PID" 2>/dev/null || true
		fi
		wait "$DAEMON_PID" 2>/dev/null || true
		DAEMON_PID=""
	fi
	if [ -n "$FUSE_MNT" ] && is_mounted "$FUSE_MNT"; then
		umount "$FUSE_MNT" 2>/dev/null || umount -l "$FUSE_MNT" || log "bench-copyup: cannot unmount $FUSE_MNT"
	fi
	FUSE_MNT=""
}

# teardown_backing unmounts the filesystem under test and detaches its
# loop device.
teardown_backing() {
	if [ -n "$FS_MNT" ]; then
		umount "$FS_MNT" || umount -l "$FS_MNT" || log "bench-copyup: cannot unmount $FS_MNT"
		FS_MNT=""
	fi
	if [ -n "$LOOPDEV" ]; then
		losetup -d "$LOOPDEV" || log "bench-copyup: cannot detach $LOOPDEV"
		LOOPDEV=""
	fi
	if [ -n "$WORK" ]; then
		rm -rf "$WORK/host" "$WORK/image"
	fi
}

# cleanup runs on every exit, normal or not: it keeps going past a failing
# step so that one stuck mount does not leave the rest behind.
cleanup() {
	rc=$?
	set +e
	if [ $rc -ne 0 ] && [ -s "$WORK/serve.log" ]; then
		log "bench-copyup: failed; the end of the daemon's log:"
		tail -n 20 "$WORK/serve.log" >&2
	fi
	stop_daemon
	teardown_backing
	if [ -n "$WORK" ]; then
		rm -rf "$WORK"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

[ "$(id -u)" -eq 0 ] || die "needs root (loop devices, mounts, drop_caches)"
[ -c /dev/fuse ] || die "needs /dev/fuse"
command -v python3 >/dev/null || die "needs python3 (the timing helper)"
command -v filefrag >/dev/null || die "needs filefrag (e2fsprogs) to see shared extents"
[ $((SIZE_MIB % SPARSE_MIB)) -eq 0 ] || die "COPYUP_SIZE_MIB must be a multiple of COPYUP_SPARSE_MIB"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-copyup.XXXXXX")
mkdir -p "$(dirname "$OUT")"
: >"$OUT"

if [ -n "${ALLOCFS_BIN:-}" ]; then
	ALLOCFS=$ALLOCFS_BIN
else
	ALLOCFS="$WORK/allocfs"
	(cd "$REPO" && go build -o "$ALLOCFS" ./cmd/allocfs)
fi
export ALLOCFS_SOCKET="$WORK/allocfs.sock"

# drop_caches LEVEL: 3 drops the page cache and the dentries and inodes
# (every lookup through the mount goes to the daemon again), 1 only the
# page cache (file data must come from the disk; names stay resolved).
drop_caches() {
	sync
	echo "$1" >/proc/sys/vm/drop_caches
}

now_ns() { date +%s%N; }

df_used_kib() { df -k --output=used "$1" | tail -n 1 | tr -d ' '; }

du_kib() { du -k "$1" | cut -f 1; }

record() { # fs round file metric value
	printf '%s %s %s %s %s\n' "$1" "$2" "$3" "$4" "$5" >>"$OUT"
}

# extents FILE prints "shared total": how many of FILE's extents (filefrag
# -v, i.e. FIEMAP) carry the shared flag, which a clone leaves and a copy
# does not.
extents() {
	filefrag -v "$1" | awk '
		$1 ~ /^[0-9]+:$/ { total++; if ($0 ~ /shared/) shared++ }
		END { printf "%d %d\n", shared, total }'
}

# setup_backing FS makes a fresh filesystem of kind FS and sets BASE to a
# directory on it.
setup_backing() {
	case $1 in
	ext4-host)
		BASE="$WORK/host"
		mkdir -p "$BASE"
		return
		;;
	ext4-loop) mkfs="mkfs.ext4 -q -F" ;;
	xfs-loop) mkfs="mkfs.xfs -q -f -m reflink=1" ;;
	btrfs-loop) mkfs="mkfs.btrfs -q -f" ;;
	*) die "unknown filesystem $1 (want ext4-host, ext4-loop, xfs-loop or btrfs-loop)" ;;
	esac
	# Room for the four lower files, their full copies (ext4) and the
	# native files.
	truncate -s $((SIZE_MIB * 6 + 1024))M "$WORK/image"
	LOOPDEV=$(losetup --find --show --direct-io=on "$WORK/image" 2>/dev/null ||
		losetup --find --show "$WORK/image")
	$mkfs "$LOOPDEV" >/dev/null
	mkdir -p "$WORK/fs"
	mount "$LOOPDEV" "$WORK/fs"
	FS_MNT="$WORK/fs"
	BASE="$WORK/fs"
}

start_daemon() {
	mkdir -p "$WORK/mnt"
	# The collector is switched off: a nearly full image must not make it
	# collect A, whose layers B stands on, in the middle of a round.
	"$ALLOCFS" serve --data-dir "$BASE/data" --mount "$WORK/mnt" --socket "$ALLOCFS_SOCKET" \
		--gc-disk-usage-threshold 0 --gc-inode-usage-threshold 0 --gc-max-allocs 0 \
		>>"$WORK/serve.log" 2>&1 &
	DAEMON_PID=$!
	FUSE_MNT="$WORK/mnt"
	i=0
	until "$ALLOCFS" status >/dev/null 2>&1; do
		kill -0 "$DAEMON_PID" 2>/dev/null || die "allocfs serve exited"
		[ $i -lt 200 ] || die "allocfs serve not answering after 20 s"
		sleep 0.1
		i=$((i + 1))
	done
}

# fill_dense PATH writes a file with every byte written (zeros: none of
# these filesystems compresses or deduplicates by default).
fill_dense() {
	dd if=/dev/zero of="$1" bs=1M count="$SIZE_MIB" conv=fsync status=none
}

# fill_sparse PATH writes SPARSE_MIB pieces of 1 MiB spread evenly over
# SIZE_MIB, so that a copy has holes to skip.
fill_sparse() {
	truncate -s "${SIZE_MIB}M" "$1"
	step=$((SIZE_MIB / SPARSE_MIB))
	i=0
	while [ $i -lt "$SPARSE_MIB" ]; do
		dd if=/dev/zero of="$1" bs=1M count=1 seek=$((i * step)) conv=notrunc status=none
		i=$((i + 1))
	done
	sync -f "$1"
}

# timed_write FS ROUND FILE PREFIX PATH records the helper's open, write
# and close times of one 1-byte write to PATH.
timed_write() {
	# Assigned first: a failure inside "set -- $(...)" would not stop set -e.
	times=$(python3 "$HELPER" write "$5")
	set -- "$1" "$2" "$3" "$4" $times
	record "$1" "$2" "$3" "${4}_open_ns" "$5"
	record "$1" "$2" "$3" "${4}_total_ns" $(($5 + $6 + $7))
}

# probe_copy_call FS ROUND copies the untimed file "probe" up with strace
# watching the daemon, and records whether FICLONE did it (1) or the
# daemon fell back to copying (0). Shared extents alone cannot tell:
# copy_file_range clones too on xfs and btrfs.
probe_copy_call() {
	command -v strace >/dev/null || return 0
	strace -f -qq -e trace=ioctl,copy_file_range -o "$WORK/strace.out" -p "$DAEMON_PID" &
	STRACE_PID=$!
	sleep 1 # strace has no "attached" signal; a second is ample
	python3 "$HELPER" write "$WORK/mnt/B/alloc/data/probe" >/dev/null
	kill -TERM "$STRACE_PID"
	wait "$STRACE_PID" 2>/dev/null || true # no "Terminated" from the shell
	STRACE_PID=""
	if grep -q 'FICLONE.* = 0$' "$WORK/strace.out"; then
		record "$1" "$2" probe ficlone 1
	elif grep -q 'copy_file_range(' "$WORK/strace.out"; then
		record "$1" "$2" probe ficlone 0
	else
		log "bench-copyup: strace saw neither FICLONE nor copy_file_range in the copy-up of probe"
	fi
}

# measure FS ROUND runs one round on the filesystem set up at BASE.
measure() {
	fs=$1
	round=$2
	# Each shape is written twice into A, because a file is copied up
	# only once: "dense" and "sparse" for the cold first write,
	# "dense.2" and "sparse.2" for the first write with names resolved.
	"$ALLOCFS" alloc create A --task t >/dev/null
	for f in dense dense.2; do fill_dense "$WORK/mnt/A/alloc/data/$f"; done
	for f in sparse sparse.2; do fill_sparse "$WORK/mnt/A/alloc/data/$f"; done
	dd if=/dev/zero of="$WORK/mnt/A/alloc/data/probe" bs=1M count=1 status=none
	mkdir -p "$BASE/native"
	fill_dense "$BASE/native/dense"
	fill_sparse "$BASE/native/sparse"
	"$ALLOCFS" alloc stop A >/dev/null
	"$ALLOCFS" alloc create B --task t --previous A --migrate --migrate-mode snapshot >/dev/null
	layers=$("$ALLOCFS" alloc status B --json | python3 -c '
import json, sys
v = json.load(sys.stdin)["volumes"]["alloc/data"]
print(v["upper"], v["lowers"][0])')
	set -- $layers
	upper="$BASE/data/layers/$1"
	lower="$BASE/data/layers/$2"
	[ -f "$lower/dense" ] || die "no lower copy of dense at $lower: has the store layout changed?"

	for file in dense sparse; do
		b="$WORK/mnt/B/alloc/data"

		# Cold: what a task that has not touched the file since the
		# node's caches were emptied waits for.
		drop_caches 3
		before=$(df_used_kib "$BASE")
		timed_write "$fs" "$round" "$file" first "$b/$file"
		[ -f "$upper/$file" ] || die "the first write did not copy $file up to $upper"
		# The copy-up leaves its data dirty in the page cache (ext4):
		# the disk writes it later, and this is how long that takes.
		t0=$(now_ns)
		sync -f "$BASE"
		record "$fs" "$round" "$file" sync_ns $(($(now_ns) - t0))
		record "$fs" "$round" "$file" df_delta_kib $(($(df_used_kib "$BASE") - before))
		timed_write "$fs" "$round" "$file" second "$b/$file"

		record "$fs" "$round" "$file" lower_du_kib "$(du_kib "$lower/$file")"
		record "$fs" "$round" "$file" upper_du_kib "$(du_kib "$upper/$file")"
		ext=$(extents "$upper/$file")
		set -- $ext
		record "$fs" "$round" "$file" upper_shared_extents "$1"
		record "$fs" "$round" "$file" upper_extents "$2"

		# Names resolved, data cold: the path is looked up (stat)
		# before only the page cache is dropped, which leaves what the
		# copy itself costs, without the cold FUSE lookups.
		stat "$b/$file.2" >/dev/null
		drop_caches 1
		timed_write "$fs" "$round" "$file" first_cached "$b/$file.2"
		[ -f "$upper/$file.2" ] || die "the first write did not copy $file.2 up to $upper"
		sync -f "$BASE"

		# The same writes to a plain file beside the data dir.
		drop_caches 3
		timed_write "$fs" "$round" "$file" native_first "$BASE/native/$file"
		stat "$BASE/native/$file" >/dev/null
		drop_caches 1
		timed_write "$fs" "$round" "$file" native_first_cached "$BASE/native/$file"
		timed_write "$fs" "$round" "$file" native_second "$BASE/native/$file"
	done

	probe_copy_call "$fs" "$round"

	# What copying 1 GiB cannot beat on this disk: reading it cold.
	drop_caches 3
	t0=$(now_ns)
	dd if="$BASE/native/dense" of=/dev/null bs=1M status=none
	record "$fs" "$round" dense native_cold_read_ns $(($(now_ns) - t0))
}

log "bench-copyup: $ROUNDS rounds of: $FSLIST; files of $SIZE_MIB MiB (sparse: $SPARSE_MIB MiB of data)"
log "bench-copyup: $(uname -r), commit $(cd "$REPO" && git rev-parse --short HEAD 2>/dev/null || echo unknown), work dir $WORK"
round=1
while [ $round -le "$ROUNDS" ]; do
	for fs in $FSLIST; do
		case $fs in
		*-loop)
			tool=mkfs.${fs%-loop}
			if ! command -v "$tool" >/dev/null; then
				log "bench-copyup: skipping $fs: no $tool"
				continue
			fi
			;;
		esac
		log "bench-copyup: round $round: $fs"
		setup_backing "$fs"
		if [ -n "$LOOPDEV" ]; then
			dio=$(cat "/sys/block/${LOOPDEV#/dev/}/loop/dio" 2>/dev/null || echo '?')
			log "bench-copyup:   $LOOPDEV, direct I/O $dio, $(findmnt -n -o FSTYPE,OPTIONS "$FS_MNT")"
		fi
		start_daemon
		measure "$fs" "$round"
		stop_daemon
		teardown_backing
	done
	round=$((round + 1))
done

log "bench-copyup: raw results in $OUT"
python3 "$HELPER" table "$OUT"
