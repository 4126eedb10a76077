#!/usr/bin/env bash
# Host cost of one kernel launch by the driver's entry points (perf-notes §38): cuLaunchKernel,
# cuLaunchKernelEx with no attribute and with programmatic dependent launch, with and without
# the collectives' 368-byte argument block, on one and two streams, and with the context
# switched among 1, 2 and 4 contexts (extra contexts on GPU 0 stand in for the GPUs one thread
# issues for). Needs nvcc and one GPU; no Rust. Run from the repository root:
#   bash scripts/gpu/launch-cost.sh [CALLS [SAMPLES [ROUNDS]]]
# Output: launch-cost/launch-cost.txt (copied into $OUT when set).
set -u
cd "$(dirname "$0")/../.."
res=launch-cost
mkdir -p "$res"
arch=${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
nvcc -arch="sm_$arch" -cubin -DKERNELS -o "$res/launch_cost.cubin" scripts/gpu/launch_cost.cu >"$res/build.log" 2>&1 &&
  nvcc -O2 -std=c++17 -o "$res/launch_cost" scripts/gpu/launch_cost.cu -lcuda >>"$res/build.log" 2>&1 ||
  { echo "build failed:"; cat "$res/build.log"; exit 1; }
for round in $(seq "${3:-2}"); do
  echo "## round $round"
  "$res/launch_cost" "$res/launch_cost.cubin" "${1:-200}" "${2:-50}" || echo "exit $?"
done | tee "$res/launch-cost.txt"
[ -n "${OUT:-}" ] && cp "$res/launch-cost.txt" "$OUT/"
exit 0
