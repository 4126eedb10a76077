#!/usr/bin/env bash
# The send/recv sweep of perf-notes §25, on a machine of 2+ GPUs with nvcc (the GPU machines
# have it; no Rust needed). Run from the repository root:
#   bash scripts/gpu/p2p-sweep.sh [VARIANT...]
# A variant is LABEL followed by :NAME=VALUE pairs, each replacing a #define of coll_abi.h
# (P2P_BLOCKS, P2P_SLOTS, P2P_CHUNK, P2P_MIN_CHUNK, P2P_PIPE_CHUNK, P2P_UNROLL, P2P_LL_BYTES, ...),
# e.g. `noll:P2P_LL_BYTES=0`; a bare LABEL is the header as it is. Each variant is the real
# p2p_sendrecv built by nvcc from coll_abi.h so edited and coll.cu without the collective kernels,
# plus harness.cuh and p2p_sweep.cu's host loop. Environment: ODD=1 adds an odd size after each power of two;
# MODE=pull|push GRID=N times a one-copy kernel (no inbox, no flags: the bound for send/recv on
# registered buffers) instead of the send/recv kernel. Output: p2p-sweep/ (one log per variant, sweep.txt), into
# $OUT/p2p-sweep.tgz when $OUT is set. (Not ncu: it serialises the two GPUs' kernels, and each
# waits for the other's.)
set -u
cd "$(dirname "$0")/../.."
res=p2p-sweep
mkdir -p "$res/bin"
variants=("$@")
if [ ${#variants[@]} -eq 0 ]; then
  variants=(
    current
    noll:P2P_LL_BYTES=0
    ll8k:P2P_LL_BYTES=8192
    ll128k:P2P_LL_BYTES=131072
    u1:P2P_UNROLL=1
  )
fi
arch=${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
build() {
  local label=$1 edits=(-e "") kv
  shift
  for kv in "$@"; do edits+=(-e "s/^#define ${kv%%=*} .*/#define ${kv%%=*} (${kv#*=})/"); done
  {
    sed -E "${edits[@]}" p2p-collective/src/kernels/coll_abi.h
    sed -e '/^COLL_KERNEL(coll_/d' p2p-collective/src/kernels/coll.cu
    cat scripts/gpu/harness.cuh scripts/gpu/p2p_sweep.cu
  } >"$res/bin/$label.cu"
  nvcc -O3 -std=c++17 -arch="sm_$arch" -o "$res/bin/$label" "$res/bin/$label.cu" >"$res/bin/$label.build.log" 2>&1
}
t0=$(date +%s)
pids=()
for v in "${variants[@]}"; do
  IFS=: read -r -a parts <<<"$v"
  build "${parts[@]}" &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
echo "built ${#variants[@]} variants for sm_$arch in $(( $(date +%s) - t0 )) s" | tee "$res/sweep.txt"
echo "# label bytes us GB/s-per-direction wrong" >>"$res/sweep.txt"
for v in "${variants[@]}"; do
  label=${v%%:*}
  if [ ! -x "$res/bin/$label" ]; then
    echo "$label: build failed: $(tail -n 3 "$res/bin/$label.build.log")" | tee -a "$res/sweep.txt"
    continue
  fi
  timeout 60 "$res/bin/$label" "$label" >"$res/$label.log" 2>&1
  echo "$label: exit $?" >>"$res/$label.log"
  cat "$res/$label.log" >>"$res/sweep.txt"
done
echo "total $(( $(date +%s) - t0 )) s" >>"$res/sweep.txt"
if [ -n "${OUT:-}" ]; then
  cp "$res/sweep.txt" "$OUT/"
  tar czf "$OUT/p2p-sweep.tgz" "$res"/*.txt "$res"/*.log "$res"/bin/*.build.log
fi
