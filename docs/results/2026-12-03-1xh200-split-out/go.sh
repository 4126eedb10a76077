#!/usr/bin/env bash
# go.sh COUNTS LIMIT WORLD... : the split-into-outputs and registered matrices at each world.
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=32 P2PTEST_SHARE_GPU=1
counts=$1 limit=$2; shift 2
for w in "$@"; do
  for t in gpu2_split_into_outputs_registered_matrix gpu2_registered_buffers_matrix; do
    s=$(date +%s)
    P2PTEST_WORLD=$w P2PTEST_COUNTS=$counts timeout $limit ./gpu_coll $t --exact --include-ignored --nocapture > $OUT/$t-w$w.log 2>&1
    echo "world $w $t: exit $? $(( $(date +%s) - s ))s: $(grep -E '^test result:' $OUT/$t-w$w.log | tail -1)" | tee -a $OUT/summary.txt
    grep -E 'panicked|WRONG|wrong|FAILED' $OUT/$t-w$w.log | head -5 | tee -a $OUT/summary.txt
  done
done
