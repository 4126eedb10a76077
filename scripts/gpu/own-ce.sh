#!/usr/bin/env bash
# The own part by the copy engine (perf-notes §34), on a machine of 2 GPUs, from the bundle
# (`cargo xtask bundle`; run from target/bundle): the suite's test for it, then RUNS rounds of
# `p2p-bench coll --ops all_gather,all_to_all` 4 MiB-1 GiB (plain buffers, NCCL beside), with
# the own part by the copy engine at every size (--ce-own-mib 0) and with the defaults; then
# each copy-engine copy split over two streams (perf-notes §36): its test, and registered
# all-gather and all-to-all 64 MiB-1 GiB by the copy engines (--ce-mib 64 in both arms) with
# --ce-streams 2 against the defaults.
# Usage: own-ce.sh [own|streams] (default both: may pass the device tool's 10 minutes; then
# run one phase a command). Environment: RUNS (default 2), SKIP_TESTS=1.
# Results: $OUT/own-ce.tgz.
phase=${1:-all}
source "$(dirname "$0")/common.sh"
cd "$here" || exit 1
export P2PTEST_FIXTURES=$here/fixtures P2PTEST_BENCH_EXE=$here/p2p-bench
export P2PTEST_COUNTS=${P2PTEST_COUNTS:-0,1,7,1023,65537,1000003}
same_nccl
if [ "$phase" != streams ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 ./tests/p2p-collective--gpu_coll --include-ignored --test-threads=1 own_part \
    >"$res/gpu_coll-own_part.log" 2>&1
  note "gpu_coll own_part: exit $? ($(grep -E '^test result' "$res/gpu_coll-own_part.log" | tail -n 1))"
  pack
fi
[ "$phase" != streams ] && coll_ab own "--ce-own-mib 0" --ops all_gather,all_to_all --min-bytes $((4 << 20)) --no-registered --samples 10
if [ "$phase" != own ] && [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 ./tests/p2p-collective--gpu_coll --include-ignored --test-threads=1 copy_engine_matrix \
    >"$res/gpu_coll-copy_engine_matrix.log" 2>&1
  note "gpu_coll copy_engine_matrix: exit $? ($(grep -E '^test result' "$res/gpu_coll-copy_engine_matrix.log" | tail -n 1))"
  pack
fi
[ "$phase" != own ] && coll_ab streams "--ce-streams 2" --ops all_gather,all_to_all --min-bytes $((64 << 20)) --ce-mib 64 --nccl-modes copy_engine,symmetric --samples 10
note "done"
pack
