#!/usr/bin/env python3
"""Helper of scripts/bench-copyup.sh: the timed write and the result table.

  bench-copyup.py write PATH
      open(PATH, O_WRONLY), pwrite one byte at offset 0, close; prints the
      three durations in nanoseconds. The timing is taken in-process so that
      no fork/exec (as around dd) hides a write that takes microseconds.
      In allocfs the copy-up happens inside open(): the write and close
      after it reach the upper copy by passthrough.

  bench-copyup.py table RESULTS
      reads the "fs round file metric value" lines bench-copyup.sh recorded
      and prints markdown tables: median [min-max] over the rounds.
"""

import os
import statistics
import sys
import time


def timed_write(path):
    t0 = time.perf_counter_ns()
    fd = os.open(path, os.O_WRONLY)
    t1 = time.perf_counter_ns()
    try:
        if os.pwrite(fd, b"x", 0) != 1:
            raise OSError(f"short write to {path}")
        t2 = time.perf_counter_ns()
    finally:
        os.close(fd)
    t3 = time.perf_counter_ns()
    print(t1 - t0, t2 - t1, t3 - t2)


def fmt_ns(ns):
    """A duration in the unit that keeps three significant digits readable."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e3:.0f} µs"


def fmt_kib(kib):
    if abs(kib) >= 1000 * 1024:
        return f"{kib / 1024 / 1024:.2f} GiB"
    if abs(kib) >= 1024:
        return f"{kib / 1024:.1f} MiB"
    return f"{kib:.0f} KiB"


def stat(values, fmt):
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return fmt(med)
    return f"{fmt(med)} [{fmt(min(values))}–{fmt(max(values))}]"


def table(results):
    # data[(fs, file)][metric] = [value per round]
    data = {}
    fss, files, rounds = [], [], set()
    with open(results) as f:
        for line in f:
            fs, rnd, file, metric, value = line.split()
            if fs not in fss:
                fss.append(fs)
            if file not in files:
                files.append(file)
            rounds.add(rnd)
            data.setdefault((fs, file), {}).setdefault(metric, []).append(float(value))

    def get(fs, file, metric):
        return data.get((fs, file), {}).get(metric, [])

    print(f"Rounds: {len(rounds)}. Each cell: median [min–max] over the rounds.")
    print()
    print("Time of open(O_WRONLY) + 1-byte pwrite + close. \"cold\": page cache, dentries and inodes")
    print("dropped first; \"names cached\": the path stat'ed, then only the page cache dropped.")
    print()
    print("| backing fs | file | first write in B, cold | first write in B, names cached | second write in B | native, cold | native, names cached | native, second write | writeback after the copy-up (`sync -f`) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fs in fss:
        for file in files:
            if (fs, file) not in data or file == "probe":
                continue
            cells = [stat(get(fs, file, m), fmt_ns) for m in (
                "first_total_ns", "first_cached_total_ns", "second_total_ns",
                "native_first_total_ns", "native_first_cached_total_ns",
                "native_second_total_ns", "sync_ns")]
            print(f"| {fs} | {file} | " + " | ".join(cells) + " |")
    # In allocfs the copy-up runs inside open(): say how much of a first
    # write open() was, so the reader need not take that on trust.
    shares = []
    for (fs, file), metrics in data.items():
        for prefix in ("first", "first_cached"):
            for o, t in zip(metrics.get(prefix + "_open_ns", []), metrics.get(prefix + "_total_ns", [])):
                if t > 0:
                    shares.append(o / t)
    if shares:
        print()
        print(f"open() was {min(shares) * 100:.0f}–{max(shares) * 100:.0f}% of each first write in B.")
    print()
    print("What the copy-up left on the backing filesystem (after the first write and its sync):")
    print()
    print("| backing fs | file | copied up by | lower: allocated | upper copy: allocated (du) | new blocks on the fs (df delta) | upper extents shared with the lower | cold read of the native file (`dd` to /dev/null) |")
    print("|---|---|---|---|---|---|---|---|")
    for fs in fss:
        # Seen by strace on the daemon during an untimed copy-up of
        # another file of the same volume, once per round.
        ficlone = get(fs, "probe", "ficlone")
        if not ficlone:
            how = "– (no strace)"
        elif min(ficlone) == max(ficlone) == 1:
            how = f"FICLONE ({len(ficlone)} of {len(ficlone)} rounds)"
        elif max(ficlone) == 0:
            how = f"copy_file_range, FICLONE refused ({len(ficlone)} of {len(ficlone)} rounds)"
        else:
            how = f"FICLONE in {sum(ficlone):.0f} of {len(ficlone)} rounds"
        for file in files:
            if (fs, file) not in data or file == "probe":
                continue
            shared = get(fs, file, "upper_shared_extents")
            total = get(fs, file, "upper_extents")
            ext = "–"
            if shared and total:
                ext = f"{statistics.median(shared):.0f} of {statistics.median(total):.0f}"
                if min(shared) != max(shared) or min(total) != max(total):
                    ext += f" (range {min(shared):.0f}–{max(shared):.0f} of {min(total):.0f}–{max(total):.0f})"
            print(
                f"| {fs} | {file} | {how} "
                f"| {stat(get(fs, file, 'lower_du_kib'), fmt_kib)} "
                f"| {stat(get(fs, file, 'upper_du_kib'), fmt_kib)} "
                f"| {stat(get(fs, file, 'df_delta_kib'), fmt_kib)} "
                f"| {ext} "
                f"| {stat(get(fs, file, 'native_cold_read_ns'), fmt_ns)} |"
            )


def main(argv):
    if len(argv) == 3 and argv[1] == "write":
        timed_write(argv[2])
    elif len(argv) == 3 and argv[1] == "table":
        table(argv[2])
    else:
        sys.exit("usage: bench-copyup.py write PATH | table RESULTS")


if __name__ == "__main__":
    main(sys.argv)
