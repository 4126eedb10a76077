#!/usr/bin/env python3
"""Builds `p2p-bench` binaries whose split reduce (`algo/split.cuh`, broadcasts and reduces from
1 MiB on more than two ranks) leaves one phase out, for timing by omission on a GPU machine
(docs/performance.md, "Two-shot and the split broadcast and reduce": where the 4-rank reduce's
time goes, without counters; ncu cannot profile a collective, it serialises the ranks' kernels
and each waits for the others).

Run here (the developer machine), from the repository:
    python3 scripts/exp/split-variants.py [LABEL...]     (default: every variant)
It copies HEAD's tree into a git worktree under target/exp-tree, edits
p2p-collective/src/kernels/coll/algo/split.cuh there (each edit must match exactly, or the
script stops), checks with NVRTC that every kernel header still compiles (the kernels test
`every_kernel_header_compiles_alone`, libnvrtc from target/nvrtc as .ci/run installs it: an edit
that does not compile stops the script here, not on the GPU), builds `p2p-bench` (release, in
the worktree's target/) and writes target/ab/p2p-bench-split-LABEL. The edited binaries carry
no shipped cubins for their edited source: they compile it with the GPU machine's NVRTC at
first use (about 10 s, cached). Then on the GPU machine, carrying target/ab:
    ROUNDS=2 BENCH_TIMEOUT=90 bash bench.sh ab base=../ab/p2p-bench-split-base \\
        nosend=../ab/p2p-bench-split-nosend ... -- coll --gpus 4 --ops reduce \\
        --min-bytes 2097152 --max-mib 1024 --factor 8 --no-nccl --no-registered --samples 10
The edited binaries compute wrong sums (a phase is missing): their #wrong column shows that the
edit took; their times are the point. Variants:
    base    no edit
    nosend  step 1 left out (no rank sends its parts to their owners)
    copy2   step 2 copies the owner's own part into the root instead of reducing N sources
    noout   step 3 left out (the root does not copy its scratch into the output)
    nobar2  the barrier before step 3 and step 3 left out
"""
import os
import shutil
import subprocess
import sys

SPLIT = "p2p-collective/src/kernels/coll/algo/split.cuh"

# Each edit: (the text to find, how many times the file holds it, which of them to edit, the
# text that takes its place). The counts check that the kernel is the one this script knows.
SEND = "copy_bytes(slot(q, wpar, me) + jlo * E"
REDUCE = "reduce_into<T>((T*)(slot(a.root, wpar, me) + mlo * E)"
OUT_IF = "} else if (k == 2 && root) {"

VARIANTS = {
    "base": [],
    "nosend": [(SEND, 1, 0, "if (0) " + SEND)],
    "copy2": [(REDUCE + ", dsts, 0, srcs, N, mhi - mlo, a.redop, N);", 1, 0,
               "copy_bytes(slot(a.root, wpar, me) + mlo * E, "
               "(const unsigned char*)(in + lo + mlo), (mhi - mlo) * E);")],
    "noout": [(OUT_IF, 1, 0, "} else if (0) {")],
    # Two stages: the barrier before the copies out goes, and the copies with it.
    "nobar2": [("run_staged<3>(a", 1, 0, "run_staged<2>(a")],
}


def edit(text, old, count, which, new, label):
    """`text` with occurrence `which` of `old` (of exactly `count`) replaced by `new`."""
    if text.count(old) != count:
        sys.exit(f"{label}: {old!r} is not in {SPLIT} {count} times: the kernel changed; update "
                 "this script")
    at = -1
    for _ in range(which + 1):
        at = text.index(old, at + 1)
    return text[:at] + new + text[at + len(old):]


def run(*cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main(labels):
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    os.chdir(root)
    unknown = [l for l in labels if l not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    tree = os.path.join(root, "target", "exp-tree")
    if os.path.exists(tree):
        run("git", "worktree", "remove", "--force", tree)
    run("git", "worktree", "add", "--detach", tree, "HEAD")
    os.makedirs(os.path.join(root, "target", "ab"), exist_ok=True)
    split = os.path.join(tree, SPLIT)
    original = open(split).read()
    nvrtc = os.path.join(root, "target", "nvrtc", "nvidia", "cu13", "lib")
    env = dict(os.environ, LD_LIBRARY_PATH=nvrtc)
    try:
        for label in labels or list(VARIANTS):
            text = original
            for old, count, which, new in VARIANTS[label]:
                text = edit(text, old, count, which, new, label)
            open(split, "w").write(text)
            run("cargo", "test", "-p", "p2p-collective", "--test", "kernels", "--",
                "--ignored", "every_kernel_header_compiles_alone", cwd=tree, env=env)
            run("cargo", "build", "--release", "-p", "p2p-bench", "--bin", "p2p-bench",
                cwd=tree)
            dst = os.path.join(root, "target", "ab", f"p2p-bench-split-{label}")
            shutil.copy(os.path.join(tree, "target", "release", "p2p-bench"), dst)
            print(f"wrote {dst}", flush=True)
    finally:
        run("git", "worktree", "remove", "--force", tree)


if __name__ == "__main__":
    main(sys.argv[1:])
