#!/usr/bin/env python3
"""Where the host's time goes between kernel launches, from an Nsight Systems CUDA API trace.

    nsys profile -t cuda -o NAME p2p-bench coll ...
    nsys stats -r cuda_api_trace --format csv -o NAME NAME.nsys-rep
    python3 api-gaps.py NAME_cuda_api_trace.csv [MORE.csv ...]

For each trace: the thread that launched the most kernels; the driver API calls it made per
launch (by name, so two binaries that issue different calls are told apart at once); the time
inside a launch call and the gap from the end of one launch call to the start of the next
(the host code between them, and any other API call there), as median, p10 and p90; and the
share of gaps over 2 us. See docs/performance.md, "Host cost of a call".
"""
import csv
import statistics as st
import sys
from collections import Counter


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


def col(row, *names):
    for n in names:
        if n in row and row[n] != "":
            return row[n]
    raise KeyError(f"none of {names} in {list(row)}")


def report(path):
    rows = list(csv.DictReader(open(path, newline="")))
    by_tid = {}
    for r in rows:
        tid = col(r, "Tid", "TID", "Thread")
        by_tid.setdefault(tid, []).append(
            (int(col(r, "Start (ns)", "Start")), int(col(r, "Duration (ns)", "Duration")), col(r, "Name"))
        )

    def launches(calls):
        return [c for c in calls if "LaunchKernel" in c[2]]

    tid, calls = max(by_tid.items(), key=lambda kv: len(launches(kv[1])))
    calls.sort()
    ls = launches(calls)
    inside = [d / 1e3 for _, d, _ in ls]
    gaps = [(b[0] - (a[0] + a[1])) / 1e3 for a, b in zip(ls, ls[1:])]
    gaps = [g for g in gaps if g < 1000]  # a sync or a new size between them: not the loop
    names = Counter(n for _, _, n in calls)
    print(f"== {path}: thread {tid}, {len(ls)} launches, {len(calls)} API calls")
    print(f"  in a launch call (us): median {st.median(inside):.3f}, p10 {pct(inside, .1):.3f}, p90 {pct(inside, .9):.3f}")
    print(f"  launch end to next launch (us): median {st.median(gaps):.3f}, p10 {pct(gaps, .1):.3f}, p90 {pct(gaps, .9):.3f}, over 2 us {sum(g > 2 for g in gaps) / len(gaps):.1%}")
    print("  API calls per launch:")
    for n, c in names.most_common(12):
        print(f"    {n}: {c / len(ls):.3f}")


for p in sys.argv[1:]:
    report(p)
