#!/usr/bin/env bash
# The shipped cubins (NVRTC 12.4) against NVRTC's own compile on the machine (P2P_KERNELS=compile,
# CUDA 13.0 there), ours only (no NCCL), 8 B - 64 MiB by factor 8, two rounds each, alternating.
# Carry target/bundle. Results: $OUT/issue36-ab.tgz (each run's JSON and table).
source "$(dirname "$0")/common.sh"
cache=$(mktemp -d)
export XDG_CACHE_HOME=$cache
P2P_KERNELS=compile timeout 120 "$here/p2p-bench" kernels >"$res/compile-cache.log" 2>&1
note "NVRTC compile into the cache: exit $?; $(head -n 1 "$res/compile-cache.log")"
for round in 1 2; do
  for mode in shipped compile; do
    P2P_KERNELS=$mode timeout 200 "$here/p2p-bench" coll --no-nccl --max-mib 64 --factor 8 \
      --samples 10 --out "$res/$mode-$round" >"$res/$mode-$round.md" 2>"$res/$mode-$round.err"
    note "coll $mode round $round: exit $?"
    pack
  done
done
