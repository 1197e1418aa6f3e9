#!/usr/bin/env bash
# bench-nomad-exec.sh: the real Nomad agent (-dev, as root) runs an exec-driver batch job
# (/bin/sh -c 'echo hi', chrooted with the client's chroot_env) on three alloc_dirs, and times
#   start: from the job's registration (POST /v1/jobs) to its allocation's client status
#          "complete" (Nomad's chroot build of the task directory dominates), and
#   gc:    from `nomad system gc` + PUT /v1/client/gc until the allocation's directory is
#          gone from alloc_dir,
# in BENCH_ROUNDS rounds (default 3), each running the sides in an order rotated by one place:
#   mount: alloc_dir on `allocfs serve --chroot-env <the same list>` (--live-restart=false),
#          its data dir on a fresh loop-mounted ext4 image (BENCH_IMG_SIZE, sparse, default 24G:
#          Nomad follows /bin, /lib... into /usr and copies most of it twice, about 9.4 GiB here);
#   copy:  a plain alloc_dir on that same image, another filesystem than the host's /usr:
#          link(2) fails with EXDEV there and Nomad copies every chroot file;
#   link:  a plain alloc_dir on the filesystem of /usr (under BENCH_IMG_DIR, default /var/tmp),
#          where Nomad hard-links every chroot file.
# Every measurement gets a fresh agent (and, on the mount, a fresh serve and data dir); the
# page cache is dropped (sync; echo 3 > /proc/sys/vm/drop_caches) right before each start, so
# that every start is cold. Medians per side and the ratios mount/copy and mount/link follow.
#
# BENCH_CHROOT_ENV is the chroot_env, in serve's --chroot-env form (comma-separated, SRC or
# SRC=DEST); default Nomad's own list. For a quick run: BENCH_CHROOT_ENV=/usr/bin/busybox=/bin/sh
# (a static busybox). The mount side also counts the FUSE requests of each phase
# (allocfs_fuse_request_duration_seconds_count of serve's /v1/metrics: the total, the five largest
# opcodes and handler_s, the sum of the handlers' durations) and checks that serve logged Nomad's
# teardown of the chroot task directory. Every side reports the agent's CPU time during the start
# (agent_cpu_start_s), the mount serve's too (serve_cpu_start_s); build_s is Nomad's own account of
# the start, from its "Task Setup" event to "Started".
#
# Needs root, /dev/fuse, loop devices, e2fsprogs, curl, jq, python3; the Nomad agent at
# NOMAD_BIN (default ../shared/tools/nomad/nomad beside the checkout), allocfs at ALLOCFS_BIN.
# Only 127.0.0.1 is used.
set -eu

ROUNDS=${BENCH_ROUNDS:-3}
CHROOT_ENV=${BENCH_CHROOT_ENV:-/bin,/etc,/lib,/lib32,/lib64,/sbin,/usr,/run/resolvconf,/run/systemd/resolve}
ALLOCFS=${ALLOCFS_BIN:-$PWD/bin/allocfs}
NOMAD=${NOMAD_BIN:-$PWD/../shared/tools/nomad/nomad}
OUT=${BENCH_OUT:-$PWD/bin/bench-nomad-exec.txt}
IMG_SIZE=${BENCH_IMG_SIZE:-24G}
SIDES=${BENCH_SIDES:-mount copy link}
TIMEOUT=${BENCH_TIMEOUT:-900} # seconds for one start or one GC

[ "$(id -u)" = 0 ] || { echo "bench-nomad-exec: needs root (Nomad's exec driver, mounts)" >&2; exit 1; }
[ -x "$NOMAD" ] || { echo "bench-nomad-exec: no Nomad agent at $NOMAD (set NOMAD_BIN)" >&2; exit 1; }
[ -x "$ALLOCFS" ] || { echo "bench-nomad-exec: no allocfs at $ALLOCFS (set ALLOCFS_BIN)" >&2; exit 1; }
for t in curl jq python3 mkfs.ext4; do
	command -v $t >/dev/null || { echo "bench-nomad-exec: needs $t" >&2; exit 1; }
done

TOP=$(mktemp -d "${BENCH_IMG_DIR:-/var/tmp}/allocfs-bench-nomad.XXXXXX")
# Chroot tasks run as nobody: the way to alloc_dir must be open to them.
chmod 755 "$TOP"
IMG=$TOP/img
AGENT_PID= SERVE_PID=

# mounts_below DIR lists the mount points below DIR (not DIR itself), deepest first.
mounts_below() {
	awk -v d="$1/" 'index($5, d) == 1 { print length($5), $5 }' /proc/self/mountinfo | sort -rn | cut -d' ' -f2-
}

