#!/usr/bin/env python3
"""Summarises a `p2p-bench coll` JSON beside NCCL's best mode: the README's performance cells
(8 B and 4 KiB under graph, 2 MiB eager, busbw at 128 MiB and 1 GiB) and, for each collective,
the sizes where ours (plain buffers, and registered) trails NCCL's best.

Usage: python3 scripts/coll-summary.py COLL.json
"""
import json
import math
import sys

SHORT = {"plain": "pla", "symmetric": "sym", "copy_engine": "cop"}
TYPES = {"bfloat16": "bf16", "float16": "f16"}


def size(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n and b % n == 0:
            return f"{b // n} {unit}"
        if b >= n:
            return f"~{b / n:.0f} {unit}"
    return f"{b} B"


def nearest(rows, b):
    """The row whose size is nearest to `b` on a log scale (at 3 ranks the sizes are
    multiples of 3 elements)."""
    return min(rows, key=lambda r: abs(math.log(max(r["bytes"], 1) / b)))


def at(row, b):
    """A note where the row is not exactly `b` bytes."""
    return "" if row["bytes"] == b else f" at {size(row['bytes'])}"


def cell(row, timing, key):
    """(ours, registered, best, best mode) for out-of-place `timing` (eager or graph)."""
    def get(which):
        return row.get(which, {}).get("out_of_place", {}).get(timing, {})
    best = row.get("nccl_best", {}).get("out_of_place", {}).get(timing, {})
    return get("ours").get(key), get("ours_registered").get(key), best.get(key), best.get("mode")


def main(path):
    d = json.load(open(path))
    gpus = d.get("gpus") or [{}]
    name = gpus[0].get("name", "?") if isinstance(gpus, list) else gpus
    print(f"{d['world']} x {name}, {d['date']}, commit {d['commit']}, NCCL {d['nccl_version']}")
    groups = {}
    for r in d["rows"]:
        kind = r.get("type", "float")
        name = r["op"] + ("" if kind == "float" else " " + TYPES.get(kind, kind))
        groups.setdefault(name, []).append(r)
    print("| collective | 8 B, graph | 4 KiB, graph | 2 MiB eager | 128 MiB busbw | 1 GiB busbw |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, rows in groups.items():
        cells = []
        for b, timing in ((8, "graph"), (4096, "graph"), (2 << 20, "eager")):
            r = nearest(rows, b)
            o, _, best, mode = cell(r, timing, "us")
            cells.append("-" if o is None or best is None else
                         f"{o:.1f} us{at(r, b)} ({best:.1f} {SHORT.get(mode, mode)})")
        for b in (128 << 20, 1 << 30):
            r = nearest(rows, b)
            o, reg, best, mode = cell(r, "eager", "busbw")
            regs = "-" if reg is None else f"{reg:.0f}"
            cells.append("-" if o is None or best is None else
                         f"{o:.0f} / {regs}{at(r, b)} ({best:.0f} {SHORT.get(mode, mode)})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    for name, rows in groups.items():
        for timing in ("eager", "graph"):
            behind = []
            for r in rows:
                o, reg, best, _ = cell(r, timing, "us")
                if o is None or not best:
                    continue
                if o > best:
                    behind.append(f"{size(r['bytes'])} {o / best:.2f}"
                                  + (f"/{reg / best:.2f}" if reg is not None else ""))
            print(f"{name} {timing}: ours (/registered) over NCCL best where behind: "
                  + (", ".join(behind) if behind else "none"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
