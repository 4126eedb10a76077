#!/usr/bin/env bash
# The send/recv sweep of perf-notes §25, on a machine of 2+ GPUs with nvcc (the GPU machines
# have it; no Rust needed). Run from the repository root:
#   bash scripts/gpu/p2p-sweep.sh [VARIANT...]
# A variant is LABEL:LANES:SLOTS:CHUNK_KIB:MIN_CHUNK:UNROLL[:PIPE_KIB] (MIN_CHUNK in bytes;
# MIN_CHUNK equal to the chunk gives the fixed chunks of §24; PIPE_KIB defaults to CHUNK_KIB). Each variant is the real p2p_sendrecv built by nvcc
# from coll_abi.h with those constants and coll.cu without the collective kernels, plus
# p2p_sweep.cu's host loop. Output: p2p-sweep/ (one log per variant, sweep.txt), into
# $OUT/p2p-sweep.tgz when $OUT is set. (Not ncu: it serialises the two GPUs' kernels, and each
# waits for the other's.)
set -u
cd "$(dirname "$0")/../.."
res=p2p-sweep
mkdir -p "$res/bin"
variants=("$@")
if [ ${#variants[@]} -eq 0 ]; then
  variants=(
    fixed64-u1:32:2:64:65536:1
    adapt-u1:32:2:64:4096:1
    adapt-u4:32:2:64:4096:4
    adapt-u8:32:2:64:4096:8
    l64-u4:64:2:64:4096:4
    s4-u4:32:4:64:4096:4
    c128-u4:32:2:128:4096:4
    c32-s4-u4:32:4:32:4096:4
    l64-s4-u4:64:4:64:4096:4
    l64-u1:64:2:64:4096:1
  )
fi
arch=${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
build() {
  local label=$1 lanes=$2 slots=$3 kib=$4 min=$5 unroll=$6 pipe=${7:-$4}
  {
    sed -E -e "s/^#define P2P_BLOCKS .*/#define P2P_BLOCKS $lanes/" \
      -e "s/^#define P2P_SLOTS .*/#define P2P_SLOTS $slots/" \
      -e "s/^#define P2P_CHUNK .*/#define P2P_CHUNK ($kib * 1024)/" \
      -e "s/^#define P2P_MIN_CHUNK .*/#define P2P_MIN_CHUNK $min/" \
      -e "s/^#define P2P_UNROLL .*/#define P2P_UNROLL $unroll/" \
      -e "s/^#define P2P_PIPE_CHUNK .*/#define P2P_PIPE_CHUNK ($pipe * 1024)/" \
      p2p-collective/src/kernels/coll_abi.h
    sed -e '/^COLL_KERNEL(coll_/d' p2p-collective/src/kernels/coll.cu
    cat scripts/gpu/p2p_sweep.cu
  } >"$res/bin/$label.cu"
  nvcc -O3 -std=c++17 -arch="sm_$arch" -o "$res/bin/$label" "$res/bin/$label.cu" >"$res/bin/$label.build.log" 2>&1
}
t0=$(date +%s)
pids=()
for v in "${variants[@]}"; do
  IFS=: read -r label lanes slots kib min unroll pipe <<<"$v"
  build "$label" "$lanes" "$slots" "$kib" "$min" "$unroll" "${pipe:-$kib}" &
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
