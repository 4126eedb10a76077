#!/usr/bin/env bash
# go.sh COUNTS LIMIT TEST:WORLD[:check]... : each test of the release `gpu_coll` at its world
# size, ranks sharing the one GPU; `:check` runs it in checking mode (P2P_CHECK=1).
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 P2PTEST_SHARE_GPU=1
counts=$1 limit=$2; shift 2
for spec in "$@"; do
  IFS=: read -r t w mode <<<"$spec"
  check=0 tag=$t-w$w
  [ "$mode" = check ] && check=1 tag=$tag-check
  s=$(date +%s)
  P2P_CHECK=$check P2PTEST_WORLD=$w P2PTEST_COUNTS=$counts timeout "$limit" ./gpu_coll "$t" --exact --include-ignored --nocapture >"$OUT/$tag.log" 2>&1
  echo "world $w $t${mode:+ ($mode)}: exit $? $(($(date +%s) - s))s: $(grep -E '^test result:' "$OUT/$tag.log" | tail -1)" | tee -a "$OUT/summary.txt"
  grep -E 'panicked|WRONG|wrong|FAILED' "$OUT/$tag.log" | head -5 | tee -a "$OUT/summary.txt"
done
