#!/bin/sh
# benchratio.sh FILE... reads `go test -bench` output of the mount-versus-
# native benchmarks (fs/bench_test.go), one or more rounds, and prints a
# markdown table: per benchmark and metric, the median [min-max] of each
# side and the ratio of the medians. Ratios are oriented so that higher
# means the mount does better: mount/native for rates (units ending in
# /s), native/mount for times (units ending in -ms). ns/op is left out:
# every benchmark reports a rate that says the same.
set -eu
awk '
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
$1 ~ /^Benchmark.*\/(native|mount)(-[0-9]+)?$/ && $0 ~ /ns\/op/ {
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
	print "| benchmark | metric | native median [min–max] | mount median [min–max] | ratio | runs |"
	print "|---|---|---|---|---|---|"
	for (b = 1; b <= nb; b++) {
		bench = order[b]
		nu = split(units[bench], ul, " ")
		for (u = 1; u <= nu; u++) {
			key = bench SUBSEP ul[u]
			if (!((key, "native") in vals) || !((key, "mount") in vals)) continue
			stats(vals[key, "native"]); nmed = smed; ncell = fmtv(smed) " [" fmtv(smin) "–" fmtv(smax) "]"; nn = scount
			stats(vals[key, "mount"]); mmed = smed; mcell = fmtv(smed) " [" fmtv(smin) "–" fmtv(smax) "]"
			if (ul[u] ~ /\/s$/) { num = mmed; den = nmed; how = "mount/native" }
			else { num = nmed; den = mmed; how = "native/mount" }
			ratio = (den > 0) ? sprintf("%.2fx", num / den) : "–"
			printf "| %s | %s | %s | %s | %s (%s) | %d |\n", bench, ul[u], ncell, mcell, ratio, how, nn
		}
	}
}
' "$@"
