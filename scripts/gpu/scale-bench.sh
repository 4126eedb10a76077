#!/usr/bin/env bash
# Issue 12: p2p-bench coll beside NCCL's three modes (and ours on registered buffers) at the
# given world sizes, then the threshold sweeps: every collective with LL off (against the
# default, LL on) and broadcast/reduce without the split (against the default).
# Usage: BENCH_ARGS="--factor 2" scale-bench.sh [WORLD...]   Results: $OUT/scale-bench.tgz
source "$(dirname "$0")/common.sh"
same_nccl
worlds=${*:-$n}
for w in $worlds; do
  timeout "${BENCH_TIMEOUT:-420}" "$here/p2p-bench" coll ${BENCH_ARGS:-} --gpus "$w" --out "$res/coll-w$w" >"$res/coll-w$w.md" 2>"$res/coll-w$w.err"
  note "p2p-bench coll ${BENCH_ARGS:-} on $w GPUs: exit $? ($(grep -c WRONG "$res/coll-w$w.err") WRONG lines)"
  tail -n 2 "$res/coll-w$w.err"
  pack
done
if [ -n "${SWEEPS:-}" ]; then
  for w in $worlds; do
    sweep="--gpus $w --no-nccl --no-registered --samples 10 --types float"
    "$here/p2p-bench" coll $sweep --max-mib 4 --ll-kib 0 --out "$res/sweep-noll-w$w" >"$res/sweep-noll-w$w.md" 2>"$res/sweep-noll-w$w.err"
    note "sweep LL off on $w GPUs: exit $?"
    "$here/p2p-bench" coll $sweep --ops broadcast,reduce --min-bytes 262144 --max-mib 64 --split-kib 1048576 --out "$res/sweep-nosplit-w$w" >"$res/sweep-nosplit-w$w.md" 2>"$res/sweep-nosplit-w$w.err"
    note "sweep split off on $w GPUs: exit $?"
    pack
  done
fi
note "done"
