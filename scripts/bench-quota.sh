#!/usr/bin/env bash
# dd of 1 GiB (conv=fsync), 6 rounds in rotated order, on btrfs images: plain btrfs without quotas,
# btrfs with qgroups into a limited subvolume (native), and through allocfs serve --enable-quotas.
set -e
B=$(mktemp -d /tmp/allocfs-bench-quota.XXXXXX)
ALLOCFS=${ALLOCFS_BIN:-$PWD/bin/allocfs}
cleanup() { kill $(cat $B/pid 2>/dev/null) 2>/dev/null || true; sleep 1; umount -l $B/q/data/mnt 2>/dev/null || true; umount $B/q 2>/dev/null || true; umount $B/p 2>/dev/null || true; }
trap "cleanup; rm -rf $B" EXIT
for k in p q; do rm -f $B/$k.img; truncate -s 8G $B/$k.img; mkfs.btrfs -q -f $B/$k.img; mkdir -p $B/$k; mount -o loop $B/$k.img $B/$k; done
mkdir $B/p/native
btrfs quota enable $B/q
btrfs subvolume create $B/q/native >/dev/null
btrfs qgroup create 1/100 $B/q; btrfs qgroup assign 0/$(btrfs subvolume show $B/q/native | awk '/Subvolume ID/{print $3}') 1/100 $B/q 2>/dev/null || true
btrfs qgroup limit 4G 1/100 $B/q
$ALLOCFS serve --data-dir $B/q/data --enable-quotas --live-restart=false > $B/serve.log 2>&1 & echo $! > $B/pid
for i in $(seq 50); do [ -S $B/q/data/allocfs.sock ] && break; sleep 0.2; done
ALLOCFS_SOCKET=$B/q/data/allocfs.sock $ALLOCFS alloc create --task web --disk-mb 4096 bench >/dev/null
M=$B/q/data/mnt/bench/alloc/data
for r in 1 2 3 4 5 6; do
  sides=("plain:$B/p/native" "qgroup:$B/q/native" "allocfs:$M"); o=$((r % 3)); for side in "${sides[@]:$o}" "${sides[@]:0:$o}"; do
    name=${side%%:*}; dir=${side#*:}
    rm -f $dir/f; sync; echo 3 > /proc/sys/vm/drop_caches
    s=$(date +%s.%N); dd if=/dev/zero of=$dir/f bs=1M count=1024 conv=fsync status=none; e=$(date +%s.%N)
    echo "round $r $name $(echo "1024/($e-$s)" | bc -l | cut -c1-7) MiB/s"
  done
done
