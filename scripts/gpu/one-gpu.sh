#!/usr/bin/env bash
# What a machine with ONE GPU (1 x H100, 1 x H200) can check of the multi-rank code:
# the one-GPU tests, then the collective suites with every rank on that GPU (ranks sharing a
# GPU: in one process their kernels run side by side, with one process each they time-slice).
# This checks the kernels' protocols (flags, steps, LL lines, scratch regions, copy-engine
# plans) at 2, 3 and 4 ranks, not the links: NVLink paths and performance need several GPUs.
#   bash target/bundle/one-gpu.sh PHASE [ARGS] [PHASE [ARGS]]...   (default: tests)
# Carry target/bundle. Each phase's results: $OUT/one-gpu-PHASE[-ARG].tgz (summary.txt first),
# packed after every step. Times on 1 x H100; a device command has 10 minutes.
#   tests              run.sh gpu1_ (the one-GPU tests), then the process-per-rank suite at
#                      2 ranks on the one GPU (counts P2PTEST_COUNTS, default 0,1,7,1023,65537).
#                      ~4-5 min.
#   coll [W [BUDGET]]  the one-process suite at W ranks (default 2) on the one GPU, each test
#                      on its own (60 s at most; the first 180 s, as it may compile the
#                      kernels) with its time, for BUDGET seconds (default 480).
#   diag W TEST...     the named one-process tests at W ranks with the library's debug log
#                      (P2PTEST_LOG, default debug), 90 s each. Takes every word after it.
#   procs [W]          the process-per-rank suite at W ranks (default 2). ~1-3 min.
#   sharings           the process-per-rank matrix at 2 ranks with P2P_CUMEM=0 (legacy IPC)
#                      and P2P_DISABLE=1 (host-staged). ~1 min.
#   host               p2p-bench host at 2 and 4 ranks on the GPU, HOST_ROUNDS rounds (default
#                      2; BASE=path: A/B against another build's p2p-bench, first in odd
#                      rounds, second in even ones; docs/performance.md, "Host cost of a
#                      call"). ~2 min.
#   compile            the time to a first communicator with an empty kernel cache (BASE=path:
#                      another build's p2p-bench after this one's; ROUNDS), then with a warm one
#                      (docs/performance.md, "The first compile and the kernel cache"). ~1 min
#                      a round.
#   extra              the examples with 2 ranks on the one GPU (p2p-bench launch, torchrun
#                      with 2 and 4), and the fault-injection suite with 2 ranks: FAULT_COUNT
#                      process faults (default 40) and STRANGER_TRIALS trials with a stranger
#                      (default 50), for at most FAULT_SECONDS (default 300). ~7-8 min.
source "$(dirname "$0")/common.sh"
REST=diag
if [ "$n" -lt 1 ]; then echo "one-gpu.sh: no GPU found" >&2; exit 1; fi
# Ranks of one process on one GPU wait for each other's kernels: give every stream its own
# hardware queue (CUDA's default of 8 lets two streams share one, and a kernel queued behind
# a waiting one could not start until the time limit).
# (Set CUDA_DEVICE_MAX_CONNECTIONS to try another value.)
export CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32} P2PTEST_SHARE_GPU=1
counts=${P2PTEST_COUNTS:-0,1,7,1023,65537}
# run_test EXE WORLD LIMIT TAG [ENV=VALUE...] [-- TEST-FILTER]: one test executable at WORLD ranks.
run_test() {
  local exe=$1 w=$2 limit=$3 tag=$4 log
  shift 4
  local -a envs=() args=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift && args=("$@")
  log=$res/$exe-w$w-$tag.log
  env "${envs[@]}" P2PTEST_WORLD="$w" P2PTEST_COUNTS="$counts" timeout "$limit" \
    "$here/tests/$exe" --include-ignored --test-threads=1 --nocapture "${args[@]}" >"$log" 2>&1
  note "world $w $exe $tag: exit $?: $(grep -E '^test result:' "$log" | tail -n 1)"
  grep -E '^test .* FAILED|WRONG|panicked|cases, [1-9]' "$log" | head -n 8 | tee -a "$res/summary.txt"
  pack
}
# each_test EXE WORLD PER_TEST BUDGET TAG: every test of EXE on its own at WORLD ranks (each
# ending at PER_TEST seconds), with its time, until BUDGET seconds have passed; one log each.
each_test() {
  local exe=$1 w=$2 per=$3 budget=$4 tag=$5 t0 t s rc ok=0 bad=0 left=0 log
  t0=$(date +%s)
  mkdir -p "$res/$exe-w$w-$tag"
  for t in $("$here/tests/$exe" --list --include-ignored 2>/dev/null | sed -n 's/: test$//p'); do
    if [ $(( $(date +%s) - t0 )) -ge "$budget" ]; then left=$((left + 1)); continue; fi
    log=$res/$exe-w$w-$tag/$t.log
    s=$(date +%s)
    # The first test on a fresh machine compiles the kernels (NVRTC, about 70 s on an H100,
    # cached after): give it two more minutes.
    local limit=$per
    [ $((ok + bad)) -eq 0 ] && limit=$((per + 120))
    P2PTEST_WORLD="$w" P2PTEST_COUNTS="$counts" timeout "$limit" \
      "$here/tests/$exe" "$t" --exact --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
    rc=$?
    if [ "$rc" -eq 0 ] && grep -q '^test result: ok. 1 passed' "$log"; then
      ok=$((ok + 1)); echo "ok $t ($(( $(date +%s) - s ))s)" >>"$res/$exe-w$w-$tag.txt"
    else
      bad=$((bad + 1)); echo "FAILED $t (exit $rc, $(( $(date +%s) - s ))s)" >>"$res/$exe-w$w-$tag.txt"
      grep -E 'panicked|^[A-Za-z]+\(|Stalled|wrong' "$log" | head -n 4 | sed 's/^/    /' >>"$res/$exe-w$w-$tag.txt"
    fi
  done
  note "world $w $exe $tag: $ok passed, $bad failed, $left not run (budget ${budget}s)"
  grep -A4 '^FAILED' "$res/$exe-w$w-$tag.txt" | head -n 20 | tee -a "$res/summary.txt"
  pack
}
phase_tests() {
  nvidia-smi -L >"$res/nvidia-smi.txt" 2>&1
  P2PTEST_SHARE_GPU='' timeout 200 "$here/run.sh" gpu1_ >"$res/run-gpu1.log" 2>&1
  note "run.sh gpu1_: $(tail -n 1 "$res/run-gpu1.log")"
  grep -E 'FAILED|no test summary' "$res/run-gpu1.log" | head -n 10 | tee -a "$res/summary.txt"
  cp -r "$here/bundle-logs" "$res/" 2>/dev/null
  pack
  run_test p2p-collective--gpu_coll_procs 2 130 shared
}

