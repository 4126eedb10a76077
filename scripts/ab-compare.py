#!/usr/bin/env python3
"""Compares the two binaries of a `bench.sh ab` run of `p2p-bench coll`.

    python3 scripts/ab-compare.py DIR [--markdown]

DIR holds `NAME-rK/coll-*.json` (or `NAME-rK/host.json`, from `bench.sh ab ... -- host`: then
the host cost of each variant, median per round and the ratio of the medians over rounds) for
two names A and B (the order `bench.sh ab` was given, read
from DIR/summary.txt, else alphabetical) and rounds K. For every cell (op, size, ours or
ours_registered, placement, eager or graph) present in every run: the ratio B/A of the means
over rounds, and the spread, the larger of the two binaries' max/min over their own rounds.
A cell "agrees" when the two binaries' ranges overlap or the ratio is within the spread.
Summaries by timing and size class (below 1 MiB, from 1 MiB), then the cells furthest from 1.
Eager calls to 64 KiB are bound by the host's launches, which switch between a fast (~9.5 us)
and a slow (~12-14.5 us, 4 ranks) state within one process: the share of such cells in the slow
state is printed per run, so a difference there can be told from a change of state.
"""
import glob
import json
import os
import re
import statistics as st
import sys

MIB = 1 << 20


def cells(path):
    d = json.load(open(path))
    out = {}
    for r in d["rows"]:
        for impl in ("ours", "ours_registered"):
            for place, v in r.get(impl, {}).items():
                if not isinstance(v, dict):
                    continue
                for timing, m in v.items():
                    if isinstance(m, dict) and "us" in m:
                        out[(r["op"], r["bytes"], impl, place, timing)] = m["us"]
    return d, out


def two_in_order(base, names):
    """The two binaries of `names`, in the order `bench.sh ab` ran them first (its summary.txt),
    else as given; exits unless there are exactly two."""
    summary = os.path.join(base, "summary.txt")
    if os.path.exists(summary):
        order = re.findall(r"round 1 (\S+) ", open(summary).read())
        # A summary.txt kept over several `ab` phases names each binary once per phase.
        names = [n for n in dict.fromkeys(order) if n in names] or names
    if len(names) != 2:
        sys.exit(f"expected two binaries in {base}, found {names}")
    return names


def host_ab(base, names):
    """The `host` A/B: each variant's median host cost per round, both binaries."""
    per = {}
    for name in names:
        for p in sorted(glob.glob(os.path.join(base, f"{name}-r*", "host.json"))):
            for row in json.load(open(p))["rows"]:
                per.setdefault(row["variant"], {}).setdefault(name, []).append(row["us_median"])
    a, b = names
    print(f"host cost per call and rank (us), {b} against {a}, the median of each round:\n")
    print(f"| variant | {a} | {b} | {b}/{a} (medians over rounds) |\n| --- | --- | --- | --- |")
    for v, by in per.items():
        va, vb = by.get(a, []), by.get(b, [])
        if va and vb:
            ratio = st.median(vb) / st.median(va)
            print(f"| {v} | {', '.join('%.3f' % x for x in va)} | {', '.join('%.3f' % x for x in vb)} | {ratio:.3f} |")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    md = "--markdown" in sys.argv
    if len(args) != 1:
        sys.exit(__doc__)
    base = args[0]
    hosts = sorted({re.match(r"(.+)-r\d+$", os.path.basename(os.path.dirname(p))).group(1)
                    for p in glob.glob(os.path.join(base, "*-r*", "host.json"))})
    if hosts:
        host_ab(base, two_in_order(base, hosts))
        return
    runs = {}
    for p in sorted(glob.glob(os.path.join(base, "*-r*", "coll-*.json"))):
        name, k = re.match(r"(.+)-r(\d+)$", os.path.basename(os.path.dirname(p))).groups()
        runs.setdefault(name, {})[int(k)] = cells(p)
    a, b = two_in_order(base, list(runs))
    ra, rb = [runs[a][k] for k in sorted(runs[a])], [runs[b][k] for k in sorted(runs[b])]
    keys = set.intersection(*(set(c) for _, c in ra + rb))
    rows = []
    for k in sorted(keys):
        va, vb = [c[k] for _, c in ra], [c[k] for _, c in rb]
        ratio = st.mean(vb) / st.mean(va)
        spread = max(max(va) / min(va), max(vb) / min(vb))
        overlap = not (min(vb) > max(va) or max(vb) < min(va))
        agrees = overlap or max(ratio, 1 / ratio) <= spread
        rows.append((k, ratio, spread, agrees, va, vb))
    bar = "|" if md else ""
    print(f"{b} against {a}: {len(rows)} cells, commits "
          f"{[d['commit'] for d, _ in ra]} and {[d['commit'] for d, _ in rb]}\n")
    head = ["timing", "sizes", "cells", f"median {b}/{a}", "p10", "p90", "min", "max",
            "agree within spread"]
    if md:
        print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    else:
        print("  ".join(head))
    for timing in ("graph", "eager"):
        for label, pick in (("< 1 MiB", lambda s: s < MIB), (">= 1 MiB", lambda s: s >= MIB)):
            sel = [r for r in rows if r[0][4] == timing and pick(r[0][1])]
            if not sel:
                continue
            rr = sorted(r[1] for r in sel)
            vals = [timing, label, len(sel), f"{st.median(rr):.4f}", f"{rr[len(rr) // 10]:.3f}",
                    f"{rr[9 * len(rr) // 10]:.3f}", f"{rr[0]:.3f}", f"{rr[-1]:.3f}",
                    f"{sum(r[3] for r in sel)}/{len(sel)}"]
            print((f"{bar} " if md else "") + f" {bar} ".join(map(str, vals)) + (f" {bar}" if md else ""))
    print("\nEager cells to 64 KiB in the slow host state (over 11.5 us), per run:")
    for name, rs in ((a, ra), (b, rb)):
        for i, (_, c) in enumerate(rs, 1):
            v = [u for k, u in c.items() if k[4] == "eager" and k[1] <= 64 * 1024]
            slow = sum(u > 11.5 for u in v)
            print(f"  {name} round {i}: {slow}/{len(v)} ({100 * slow / len(v):.0f}%), "
                  f"{min(v):.1f}-{max(v):.1f} us")
    print("\nThe 12 cells furthest from 1 (op, bytes, implementation, placement, timing):")
    for k, ratio, spread, agrees, va, vb in sorted(rows, key=lambda r: -abs(r[1] - 1))[:12]:
        print(f"  {k}: {ratio:.3f} (spread {spread:.3f}; {a} {['%.2f' % x for x in va]}, "
              f"{b} {['%.2f' % x for x in vb]})")


if __name__ == "__main__":
    main()
