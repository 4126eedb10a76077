#!/usr/bin/env bash
# The first run on a machine of 3 or more GPUs (nvidia-h200-x4) since 27038f7: what issues 12-15
# owe a 4-GPU machine, in phases whose step limits add up to under the device tool's 10 minutes
# a command, most needed first. Carry target/bundle (and .nccl-tests for phase bench).
#   x4.sh tests   the collective suites at the full world size in one process and one process
#                 per GPU (every test; counts P2PTEST_COUNTS, default 0,1,7,1023,65537,1000003),
#                 then the process-per-GPU matrix with P2P_CUMEM=0 (legacy IPC) and
#                 P2P_DISABLE=1 (host-staged).
#   x4.sh more    the suites at 3 ranks (counts 0,1,7,1023,65537; skipped on a 3-GPU machine),
#                 the examples on every GPU (p2p-bench launch and torchrun), and the
#                 fault-injection suite on every GPU (FAULT_SECONDS, default 90).
#   x4.sh bench   topology, doctor, p2p-bench coll on every GPU beside NCCL's three modes, and
#                 nccl-tests (scale-a.sh with BENCH_ARGS, default --factor 4).
#   x4.sh bench3  p2p-bench coll on 3 GPUs beside NCCL's three modes (--factor 4).
#   x4.sh ce [W]  the copy engines on more than two ranks (perf-notes §35) at W ranks (default
#                 every GPU): all-gather and all-to-all from 16 MiB with --ce-more-ranks-mib 0
#                 against the defaults, two rounds.
#   x4.sh host    p2p-bench host on 2, 3 and every GPU, two rounds (perf-notes §38; ~2 min).
#   x4.sh world W both collective suites at W ranks (counts 0,1,7,1023,65537): the smaller world
#                 sizes of a larger machine (issue 16: 2 and 4 on the 8-GPU one).
# Results: $OUT/x4-PHASE[-ARG].tgz (summary.txt first), packed after every step.
phase=${1:-tests}
BATCH=x4-$phase${2:+-$2}
source "$(dirname "$0")/common.sh"
finish() { note "${1:-done}"; pack; }
if [ "$n" -lt 3 ]; then finish "x4.sh: needs 3 or more GPUs, found $n"; exit 1; fi
# suite WORLD COUNTS LIMIT_GPU_COLL LIMIT_PROCS: both correctness suites at WORLD ranks.
suite() {
  local w=$1 counts=$2 exe limit log
  for exe in p2p-collective--gpu_coll p2p-collective--gpu_coll_procs; do
    limit=$3
    [ "$exe" = p2p-collective--gpu_coll_procs ] && limit=$4
    log=$res/$exe-w$w.log
    P2PTEST_WORLD=$w P2PTEST_COUNTS=${P2PTEST_COUNTS:-$counts} timeout "$limit" "$here/tests/$exe" --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
    note "world $w $exe: exit $?: $(grep -E '^test result:' "$log" | tail -n 1)"
    grep -E '^test .* FAILED|^WRONG|panicked' "$log" | head -n 5 | tee -a "$res/summary.txt"
    pack
  done
}
case $phase in
  tests)
    suite "$n" 0,1,7,1023,65537,1000003 300 150
    for env in P2P_CUMEM=0 P2P_DISABLE=1; do
      log=$res/procs-matrix-$env-w$n.log
      env "$env" P2PTEST_WORLD="$n" P2PTEST_COUNTS=0,1,7,1023,65537 timeout 60 \
        "$here/tests/p2p-collective--gpu_coll_procs" gpu2_process_per_gpu_matrix --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
      note "world $n procs matrix $env: exit $?: $(grep -E '^test result:' "$log" | tail -n 1) ($(grep -m1 -o 'shared via [^,)]*' "$log"))"
      pack
    done
    ;;
  more)
    [ "$n" -gt 3 ] && suite 3 0,1,7,1023,65537 180 90
    timeout 150 "$here/run.sh" examples >"$res/examples.log" 2>&1
    note "examples on $n GPUs: $(tail -n 1 "$res/examples.log")"
    grep -E '^== example|FAILED|wrong' "$res/examples.log" | tee -a "$res/summary.txt"
    cp -r "$here/bundle-logs" "$res/" 2>/dev/null
    pack
    timeout 150 "$here/p2p-bench" faults -n "$n" --seconds "${FAULT_SECONDS:-90}" --out "$res" >"$res/faults.log" 2>&1
    note "faults -n $n: exit $?: $(tail -n 3 "$res/faults.log" | tr '\n' ' ')"
    ;;
  bench)
    BATCH=x4-bench BENCH_ARGS=${BENCH_ARGS:---factor 4} bash "$here/scale-a.sh"
    ;;
  ce)
    w=${2:-$n}
    same_nccl
    RUNS=2 COLL_TIMEOUT=130 coll_ab "ce-w$w" "--ce-more-ranks-mib 0" --gpus "$w" \
      --ops all_gather,all_to_all --min-bytes 16777216 --nccl-modes copy_engine
    ;;
  bench3)
    same_nccl
    timeout 540 "$here/p2p-bench" coll --gpus 3 --factor 4 --out "$res/coll-w3" >"$res/coll-w3.md" 2>"$res/coll-w3.err"
    note "coll on 3 GPUs: exit $? ($(grep -c WRONG "$res/coll-w3.err") WRONG lines)"
    ;;
  host)
    # p2p-bench host (perf-notes §38): the host's cost of one call split, on 2, 3 and every GPU,
    # two rounds (about 10 s each; no NCCL).
    for round in 1 2; do
      for w in $(printf '%s\n' 2 3 "$n" | sort -un); do
        f=$res/host-w$w-r$round
        timeout 120 "$here/p2p-bench" host --gpus "$w" --samples 50 --json "$f.json" >"$f.md" 2>"$f.err"
        note "host on $w GPUs, round $round: exit $?: $(tail -n 1 "$f.md")"
        pack
      done
    done
    ;;
  world)
    w=${2:-2}
    if [ "$w" -lt 2 ] || [ "$w" -gt "$n" ]; then finish "x4.sh world: W must be 2 to $n, not $w"; exit 2; fi
    suite "$w" 0,1,7,1023,65537 240 150
    ;;
  *) finish "x4.sh: unknown phase $phase (tests, more, bench, bench3, ce, host, world)"; exit 2 ;;
esac
finish
