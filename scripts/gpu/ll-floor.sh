#!/usr/bin/env bash
# Where a small all-reduce's time goes on 2 GPUs (perf-notes §28): the launch floor, the LL
# exchange floor and the real coll_f32_ll, per call under CUDA graph, with and without
# programmatic dependent launch (see ll_floor.cu). Needs nvcc and 2 GPUs (the GPU machines have
# both; no Rust). Run from the repository root: bash scripts/gpu/ll-floor.sh [REPLAYS].
# BASE=DIR also builds and runs DIR's coll_abi.h and coll.cu first (an A/B in one run; the
# harness needs run_ll's KIND/NR template parameters and the LL_PROBE marks there too).
# Output: ll-floor/ll-floor.txt (into $OUT when set).
set -u
cd "$(dirname "$0")/../.."
res=ll-floor
mkdir -p "$res"
arch=${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
# Two builds: as the library's (no marks) and with ll_probe.cuh's timing marks in run_ll.
build() {
  local name=$1 prelude=$2 flags=$3 src=${4:-p2p-collective/src/kernels}
  {
    cat "$src/coll_abi.h"
    [ -n "$prelude" ] && cat "$prelude"
    # Only coll_f32's kernels (the others cost compile time).
    sed -e '/^COLL_KERNEL(coll_/{/^COLL_KERNEL(coll_f32,/!d}' "$src/coll.cu"
    cat scripts/gpu/harness.cuh scripts/gpu/ll_floor.cu
  } >"$res/$name.cu"
  nvcc -O3 -std=c++17 -arch="sm_$arch" $flags -o "$res/$name" "$res/$name.cu" >"$res/$name.build.log" 2>&1
}
names="ll_floor ll_probe"
build ll_floor "" "" &
build ll_probe scripts/gpu/ll_probe.cuh -DLL_PROBE_ON &
if [ -n "${BASE:-}" ]; then
  names="ll_base ll_floor ll_base ll_floor ll_probe"
  build ll_base "" "" "$BASE" &
fi
wait
echo "# variant launch bytes us-per-call wrong ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))" >"$res/ll-floor.txt"
for name in $names; do
  if [ ! -x "$res/$name" ]; then
    echo "$name: build failed: $(tail -n 5 "$res/$name.build.log")" >>"$res/ll-floor.txt"
    continue
  fi
  echo "## $name" >>"$res/ll-floor.txt"
  timeout 120 "$res/$name" "${1:-20}" >>"$res/ll-floor.txt" 2>&1
  echo "$name: exit $?" >>"$res/ll-floor.txt"
done
[ -n "${OUT:-}" ] && cp "$res/ll-floor.txt" "$OUT/"
cat "$res/ll-floor.txt"
