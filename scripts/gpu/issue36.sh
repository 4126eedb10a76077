#!/usr/bin/env bash
# Issue 36 on any machine with 1+ GPUs (carry target/bundle). Results: $OUT/issue36.tgz.
# 1. The downstream programs (.ci/downstream/cudarc-app, built against cudarc with CUDA 12.4,
#    12.8 and 13.0 bindings, and with candle-core 0.11's cudarc features: linked, CUDA 13.0) on
#    every GPU, cold: an empty kernel cache, twice each; each prints its init time and whether
#    libnvrtc was ever loaded (the kernels ship compiled). `issue36.sh downstream` stops there.
# 2. What a cold start cost before: p2p-bench kernels compiling the collective kernels with
#    NVRTC into an empty cache.
# 3. The doctor (driver version check, shipped kernels), the p2p-sys GPU tests (every driver
#    and NVRTC entry point resolves; the checkpoint API), then run.sh whole (RUN_TIMEOUT, 420 s).
source "$(dirname "$0")/common.sh"
{ nvidia-smi; ldconfig -p | grep -E 'libnvrtc|libcuda\.' ; } >"$res/machine.txt" 2>&1
note "GPUs: $n; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
for v in cuda-12040 cuda-12080 cuda-13000 candle; do
  for round in 1 2; do
    cache=$(mktemp -d)
    out=$(XDG_CACHE_HOME=$cache timeout 120 "$here/downstream/p2p-downstream-$v" 2>&1)
    note "downstream $v round $round: exit $?: $(tail -n 1 <<<"$out")"
    echo "$out" >"$res/downstream-$v-$round.log"
    rm -rf "$cache"
  done
done
[ "${1:-}" = downstream ] && { pack; exit 0; }
cache=$(mktemp -d)
XDG_CACHE_HOME=$cache timeout 180 "$here/p2p-bench" kernels >"$res/nvrtc-cold-compile.log" 2>&1
note "p2p-bench kernels into an empty cache (the compile a cold start paid before): exit $?: $(head -n 1 "$res/nvrtc-cold-compile.log")"
rm -rf "$cache"
timeout 120 "$here/p2p-bench" doctor >"$res/doctor.txt" 2>&1
note "doctor: exit $?; $(grep -E 'driver|kernels' "$res/doctor.txt" | head -n 4 | tr '\n' ' ')"
pack
for t in "$here"/tests/p2p-sys--gpu*; do
  timeout 120 "$t" --include-ignored --test-threads=1 --nocapture >"$res/$(basename "$t").log" 2>&1
  note "$(basename "$t"): exit $?; $(grep -E '^test result' "$res/$(basename "$t").log")"
done
pack
OUT= timeout "${RUN_TIMEOUT:-420}" bash "$here/run.sh" >"$res/run.log" 2>&1
note "run.sh: exit $?; $(tail -n 1 "$res/run.log")"
cp -r "$here/bundle-logs" "$res/" 2>/dev/null
pack
