#!/bin/sh
# benchratio.sh FILE... reads `go test -bench` output of the mount-versus-
# native benchmarks and their peers (fs/bench_test.go,
# fs/benchpeers_test.go) and of the real-workload benchmarks
# (fs/benchwork_test.go), one or more rounds, and prints two markdown
# tables. The first has, per benchmark and metric, the median [min-max] of
# each side (native, mount, loopback, overlay, fuse-overlayfs,
# passthrough_ll, floor, floor-bridge) and the ratio of each side's median
# to native's. The second has the mount's median against each other
# side's, for the metrics that measure speed (not the counts fuse-req/op
# and cache-drops): how far the mount is from native, from the floors and
# from its peers, row by row. Ratios are oriented so that higher means the
# side (in the second table, the mount) does better: the rate's quotient
# for rates (units ending in /s), the inverse for everything else (times
# such as s/op). A side a benchmark does not have, or that was skipped,
# shows "–". ns/op is left out: every benchmark reports a rate that says
# the same.
set -eu
awk '
BEGIN { ns = split("native mount loopback overlay fuse-overlayfs passthrough_ll floor floor-bridge", sides, " ") }
function fmtv(v) {
	if (v >= 1e6) return sprintf("%.2fM", v / 1e6)
	if (v >= 1e4) return sprintf("%.0fk", v / 1e3)
	if (v >= 100) return sprintf("%.0f", v)
	return sprintf("%.3g", v)
}
# median, min and max of the n space-separated numbers in s
function stats(s,    a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 2; i <= n; i++) {
		t = a[i] + 0
		for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]
		a[j + 1] = t
	}
	smin = a[1] + 0; smax = a[n] + 0; scount = n
	smed = (n % 2) ? a[(n + 1) / 2] + 0 : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 ~ /^Benchmark.*\/(native|mount|loopback|overlay|fuse-overlayfs|passthrough_ll|floor|floor-bridge)(-[0-9]+)?$/ && $0 ~ /ns\/op/ {
	name = $1
	sub(/-[0-9]+$/, "", name)
	side = name; sub(/.*\//, "", side)
	bench = name; sub(/\/[^\/]*$/, "", bench); sub(/^Benchmark/, "", bench)
	if (!(bench in seen)) { seen[bench] = 1; order[++nb] = bench }
	for (i = 3; i + 1 <= NF; i += 2) {
		unit = $(i + 1)
		if (unit == "ns/op") continue
		key = bench SUBSEP unit
		if (!(key in useen)) { useen[key] = 1; units[bench] = units[bench] " " unit }
		vals[key, side] = vals[key, side] " " $i
	}
}
END {
	head = "| benchmark | metric |"; rule = "|---|---|"
	for (s = 1; s <= ns; s++) { head = head " " sides[s] " median [min–max] |"; rule = rule "---|" }
	for (s = 2; s <= ns; s++) { head = head " " sides[s] " ratio |"; rule = rule "---|" }
	print head " runs |"
	print rule "---|"
	for (b = 1; b <= nb; b++) {
		bench = order[b]
		nu = split(units[bench], ul, " ")
		for (u = 1; u <= nu; u++) {
			key = bench SUBSEP ul[u]
			line = "| " bench " | " ul[u] " |"
			runs = 0
			for (s = 1; s <= ns; s++) {
				med[s] = ""
				if (!((key, sides[s]) in vals)) { line = line " – |"; continue }
				stats(vals[key, sides[s]])
				med[s] = smed
				if (scount > runs) runs = scount
				line = line " " fmtv(smed) " [" fmtv(smin) "–" fmtv(smax) "] |"
			}
			for (s = 2; s <= ns; s++) {
				if (med[1] == "" || med[s] == "") { line = line " – |"; continue }
				if (ul[u] ~ /\/s$/) { num = med[s]; den = med[1] }
				else { num = med[1]; den = med[s] }
				line = line " " ((den > 0) ? sprintf("%.2fx", num / den) : "–") " |"
			}
			print line " " runs " |"
		}
	}
	print ""
	print "Ratios are each side against native: side/native for rates (/s), native/side for the rest; higher is better."
	print ""
	# The mount against every other side, speed metrics only.
	head = "| benchmark | metric |"; rule = "|---|---|"
	for (s = 1; s <= ns; s++) {
		if (sides[s] == "mount") continue
		head = head " mount vs " sides[s] " |"; rule = rule "---|"
	}
	print head
	print rule
	for (b = 1; b <= nb; b++) {
		bench = order[b]
		nu = split(units[bench], ul, " ")
		for (u = 1; u <= nu; u++) {
			if (ul[u] == "fuse-req/op" || ul[u] == "cache-drops") continue
			key = bench SUBSEP ul[u]
			if (!((key, "mount") in vals)) continue
			stats(vals[key, "mount"]); mmed = smed
			line = "| " bench " | " ul[u] " |"
			for (s = 1; s <= ns; s++) {
				if (sides[s] == "mount") continue
				if (!((key, sides[s]) in vals)) { line = line " – |"; continue }
				stats(vals[key, sides[s]])
				if (ul[u] ~ /\/s$/) { num = mmed; den = smed }
				else { num = smed; den = mmed }
				line = line " " ((den > 0) ? sprintf("%.2fx", num / den) : "–") " |"
			}
			print line
		}
	}
	print ""
	print "The mount against each side: mount/side for rates (/s), side/mount for the rest; above 1 the mount is faster."
}
' "$@"