# descendants PID lists every process below PID, parents before their children.
descendants() {
	local queue=$1 p c
	while [ -n "$queue" ]; do
		set -- $queue
		p=$1; shift; queue="$*"
		for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do
			echo "$c"
			queue="$queue $c"
		done
	done
}

# stop_agent kills the agent's processes, deepest first, then the agent, by PID.
stop_agent() {
	[ -n "$AGENT_PID" ] || return 0
	local procs
	procs=$(descendants "$AGENT_PID" | tac)
	for p in $procs; do kill -9 "$p" 2>/dev/null || true; done
	kill -9 "$AGENT_PID" 2>/dev/null || true
	wait "$AGENT_PID" 2>/dev/null || true
	AGENT_PID=
}

# stop_serve stops serve by PID (SIGTERM: with --live-restart=false it unmounts).
stop_serve() {
	[ -n "$SERVE_PID" ] || return 0
	kill "$SERVE_PID" 2>/dev/null || true
	for _ in $(seq 100); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$SERVE_PID" 2>/dev/null || true
	wait "$SERVE_PID" 2>/dev/null || true
	SERVE_PID=
}

# detach DIR detaches every mount below DIR, deepest first (lazily: a mount whose daemon is
# gone must not block it).
detach() {
	local m
	for m in $(mounts_below "$1"); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
}

cleanup() {
	stop_agent
	# Nomad's leftovers below the alloc_dirs (secrets/private tmpfs, binds) go first, the
	# FUSE mount and the image after them: mounts_below sorts deepest first.
	for m in $(mounts_below "$TOP"); do
		case $m in "$IMG") continue ;; esac
		umount "$m" 2>/dev/null || umount -l "$m" || true
	done
	stop_serve
	if mountpoint -q "$IMG"; then umount "$IMG" || umount -l "$IMG" || true; fi
	if [ -z "$(mounts_below "$TOP")" ]; then
		rm -rf "$TOP"
	else
		echo "bench-nomad-exec: $TOP kept: mounts left below it: $(mounts_below "$TOP")" >&2
	fi
}
trap cleanup EXIT
# An interrupted run cleans up too: bash runs the EXIT trap on an exit, not on a death by signal.
trap 'exit 130' INT
trap 'exit 143' TERM

now() { date +%s.%N; }
# cpu PID: the process's CPU time (user + system) in seconds.
cpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.2f", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }
secs() { echo "$2 - $1" | bc -l | awk '{ printf "%.2f", $1 }'; }

free_ports() {
	python3 -c '
import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}

# chroot_hcl turns CHROOT_ENV into the client's chroot_env block.
chroot_hcl() {
	local e
	echo "  chroot_env = {"
	IFS=, read -r -a entries <<<"$CHROOT_ENV"
	for e in "${entries[@]}"; do
		[ -n "$e" ] || continue
		case $e in
		*=*) printf '    "%s" = "%s"\n' "${e%%=*}" "${e#*=}" ;;
		*) printf '    "%s" = "%s"\n' "$e" "$e" ;;
		esac
	done
	echo "  }"
}

# fuse_requests SOCK prints "OP COUNT" lines of serve's request counters.
fuse_requests() {
	curl -sf --unix-socket "$1" http://allocfs/v1/metrics |
		awk '/^allocfs_fuse_request_duration_seconds_count/ { match($0, /op="[^"]*"/); print substr($0, RSTART+4, RLENGTH-5), $NF }
			/^allocfs_fuse_request_duration_seconds_sum/ { ms += $NF * 1000 } END { printf "~handler_ms %d\n", ms }' | sort
}

# fuse_delta BEFORE AFTER: the total of requests between two fuse_requests answers, then the
# five largest opcodes.
fuse_delta() {
	join -a 2 -e 0 -o 0,1.2,2.2 <(echo "$1") <(echo "$2") |
		awk '$1 == "~handler_ms" { h = $3 - $2; next } { d = $3 - $2; if (d > 0) { t += d; print d, $1 } } END { print t, "TOTAL"; print h, "~handler_ms" }' |
		sort -rn | awk '$2 == "~handler_ms" { h = $1; next } { l[++n] = $0 } END {
			split(l[1], f, " "); printf "%d", f[1]; for (i = 2; i <= 6 && i <= n; i++) { split(l[i], f, " "); printf " %s:%d", f[2], f[1] }
			printf " handler_s:%.1f", h / 1000 }'
}

api() { curl -sf "$ADDR$@"; }

JOB_HCL='job "JOBID" {
  datacenters = ["dc1"]
  type        = "batch"
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", "echo hi"]
      }
      resources {
        cpu    = 100
        memory = 64
      }
    }
  }
}'