phase_coll() {
  each_test p2p-collective--gpu_coll "${1:-2}" 60 "${2:-480}" shared
}

phase_diag() {
  # diag W TEST...: the named one-process tests at W ranks, with the library's debug log
  # (P2PTEST_LOG, times from the start), 90 s each.
  local w=${1:-2} t
  shift
  for t in "$@"; do
    P2PTEST_LOG=${P2PTEST_LOG:-debug} P2PTEST_WORLD="$w" P2PTEST_COUNTS="$counts" timeout 90 \
      "$here/tests/p2p-collective--gpu_coll" "$t" --exact --include-ignored --nocapture \
      >"$res/$t.log" 2>&1
    note "diag $t at $w ranks: exit $?: $(grep -E '^test result:' "$res/$t.log" | tail -n 1)"
    pack
  done
}

phase_procs() {
  run_test p2p-collective--gpu_coll_procs "${1:-2}" 200 shared
}

phase_sharings() {
  local e
  for e in P2P_CUMEM=0 P2P_DISABLE=1; do
    run_test p2p-collective--gpu_coll_procs 2 60 "$e" "$e" -- gpu2_process_per_gpu_matrix
  done
}

phase_extra() {
  local w=2
  timeout 100 "$here/p2p-bench" launch -n "$w" -- "$here/examples/torchrun_job" >"$res/torchrun_job-launch-$w.log" 2>&1
  note "torchrun_job, p2p-bench launch -n $w: exit $?: $(grep -h wrong "$res/torchrun_job-launch-$w.log" | tail -n 1)"
  timeout 100 "$here/p2p-bench" launch -n "$w" -- "$here/examples/moe_dispatch" >"$res/moe_dispatch-launch-$w.log" 2>&1
  note "moe_dispatch, p2p-bench launch -n $w: exit $?: $(grep -h wrong "$res/moe_dispatch-launch-$w.log" | tail -n 1)"
  if command -v torchrun >/dev/null 2>&1; then
    for w in 2 4; do
      timeout 100 torchrun --standalone --nproc_per_node="$w" --no-python "$here/examples/torchrun_job" >"$res/torchrun_job-torchrun-$w.log" 2>&1
      note "torchrun_job, torchrun --standalone --nproc_per_node=$w: exit $?: $(grep -h wrong "$res/torchrun_job-torchrun-$w.log" | tail -n 1)"
    done
  else
    note "torchrun is not installed here: not run"
  fi
  pack
  # Process faults first, then the strangers' turns (at least 50 trials of them).
  local secs=${FAULT_SECONDS:-300}
  timeout $((secs + 90)) "$here/p2p-bench" faults -n 2 --faults "${FAULT_COUNT:-40}" \
    --stranger-trials "${STRANGER_TRIALS:-50}" --seconds "$secs" --out "$res" >"$res/faults.log" 2>&1
  note "faults -n 2 on one GPU: exit $?: $(tail -n 3 "$res/faults.log" | tr '\n' ' ')"
}

