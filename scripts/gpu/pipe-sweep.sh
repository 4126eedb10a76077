#!/usr/bin/env bash
# The pipelined one-shot all-reduce of perf-notes §33, on a machine of 2 GPUs, from the bundle
# (`cargo xtask bundle`; run from target/bundle). In order:
#   1. the collective suites (one process; process per GPU), with a count in the pipelined range;
#   2. ours only, f32 all-reduce 512 KiB-32 MiB: the defaults (one-shot) against the pipelined
#      kernel (--pipe-max-kib 16384) at sub-pieces of SUBS KiB and BLOCKS KiB per block;
#   3. RUNS runs of `p2p-bench coll --ops all_reduce` (f32, bf16) 64 KiB-64 MiB beside NCCL, with
#      the pipelined kernel on (PIPE_FLAGS, default --pipe-max-kib 16384) and with the defaults:
#      the before and after in one session.
# Environment: SKIP_TESTS=1, SKIP_SWEEP=1, SUBS (default "2 4 8 16"), BLOCKS (default "8 16"),
# RUNS (default 2), PIPE_FLAGS (the knobs of step 3's pipelined runs, e.g. after the sweep). Results: $OUT/pipe-sweep.tgz (logs, summary.txt, every results folder).
source "$(dirname "$0")/common.sh"
cd "$here"
export P2PTEST_FIXTURES=$here/fixtures P2PTEST_BENCH_EXE=$here/p2p-bench
same_nccl
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  export P2PTEST_COUNTS=0,1,7,1023,65537,1000003
  for t in gpu_coll gpu_coll_procs; do
    timeout 300 "./tests/p2p-collective--$t" --include-ignored --test-threads=1 >"$res/$t.log" 2>&1
    note "$t: exit $? ($(grep -E '^test result' "$res/$t.log" | tail -n 1))"
    pack
  done
  unset P2PTEST_COUNTS
fi
sweep() {
  local tag=$1; shift
  timeout 120 ./p2p-bench coll --ops all_reduce --types float --min-bytes $((512 << 10)) --max-mib 32 \
    --samples 10 --no-nccl --no-registered --graph-max-mib 32 --out "$res/sweep-$tag" "$@" \
    >"$res/sweep-$tag.log" 2>&1
  note "sweep $tag ($*): exit $?"
}
if [ "${SKIP_SWEEP:-0}" != 1 ]; then
  sweep oneshot
  for bk in ${BLOCKS:-8 16}; do
    for sk in ${SUBS:-2 4 8 16}; do
      sweep "b$bk-s$sk" --pipe-max-kib 16384 --block-kib "$bk" --pipe-sub-kib "$sk"
    done
  done
  sweep oneshot-again
  pack
fi
coll_ab pipe "${PIPE_FLAGS:---pipe-max-kib 16384}" --ops all_reduce --min-bytes $((64 << 10)) --max-mib 64 --samples 20
note "done"
pack