# measure SIDE ROUND: one start and one GC on SIDE, appended to $OUT as one line.
measure() {
	local side=$1 round=$2 dir=$TOP/$1-$2 alloc sock= ports job id t0 t1 t2 t3 st build f0= f1= f2= torn=
	mkdir -p "$dir"
	case $side in
	mount)
		alloc=$dir/alloc sock=$dir/allocfs.sock
		mkdir -p "$alloc"
		"$ALLOCFS" serve --data-dir "$IMG/mount-$round" --mount "$alloc" --socket "$sock" \
			--live-restart=false --chroot-env "$CHROOT_ENV" >"$dir/serve.log" 2>&1 &
		SERVE_PID=$!
		for _ in $(seq 150); do
			[ -S "$sock" ] && mountpoint -q "$alloc" && break
			kill -0 "$SERVE_PID" 2>/dev/null || { cat "$dir/serve.log" >&2; return 1; }
			sleep 0.2
		done
		mountpoint -q "$alloc" || { echo "serve did not mount $alloc" >&2; return 1; }
		;;
	copy) alloc=$IMG/copy-$round/alloc; mkdir -p -m 711 "$alloc" ;;
	link) alloc=$dir/alloc; mkdir -p -m 711 "$alloc" ;;
	esac
	read -r -a ports <<<"$(free_ports)"
	ADDR=http://127.0.0.1:${ports[0]}
	cat >"$dir/agent.hcl" <<EOF
data_dir = "$dir/nomad"
bind_addr = "127.0.0.1"
disable_update_check = true
ports {
  http = ${ports[0]}
  rpc = ${ports[1]}
  serf = ${ports[2]}
}
client {
  alloc_dir = "$alloc"
  alloc_mounts_dir = "$dir/mounts"
  options = {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
$(chroot_hcl)
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
EOF
	# The AWS SDK's CA bundle variables make the agent's metadata client refuse to start.
	env $(env | awk -F= '/^AWS_/ { printf "-u %s ", $1 }') NOMAD_ADDR="$ADDR" \
		"$NOMAD" agent -dev -config "$dir/agent.hcl" >"$dir/agent.log" 2>&1 &
	AGENT_PID=$!
	local node= healthy=
	for _ in $(seq 360); do
		kill -0 "$AGENT_PID" 2>/dev/null || { tail -50 "$dir/agent.log" >&2; return 1; }
		node=$(api /v1/nodes 2>/dev/null | jq -r '.[] | select(.Status == "ready") | .ID' 2>/dev/null || true)
		if [ -n "$node" ]; then
			healthy=$(api "/v1/node/$node" | jq -r '.Drivers.exec.Healthy // false')
			[ "$healthy" = true ] && break
		fi
		sleep 0.25
	done
	[ "$healthy" = true ] || { echo "the agent's exec driver not healthy" >&2; tail -50 "$dir/agent.log" >&2; return 1; }

	job=bench-$side-$round
	sync
	echo 3 >/proc/sys/vm/drop_caches
	[ -z "$sock" ] || f0=$(fuse_requests "$sock")
	local parsed
	parsed=$(jq -n --arg hcl "${JOB_HCL/JOBID/$job}" '{JobHCL: $hcl, Canonicalize: true}' | curl -sf -X POST --data-binary @- "$ADDR/v1/jobs/parse")
	local c0 s0=0 c1 s1=0
	c0=$(cpu "$AGENT_PID")
	[ -z "$SERVE_PID" ] || s0=$(cpu "$SERVE_PID")
	t0=$(now)
	jq -n --argjson job "$parsed" '{Job: $job}' | curl -sf -X POST --data-binary @- "$ADDR/v1/jobs" >/dev/null
	st=
	while :; do
		st=$(api "/v1/job/$job/allocations" | jq -r '.[0] | "\(.ID) \(.ClientStatus)"' 2>/dev/null || true)
		case $st in *" complete") break ;; *" failed" | *" lost")
			echo "$job: $st" >&2
			api "/v1/job/$job/allocations" | jq -r '.[0].TaskStates.t.Events[] | "  \(.Type): \(.DisplayMessage)"' >&2
			echo "  stderr: $(api "/v1/client/fs/logs/${st%% *}?task=t&type=stderr&origin=start&offset=0&plain=true" || true)" >&2
			return 1 ;;
		esac
		[ "$(secs "$t0" "$(now)" | cut -d. -f1)" -lt "$TIMEOUT" ] || { echo "$job: not complete in ${TIMEOUT}s ($st)" >&2; return 1; }
		sleep 0.1
	done
	t1=$(now)
	c1=$(cpu "$AGENT_PID")
	[ -z "$SERVE_PID" ] || s1=$(cpu "$SERVE_PID")
	id=${st%% *}
	# Nomad's own account of the chroot build: from its "Task Setup" event to "Started".
	build=$(api "/v1/allocation/$id" | jq -r '.TaskStates.t.Events as $e |
		(($e | map(select(.Type == "Started")) | .[0].Time) - ($e | map(select(.Type == "Task Setup")) | .[0].Time)) / 1e9 |
		. * 100 | round / 100' 2>/dev/null) || build=-
	[ -z "$sock" ] || f1=$(fuse_requests "$sock")
	[ "$(api "/v1/client/fs/logs/$id?task=t&type=stdout&origin=start&offset=0&plain=true")" = hi ] ||
		echo "warning: $job's stdout is not 'hi'" >&2

	t2=$(now)
	env NOMAD_ADDR="$ADDR" "$NOMAD" system gc >/dev/null
	curl -sf -X PUT "$ADDR/v1/client/gc" >/dev/null
	while [ -e "$alloc/$id" ]; do
		[ "$(secs "$t2" "$(now)" | cut -d. -f1)" -lt "$TIMEOUT" ] || { echo "$job: $alloc/$id still there ${TIMEOUT}s after the GC" >&2; return 1; }
		sleep 0.05
	done
	t3=$(now)
	local extra=
	if [ -n "$sock" ]; then
		f2=$(fuse_requests "$sock")
		grep -q "Nomad tears a chroot task directory down" "$dir/serve.log" && torn=yes || torn=no
		extra=" fuse_start=$(fuse_delta "$f0" "$f1" | tr ' ' ,) fuse_gc=$(fuse_delta "$f1" "$f2" | tr ' ' ,) teardown_logged=$torn"
	fi
	[ -z "$(mounts_below "$alloc")" ] || echo "warning: mounts left below $alloc: $(mounts_below "$alloc")" >&2
	[ -z "$sock" ] || extra="$extra serve_cpu_start_s=$(secs "$s0" "$s1")"
	echo "round $round $side start_s=$(secs "$t0" "$t1") build_s=$build gc_s=$(secs "$t2" "$t3") agent_cpu_start_s=$(secs "$c0" "$c1")$extra" | tee -a "$OUT"

	stop_agent
	detach "$alloc"
	detach "$dir"
	stop_serve
	if [ -n "$(mounts_below "$dir")" ]; then
		echo "mounts left below $dir: $(mounts_below "$dir")" >&2
		return 1
	fi
	rm -rf "$dir" "$IMG/copy-$round" "$IMG/mount-$round"
}

