#!/usr/bin/env bash
# The own part by the copy engine (perf-notes §34), on a machine of 2 GPUs, from the bundle
# (`cargo xtask bundle`; run from target/bundle): the suite's test for it, then RUNS rounds of
# `p2p-bench coll --ops all_gather,all_to_all` 4 MiB-1 GiB (plain buffers, NCCL beside), with
# the own part by the copy engine at every size (--ce-own-mib 0) and with the defaults.
# Environment: RUNS (default 2), SKIP_TESTS=1. Results: $OUT/own-ce.tgz.
source "$(dirname "$0")/common.sh"
cd "$here"
export P2PTEST_FIXTURES=$here/fixtures P2PTEST_BENCH_EXE=$here/p2p-bench
same_nccl
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 ./tests/p2p-collective--gpu_coll --include-ignored --test-threads=1 own_part \
    >"$res/gpu_coll-own_part.log" 2>&1
  note "gpu_coll own_part: exit $? ($(grep -E '^test result' "$res/gpu_coll-own_part.log" | tail -n 1))"
  pack
fi
coll_ab own "--ce-own-mib 0" --ops all_gather,all_to_all --min-bytes $((4 << 20)) --no-registered --samples 10
note "done"
pack
