#!/usr/bin/env bash
# Issue 12, batch B for a machine: our collectives beside NCCL at every smaller world size (3
# ranks on a 4-GPU machine), then all-reduce sweeps for the planner at each world size: every
# algorithm forced (LL forced up to 1 MiB, beyond which it falls back to one-shot), and LL off.
# Usage: BENCH_ARGS="--factor 4" scale-b.sh   Results: $OUT/scale-b.tgz
source "$(dirname "$0")/common.sh"
same_nccl
for w in $(seq $(( n - 1 )) -1 3); do
  "$here/p2p-bench" coll ${BENCH_ARGS:-} --gpus "$w" --out "$res/coll-w$w" >"$res/coll-w$w.md" 2>"$res/coll-w$w.err"
  note "p2p-bench coll ${BENCH_ARGS:-} on $w GPUs: exit $?"
  pack
done
for w in $(seq "$n" -1 2); do
  sweep="--gpus $w --ops all_reduce --types float --no-nccl --samples 10"
  for algo in oneshot twoshot ring; do
    P2P_ALGO=$algo "$here/p2p-bench" coll $sweep --min-bytes 65536 --factor 4 --graph-max-mib 4 --out "$res/sweep-$algo-w$w" >"$res/sweep-$algo-w$w.md" 2>"$res/sweep-$algo-w$w.err"
    note "sweep $algo on $w GPUs: exit $?"
  done
  P2P_ALGO=ll "$here/p2p-bench" coll $sweep --max-mib 1 --out "$res/sweep-ll-w$w" >"$res/sweep-ll-w$w.md" 2>"$res/sweep-ll-w$w.err"
  note "sweep LL forced on $w GPUs: exit $?"
  "$here/p2p-bench" coll $sweep --max-mib 1 --ll-kib 0 --out "$res/sweep-noll-w$w" >"$res/sweep-noll-w$w.md" 2>"$res/sweep-noll-w$w.err"
  note "sweep LL off on $w GPUs: exit $?"
  pack
done
note "done"
