#!/bin/bash
# scale.sh measures allocfs at scale (issue 11, docs/benchmarks.md
# "Scale"): a separate `allocfs serve`, SCALE_ALLOCS allocations of 3 tasks
# each, cold lstat latency of 10,000 files with one allocation and with all
# of them, then a cold and a warm `find` over SCALE_DIRS x SCALE_FILES
# empty files in one volume, against the same `find` on the volume's
# backing directory. It prints the daemon's resident memory (VmRSS) and
# peak (VmHWM) after each step. Needs root, /dev/fuse and python3; drops
# the page cache. Everything it makes lives under one temporary directory,
# removed at the end.
set -euo pipefail

BIN=${ALLOCFS_BIN:-$PWD/bin/allocfs}
ALLOCS=${SCALE_ALLOCS:-1000}
DIRS=${SCALE_DIRS:-1000}
FILES=${SCALE_FILES:-1000}
BASE=$(mktemp -d "${SCALE_TMP:-/tmp}/allocfs-scale.XXXXXX")
DATA=$BASE/data MNT=$BASE/mnt SOCK=$BASE/allocfs.sock
mkdir -p "$MNT"
PID=

cleanup() {
	if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
		kill -TERM "$PID"
		for _ in $(seq 100); do kill -0 "$PID" 2>/dev/null || break; sleep 0.1; done
		kill -0 "$PID" 2>/dev/null && kill -KILL "$PID"
	fi
	if grep -q " $MNT " /proc/mounts; then umount "$MNT" 2>/dev/null || umount -l "$MNT"; fi
	rm -rf "$BASE"
}
trap cleanup EXIT

cli() { "$BIN" "$@" --socket "$SOCK"; }
mem() { printf '%-44s VmRSS %6d KiB  VmHWM %6d KiB\n' "$1" \
	"$(awk '/^VmRSS/ {print $2}' /proc/$PID/status)" "$(awk '/^VmHWM/ {print $2}' /proc/$PID/status)"; }
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; sleep 1; }
# secs CMD... runs CMD, its output discarded, and prints its wall time.
secs() { local s e; s=$(date +%s.%N); "$@" > /dev/null; e=$(date +%s.%N); echo "$e - $s" | bc; }
layer_of() { cli alloc status "$1" | awk -v p="$MNT/$1/$2" '$1 == p && $2 == "layer" {print $3}'; }
# statrate DIR lstats DIR/f00000..f09999 by path (one LOOKUP each when cold).
statrate() {
	python3 - "$1" <<'PY'
import os, sys, time
d = sys.argv[1]
names = [d + '/f%05d' % i for i in range(10000)]
t = time.time()
for n in names: os.lstat(n)
print('%.0f' % (10000 / (time.time() - t)))
PY
}

"$BIN" serve --data-dir "$DATA" --mount "$MNT" --socket "$SOCK" > "$BASE/serve.log" 2>&1 &
PID=$!
for _ in $(seq 100); do [ -S "$SOCK" ] && grep -q " $MNT " /proc/mounts && break; sleep 0.1; done
echo "allocfs $("$BIN" version | head -1), pid $PID, data dir $DATA"
mem "mounted, no allocation"

tasks="--task web --task sidecar --task log"
cli alloc create a00000 $tasks > /dev/null
l=$(layer_of a00000 alloc/data)
mkdir "$DATA/layers/$l/stat"
(cd "$DATA/layers/$l/stat" && python3 -c "
for i in range(10000): open('f%05d' % i, 'w').close()")
mem "1 allocation"
for i in 1 2 3; do cold; echo "cold lstat, 1 allocation: $(statrate "$MNT/a00000/alloc/data/stat") stats/s"; done

start=$(date +%s.%N)
for i in $(seq 1 $((ALLOCS - 1))); do cli alloc create "$(printf 'a%05d' "$i")" $tasks > /dev/null; done
echo "created $((ALLOCS - 1)) more allocations in $(echo "$(date +%s.%N) - $start" | bc) s"
mem "$ALLOCS allocations x 3 tasks"
for i in 1 2 3; do cold; echo "cold lstat, $ALLOCS allocations: $(statrate "$MNT/a00000/alloc/data/stat") stats/s"; done

l=$(layer_of a00001 alloc/data)
tree=$DATA/layers/$l/tree
mkdir "$tree"
python3 - "$tree" "$DIRS" "$FILES" <<'PY'
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    p = os.path.join(root, 'd%04d' % d)
    os.mkdir(p)
    for f in range(files):
        os.close(os.open(os.path.join(p, 'f%04d' % f), os.O_CREAT | os.O_WRONLY, 0o644))
PY
echo "$((DIRS * FILES)) files in $MNT/a00001/alloc/data/tree"
for i in 1 2; do
	cold; echo "find, cold, mount:  $(secs find "$MNT/a00001/alloc/data/tree") s"; mem "  after a cold find"
	echo "find, warm, mount:  $(secs find "$MNT/a00001/alloc/data/tree") s"; mem "  after a warm find"
	cold; echo "find, cold, native: $(secs find "$tree") s"
	echo "find, warm, native: $(secs find "$tree") s"
done
cold; sleep 2; mem "after drop_caches (the kernel forgot its inodes)"