# median: the median of the numbers on stdin.
median() {
	sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

mkdir -p "$(dirname "$OUT")"
: >"$OUT"
truncate -s "$IMG_SIZE" "$TOP/ext4.img"
mkfs.ext4 -q -F "$TOP/ext4.img"
mkdir "$IMG"
mount -o loop "$TOP/ext4.img" "$IMG"
chmod 755 "$IMG"
{
	echo "# bench-nomad-exec $(date -u +%FT%TZ) $(uname -r) $(nproc) CPUs, allocfs $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $("$NOMAD" version | head -1)"
	echo "# rounds $ROUNDS, chroot_env $CHROOT_ENV; image $IMG_SIZE ext4 at $IMG (mount's data dir, copy's alloc_dir); link's alloc_dir under $TOP ($(df --output=source "$TOP" | tail -1), /usr on $(df --output=source /usr | tail -1))"
} | tee -a "$OUT"

read -r -a sides <<<"$SIDES"
for r in $(seq "$ROUNDS"); do
	o=$(((r - 1) % ${#sides[@]}))
	for side in "${sides[@]:$o}" "${sides[@]:0:$o}"; do
		measure "$side" "$r"
	done
done

echo "== medians of $ROUNDS rounds" | tee -a "$OUT"
for m in start build gc; do
	line="$m:"
	for side in "${sides[@]}"; do
		v=$(awk -v s="$side" -v k="${m}_s" '$3 == s { for (i = 4; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' "$OUT" | median)
		eval "med_${m}_$side=\$v"
		line="$line $side ${v}s"
	done
	for other in copy link; do
		a=$(eval echo "\${med_${m}_mount:-}") b=$(eval echo "\${med_${m}_$other:-}")
		if [ -n "$a" ] && [ -n "$b" ] && [ "$a" != - ] && [ "$b" != - ]; then
			line="$line, mount/$other $(echo "$a / $b" | bc -l | awk '{ printf "%.2fx", $1 }')"
		fi
	done
	echo "$line" | tee -a "$OUT"
done
