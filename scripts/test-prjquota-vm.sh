#!/usr/bin/env bash
# Runs the project-quota tests where a kernel has project quotas: this
# machine's kernel (6.18) is built without CONFIG_XFS_QUOTA and
# CONFIG_QFMT_V2, so they run in a VM (qemu, software emulation) booting
# Debian's packaged kernel, with an xfs disk mounted -o prjquota and an
# ext4 disk made -O quota,project mounted -o prjquota. On xfs the tests run
# as root; on ext4 without CAP_SYS_RESOURCE (dropcap), which ext4 lets
# past project limits, and once as root to see the store refuse it.
#
# Needs root, qemu-system-x86, cpio, xfsprogs, e2fsprogs and Debian's
# package archive (apt-get download: the kernel and busybox-static).
# KERNEL_PKG names the kernel package (default: the newest
# linux-image-6.1.0-N-amd64 the archive has).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
work=$(mktemp -d /tmp/allocfs-prjquota-vm.XXXXXX)
trap 'rm -rf "$work"' EXIT

pkg=${KERNEL_PKG:-$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -1)}
if [ -z "$pkg" ]; then
	echo "no linux-image-6.1.0-N-amd64 package in the archive: set KERNEL_PKG" >&2
	exit 1
fi
(cd "$work" && apt-get download -qq "$pkg" busybox-static 2>/dev/null)
dpkg -x "$work"/linux-image-*.deb "$work/kern"
dpkg -x "$work"/busybox-static*.deb "$work/bb"
kver=$(ls "$work/kern/lib/modules")
root="$work/root"
mkdir -p "$root"/{bin,lib/modules,proc,sys,dev,tmp,etc,tests}
cp "$work/bb/bin/busybox" "$root/bin/"

# The modules the VM loads, dependencies first, read from each module's
# depends= (the package holds no modules.dep until depmod runs).
python3 - "$work/kern/lib/modules/$kver" "$root" <<'PY'
import os, re, shutil, sys
mods, root = sys.argv[1], sys.argv[2]
index = {}
for d, _, files in os.walk(mods):
    for f in files:
        if f.endswith(".ko"):
            index[f[:-3].replace("-", "_")] = os.path.join(d, f)
seen, order = set(), []
def resolve(m):
    m = m.replace("-", "_")
    if m in seen:
        return
    seen.add(m)
    p = index[m]
    dep = re.search(rb"depends=([^\x00]*)\x00", open(p, "rb").read())
    for d in (dep.group(1).decode().split(",") if dep else []):
        if d:
            resolve(d)
    order.append(p)
for m in ["virtio_pci", "virtio_blk", "crc32c_generic", "libcrc32c", "xfs", "ext4", "quota_v2", "fuse"]:
    resolve(m)
with open(os.path.join(root, "modlist"), "w") as out:
    for p in order:
        shutil.copy(p, os.path.join(root, "lib/modules"))
        out.write(os.path.basename(p) + "\n")
PY

export CGO_ENABLED=0
$GO test -c -o "$root/tests/store.test" ./fs/store
$GO test -c -o "$root/tests/fs.test" ./fs
$GO test -c -o "$root/tests/projquota.test" ./internal/projquota
$GO build -o "$root/tests/dropcap" ./scripts/prjquota-vm/dropcap
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' > "$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$root/etc/group"
cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
for m in $(cat /modlist); do insmod /lib/modules/$m || echo "insmod $m failed"; done
sleep 1
mkdir -p /x /e
mount -o prjquota /dev/vda /x && echo "xfs mounted -o prjquota"
mount -o prjquota /dev/vdb /e && echo "ext4 mounted -o prjquota"
export TMPDIR=/tmp PATH=/bin
cd /tests
run() { dir=$1; shift; for t in "projquota.test" "store.test -test.run TestProjectQuota" "fs.test -test.run TestProjectQuotaThroughTheMount"; do ALLOCFS_TEST_PRJQUOTA_DIR=$dir "$@" ./$t -test.v -test.count 1 2>&1 | grep -v 'writer.go'; done; }
echo "=== xfs, as root"; run /x
echo "=== ext4, without CAP_SYS_RESOURCE"; run /e ./dropcap
echo "=== ext4, as root"; run /e
echo "=== DONE"
poweroff -f
INIT
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$work/initrd.gz")
truncate -s 2G "$work/xfs.img" "$work/ext4.img"
mkfs.xfs -q -f "$work/xfs.img"
mkfs.ext4 -q -F -O quota,project "$work/ext4.img"
timeout 1200 qemu-system-x86_64 -accel tcg -cpu max -m 2048 -smp 2 -nographic -no-reboot \
	-kernel "$work/kern/boot/vmlinuz-$kver" -initrd "$work/initrd.gz" -append "console=ttyS0 panic=-1 quiet" \
	-drive "file=$work/xfs.img,format=raw,if=virtio" -drive "file=$work/ext4.img,format=raw,if=virtio" \
	> "$work/vm.log" 2>&1 || true
sed -n '/mounted -o prjquota/,$p' "$work/vm.log" | tr -d '\r'
# Each of the three tests must pass on xfs and on ext4 without the
# capability, and be skipped on ext4 as root (the store refuses it).
fail=0
grep -q "=== DONE" "$work/vm.log" || { echo "the VM did not finish" >&2; fail=1; }
if grep -q -- "--- FAIL" "$work/vm.log"; then echo "a test failed" >&2; fail=1; fi
for t in TestProjects TestProjectQuota TestProjectQuotaCrashAtEveryStep TestProjectQuotaThroughTheMount; do
	n=$(grep -c -- "^--- PASS: $t " "$work/vm.log" || true)
	if [ "$n" -lt 2 ]; then echo "$t passed $n times, want 2 (xfs and ext4)" >&2; fail=1; fi
done
exit $fail