phase_host() {
  # p2p-bench host (docs/performance.md, "Host cost of a call"): the host's cost of one call, split
  # into the launch, the argument block and ours, with 2 and 4 ranks on the GPU, HOST_ROUNDS
  # rounds (default 2); with BASE=path (a p2p-bench of another tree, e.g. ../ab/p2p-bench-X)
  # that build runs first in odd rounds and second in even ones, so that what runs first (or
  # drift) does not favour either.
  local round w b tag f order
  for round in $(seq 1 "${HOST_ROUNDS:-2}"); do
    for w in 2 4; do
      order="${BASE:-} $here/p2p-bench"
      if [ $((round % 2)) -eq 0 ]; then order="$here/p2p-bench ${BASE:-}"; fi
      for b in $order; do
        if [ "$b" = "$here/p2p-bench" ]; then tag=new; else tag=base; fi
        f=$res/host-w$w-$tag-r$round
        timeout 150 "$b" host --share-gpu "$w" --samples "${HOST_SAMPLES:-50}" --json "$f.json" >"$f.md" 2>"$f.err"
        note "host, $w ranks, $tag, round $round: exit $?: $(tail -n 1 "$f.md")"
        pack
      done
    done
  done
}

phase_compile() {
  # The kernels' first compile (docs/performance.md, "The first compile and the kernel cache"): the
  # time to a communicator (p2p-bench host at 2 ranks, 5 samples) with an empty kernel cache, this
  # build then BASE's (a p2p-bench of another tree) if given, ROUNDS rounds (default 1); then this
  # build with its cache warm.
  # NVRTC 13's own cache (~/.nv/ComputeCache) stays off, or a repeat would not compile.
  local round b tag f cache t0 rc warm=
  export CUDA_CACHE_DISABLE=1
  for round in $(seq "${ROUNDS:-1}"); do
    for b in "$here/p2p-bench" ${BASE:-}; do
      if [ "$b" = "$here/p2p-bench" ]; then tag=new; else tag=base; fi
      f=$res/compile-$tag-r$round cache=$(mktemp -d /tmp/tmp.p2p-compile.XXXXXX)
      t0=$(date +%s.%N)
      XDG_CACHE_HOME=$cache P2P_DEBUG=info P2P_DEBUG_SUBSYS=mem timeout 300 "$b" host --share-gpu 2 --samples 5 >"$f.md" 2>"$f.err"
      rc=$?
      [ "$tag" = new ] && warm=$cache
      note "empty cache, $tag, round $round: exit $rc in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s; $(grep -o 'compiled in [0-9.]* s' "$f.err" | tr '\n' ' ')"
      pack
    done
  done
  t0=$(date +%s.%N)
  XDG_CACHE_HOME=$warm P2P_DEBUG=debug P2P_DEBUG_SUBSYS=mem timeout 300 "$here/p2p-bench" host --share-gpu 2 --samples 5 >"$res/compile-warm.md" 2>"$res/compile-warm.err"
  note "warm cache, new: exit $? in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s; $(grep -c 'kernel cache hit' "$res/compile-warm.err") cache hits, $(grep -c 'compiled in' "$res/compile-warm.err") compiles"
  rm -rf "$warm" /tmp/tmp.p2p-compile.*
}

run_phases tests "$@"
