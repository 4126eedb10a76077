#!/usr/bin/env bash
# The first run on a machine of 3 or more GPUs (nvidia-h200-x4) since 27038f7: what issues 12-15
# owe a 4-GPU machine, in three phases of under 10 minutes each (the device tool's limit a
# command), most needed first. Carry target/bundle (and .nccl-tests for phase bench).
#   x4.sh tests   the collective suites at 4 and 3 ranks in one process and one process per
#                 GPU (every test; counts P2PTEST_COUNTS, default 0,1,7,1023,65537, and
#                 1000003 at 4 ranks),
#                 the process-per-GPU matrix at 4 ranks with P2P_CUMEM=0 (legacy IPC) and
#                 P2P_DISABLE=1 (host-staged), the examples on every GPU (torchrun too), and
#                 the fault-injection suite with 4 ranks (FAULT_SECONDS, default 90).
#   x4.sh bench   topology, doctor, p2p-bench coll on every GPU beside NCCL's three modes, and
#                 nccl-tests (scale-a.sh with BENCH_ARGS, default --factor 4).
#   x4.sh ce      the copy engines on more than two ranks (perf-notes §35): all-gather and
#                 all-to-all from 16 MiB with --ce-more-ranks-mib 0 against the defaults, two
#                 rounds, at 4 then 3 ranks; then coll at 3 ranks (every op, --factor 4).
# Results: $OUT/x4-PHASE.tgz (summary.txt first), packed after every step.
phase=${1:-tests}
BATCH=x4-$phase
source "$(dirname "$0")/common.sh"
if [ "$n" -lt 3 ]; then note "x4.sh: needs 3 or more GPUs, found $n"; pack; exit 1; fi
case $phase in
  tests)
    for w in "$n" 3; do
      # The odd count 1000003 (many chunks, a ragged tail) at the full world size only: time.
      counts=0,1,7,1023,65537
      [ "$w" = "$n" ] && counts=$counts,1000003
      for exe in p2p-collective--gpu_coll p2p-collective--gpu_coll_procs; do
        log=$res/$exe-w$w.log
        P2PTEST_WORLD=$w P2PTEST_COUNTS=${P2PTEST_COUNTS:-$counts} timeout 240 "$here/tests/$exe" --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
        note "world $w $exe: exit $?: $(grep -E '^test result:' "$log" | tail -n 1)"
        grep -E '^test .* FAILED|^WRONG|panicked' "$log" | head -n 5 | tee -a "$res/summary.txt"
        pack
      done
    done
    for env in P2P_CUMEM=0 P2P_DISABLE=1; do
      log=$res/procs-matrix-$env-w$n.log
      env "$env" P2PTEST_WORLD="$n" P2PTEST_COUNTS=0,1,7,1023,65537 timeout 120 \
        "$here/tests/p2p-collective--gpu_coll_procs" gpu2_process_per_gpu_matrix --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
      note "world $n procs matrix $env: exit $?: $(grep -E '^test result:' "$log" | tail -n 1) ($(grep -m1 -o 'shared via [a-z -]*' "$log"))"
      pack
    done
    timeout 300 "$here/run.sh" examples >"$res/examples.log" 2>&1
    note "examples on $n GPUs: $(tail -n 1 "$res/examples.log")"
    grep -E '^== example|FAILED|wrong' "$res/examples.log" | tee -a "$res/summary.txt"
    cp -r "$here/bundle-logs" "$res/" 2>/dev/null
    pack
    timeout 200 "$here/p2p-bench" faults -n "$n" --seconds "${FAULT_SECONDS:-90}" --out "$res" >"$res/faults.log" 2>&1
    note "faults -n $n: exit $?: $(tail -n 3 "$res/faults.log" | tr '\n' ' ')"
    pack
    ;;
  bench)
    BATCH=x4-bench BENCH_ARGS=${BENCH_ARGS:---factor 4} bash "$here/scale-a.sh"
    ;;
  ce)
    same_nccl
    for w in "$n" 3; do
      RUNS=2 coll_ab "ce-w$w" "--ce-more-ranks-mib 0" --gpus "$w" --ops all_gather,all_to_all \
        --min-bytes 16777216 --nccl-modes copy_engine
    done
    timeout 300 "$here/p2p-bench" coll --gpus 3 --factor 4 --out "$res/coll-w3" >"$res/coll-w3.log" 2>&1
    note "coll on 3 GPUs: exit $?"
    pack
    ;;
  *) note "x4.sh: unknown phase $phase (tests, bench, ce)"; exit 2 ;;
esac
note "done"
