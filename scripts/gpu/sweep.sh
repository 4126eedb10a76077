#!/usr/bin/env bash
# Tuning sweeps: the planner's knobs through p2p-bench, and nvcc harnesses of the real kernels
# (harness/, no Rust needed for those), on a machine of 2+ GPUs (launch-cost: one GPU):
#   bash target/bundle/sweep.sh PHASE [ARGS] [PHASE [ARGS]]...   (no default)
# or, for the nvcc phases, from the repository: bash scripts/gpu/sweep.sh ll-floor. Carry
# target/bundle for the p2p-bench phases; the nvcc phases need nvcc and the repository copy
# (p2p-collective/src/kernels). Each phase's results: $OUT/sweep-PHASE[-ARG].tgz (summary.txt
# first; the nvcc phases also copy their table into $OUT). Times on 2 x H200.
#   pipe        the pipelined one-shot all-reduce (docs/performance.md, "The pipelined one-shot
#               all-reduce"): the collective suites (one process; process per GPU) with a count in
#               the pipelined range (SKIP_TESTS=1: not); ours only, f32 all-reduce 512 KiB-32 MiB,
#               the defaults (one-shot) against the pipelined kernel (--pipe-max-kib 16384) at
#               sub-pieces of SUBS KiB (default "2 4 8 16") and BLOCKS KiB per block
#               (default "8 16") (SKIP_SWEEP=1: not); then RUNS (default 2) runs of `p2p-bench
#               coll --ops all_reduce` 64 KiB-64 MiB beside NCCL with the pipelined kernel on
#               (PIPE_FLAGS, default --pipe-max-kib 16384) and with the defaults. ~6 min.
#   own-ce      the own part by the copy engine (docs/performance.md, "The own part by the copy
#               engine"): its test, then RUNS rounds of all-gather and all-to-all 4 MiB-1 GiB (plain
#               buffers, NCCL beside) with --ce-own-mib 0 against the defaults (SKIP_TESTS=1: no
#               test). ~5 min.
#   ce-streams  each copy-engine copy split over two streams (docs/performance.md, "Copy engines for
#               all-gather and all-to-all"): its test (copy_engine_matrix), then registered
#               all-gather and all-to-all 64 MiB-1 GiB by the copy engines (--ce-mib 64 in both
#               arms) with --ce-streams 2 against the defaults, RUNS rounds. ~5 min.
#   planner [W...]  the planner's choices against each forced alternative, ours only, at each W
#               ranks (default every size from the GPU count down to 2; one size a command on
#               4+ GPUs): f32 all-reduce with each algorithm forced (one-shot, two-shot, ring
#               from 64 KiB; LL to 1 MiB) and with LL off; every collective with LL off to
#               4 MiB; broadcast and reduce without the split, 256 KiB-64 MiB. 120 s a run,
#               ~4-8 min a size.
#   ll-floor [REPLAYS]  where a small all-reduce's time goes on 2 GPUs (docs/performance.md,
#               "All-reduce, LL"): the launch floor, the LL exchange floor and the real coll_f32_ll,
#               per call under CUDA graph, with and without programmatic dependent launch
#               (harness/ll_floor.cu; REPLAYS default 20). BASE=DIR (another tree's
#               p2p-collective/src/kernels) also builds and runs DIR's kernels first (an A/B in one
#               run; it needs run_ll's KIND/NR template parameters and the LL_PROBE marks). Needs
#               nvcc, 2 GPUs. ~2 min.
#   p2p [VARIANT...]  the send/recv sweep (docs/performance.md, "Send and receive"): the real
#               p2p_sendrecv built by nvcc from coll_abi.h (each VARIANT: LABEL then :NAME=VALUE
#               pairs, each replacing a #define of coll_abi.h, e.g. noll:P2P_LL_BYTES=0; a bare
#               LABEL is the header as it is; default: current, noll, ll8k, ll128k, u1) and coll.cu
#               without the collective kernels, with harness/p2p_sweep.cu's host loop. ODD=1 adds an
#               odd size after each power of two; MODE=pull|push GRID=N times a one-copy kernel (the
#               bound for send/recv on registered buffers) instead. Takes every word after it, so it
#               comes last. Needs nvcc, 2 GPUs. ~1 min a variant. (Not ncu: it serialises the two
#               GPUs' kernels, and each waits for the other's.)
#   launch-cost [CALLS [SAMPLES [ROUNDS]]]  the host cost of one kernel launch by the driver's entry
#               points (docs/performance.md, "Host cost of a call"; harness/launch_cost.cu):
#               cuLaunchKernel, cuLaunchKernelEx with no attribute and with programmatic dependent
#               launch, with and without the collectives' 376-byte argument block, on one and two
#               streams, and with the context switched among 1, 2 and 4 contexts. Needs nvcc, 1 GPU.
#               ~1 min.
source "$(dirname "$0")/common.sh"
REST=p2p
harness=$here/harness
kernels=$root/p2p-collective/src/kernels
arch() { echo "${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}"; }
# work: the nvcc phases' sources and binaries, outside the results.
workdir() { work=$here/build/$name; rm -rf "$work"; mkdir -p "$work"; }
# coll_include DIR FILE: the line that includes FILE of the kernels folder DIR's coll/ (each
# header includes what it uses, so nvcc needs nothing else).
coll_include() {
  if [ ! -f "$1/coll/$2" ]; then
    echo "no $1/coll/$2 (a tree from before the kernels were split by algorithm?)" >&2
    return 1
  fi
  echo "#include \"$(cd "$1" && pwd)/coll/$2\""
}

phase_pipe() {
  local t bk sk
  need 2 || exit 0
  same_nccl
  if [ "${SKIP_TESTS:-0}" != 1 ]; then
    for t in gpu_coll gpu_coll_procs; do
      P2PTEST_COUNTS=0,1,7,1023,65537,1000003 timeout 300 "$here/tests/p2p-collective--$t" --include-ignored --test-threads=1 >"$res/$t.log" 2>&1
      note "$t: exit $? ($(grep -E '^test result' "$res/$t.log" | tail -n 1))"
      pack
    done
  fi
  sweep() {
    local tag=$1; shift
    timeout 120 "$here/p2p-bench" coll --ops all_reduce --types float --min-bytes $((512 << 10)) --max-mib 32 \
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
}

# ce_test FILTER: the one-process suite's tests FILTER names (counts up to 1000003).
ce_test() {
  [ "${SKIP_TESTS:-0}" = 1 ] && return
  P2PTEST_COUNTS=${P2PTEST_COUNTS:-0,1,7,1023,65537,1000003} timeout 300 "$here/tests/p2p-collective--gpu_coll" \
    --include-ignored --test-threads=1 "$1" >"$res/gpu_coll-$1.log" 2>&1
  note "gpu_coll $1: exit $? ($(grep -E '^test result' "$res/gpu_coll-$1.log" | tail -n 1))"
  pack
}

phase_own-ce() {
  need 2 || exit 0
  same_nccl
  ce_test own_part
  coll_ab own "--ce-own-mib 0" --ops all_gather,all_to_all --min-bytes $((4 << 20)) --no-registered --samples 10
}

phase_ce-streams() {
  need 2 || exit 0
  same_nccl
  ce_test copy_engine_matrix
  coll_ab streams "--ce-streams 2" --ops all_gather,all_to_all --min-bytes $((64 << 20)) --ce-mib 64 --nccl-modes copy_engine,symmetric --samples 10
}

phase_planner() {
  local w algo
  local -a worlds=("$@") sweep
  need 2 || exit 0
  [ ${#worlds[@]} -eq 0 ] && mapfile -t worlds < <(seq "$n" -1 2)
  # planner_run TAG ARGS...: one run of ours into $res/TAG, 120 s at most.
  planner_run() {
    local tag=$1; shift
    timeout "${SWEEP_TIMEOUT:-120}" "$here/p2p-bench" coll "$@" --out "$res/$tag" >"$res/$tag.md" 2>"$res/$tag.err"
    note "$tag ($*): exit $?; $(grep -c WRONG "$res/$tag.err") WRONG lines"
  }
  for w in "${worlds[@]}"; do
    if [ "$w" -lt 2 ] || [ "$w" -gt "$n" ]; then note "planner: W must be 2 to $n, not $w"; exit 2; fi
    sweep=(--gpus "$w" --ops all_reduce --types float --no-nccl --samples 10)
    for algo in oneshot twoshot ring; do
      P2P_ALGO=$algo planner_run "sweep-$algo-w$w" "${sweep[@]}" --min-bytes 65536 --factor 4 --graph-max-mib 4
    done
    P2P_ALGO=ll planner_run "sweep-ll-w$w" "${sweep[@]}" --max-mib 1
    planner_run "sweep-noll-w$w" "${sweep[@]}" --max-mib 1 --ll-kib 0
    pack
    sweep=(--gpus "$w" --no-nccl --no-registered --samples 10 --types float)
    planner_run "sweep-noll-all-w$w" "${sweep[@]}" --max-mib 4 --ll-kib 0
    planner_run "sweep-nosplit-w$w" "${sweep[@]}" --ops broadcast,reduce --min-bytes 262144 --max-mib 64 --split-kib 1048576
    pack
  done
}

phase_ll-floor() {
  local arch names v
  need 2 || exit 0
  arch=$(arch)
  workdir
  # ll_build NAME PRELUDE FLAGS [DIR]: the library's LL kernels for f32 (from DIR, default the
  # repository's kernels), PRELUDE in front of them, then the harness.
  ll_build() {
    local bin=$1 prelude=$2 flags=$3 src=${4:-$kernels}
    {
      [ -n "$prelude" ] && cat "$prelude"
      coll_include "$src" proto/ll.cuh
      cat "$harness/harness.cuh" "$harness/ll_floor.cu"
    } >"$work/$bin.cu"
    # Only the f32 part (COLL_PART=0): the other types cost compile time.
    # shellcheck disable=SC2086 # no flags or one
    timeout 300 nvcc -O3 -std=c++17 -arch="sm_$arch" -DCOLL_PART=0 $flags -o "$work/$bin" "$work/$bin.cu" >"$res/$bin.build.log" 2>&1
  }
  # Two builds: as the library's (no marks) and with ll_probe.cuh's timing marks in run_ll.
  names="ll_floor ll_probe"
  ll_build ll_floor "" "" &
  ll_build ll_probe "$harness/ll_probe.cuh" -DLL_PROBE_ON &
  if [ -n "${BASE:-}" ]; then
    names="ll_base ll_floor ll_base ll_floor ll_probe"
    ll_build ll_base "" "" "$BASE" &
  fi
  wait
  {
    echo "# variant launch bytes us-per-call wrong ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1))"
    for v in $names; do
      if [ ! -x "$work/$v" ]; then
        echo "$v: build failed: $(tail -n 5 "$res/$v.build.log")"
        continue
      fi
      echo "## $v"
      timeout 120 "$work/$v" "${1:-20}" 2>&1
      echo "$v: exit $?"
    done
  } >"$res/ll-floor.txt"
  if [ -n "${OUT:-}" ]; then cp "$res/ll-floor.txt" "$OUT/"; fi
  cat "$res/ll-floor.txt"
}

phase_p2p() {
  local arch t0 v label p
  local -a variants=("$@") parts pids=()
  need 2 || exit 0
  if [ ${#variants[@]} -eq 0 ]; then
    variants=(current noll:P2P_LL_BYTES=0 ll8k:P2P_LL_BYTES=8192 ll128k:P2P_LL_BYTES=131072 u1:P2P_UNROLL=1)
  fi
  arch=$(arch)
  workdir
  # p2p_build LABEL [NAME=VALUE...]: the send/recv kernel (the send/recv part, COLL_PART=7) from
  # a copy of the kernels whose coll_abi.h has those #defines, and the harness.
  p2p_build() {
    local label=$1 kv
    local -a edits=(-e "")
    shift
    for kv in "$@"; do edits+=(-e "s/^#define ${kv%%=*} .*/#define ${kv%%=*} (${kv#*=})/"); done
    rm -rf "$work/$label-kernels"
    cp -r "$kernels" "$work/$label-kernels"
    sed -E -i "${edits[@]}" "$work/$label-kernels/coll_abi.h"
    {
      coll_include "$work/$label-kernels" p2p.cuh
      cat "$harness/harness.cuh" "$harness/p2p_sweep.cu"
    } >"$work/$label.cu"
    timeout 300 nvcc -O3 -std=c++17 -arch="sm_$arch" -DCOLL_PART=7 -o "$work/$label" "$work/$label.cu" >"$res/$label.build.log" 2>&1
  }
  t0=$(date +%s)
  for v in "${variants[@]}"; do
    IFS=: read -r -a parts <<<"$v"
    p2p_build "${parts[@]}" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  echo "built ${#variants[@]} variants for sm_$arch in $(( $(date +%s) - t0 )) s" | tee "$res/sweep.txt"
  echo "# label bytes us GB/s-per-direction wrong" >>"$res/sweep.txt"
  for v in "${variants[@]}"; do
    label=${v%%:*}
    if [ ! -x "$work/$label" ]; then
      echo "$label: build failed: $(tail -n 3 "$res/$label.build.log")" | tee -a "$res/sweep.txt"
      continue
    fi
    timeout 60 "$work/$label" "$label" >"$res/$label.log" 2>&1
    echo "$label: exit $?" >>"$res/$label.log"
    cat "$res/$label.log" >>"$res/sweep.txt"
    pack
  done
  echo "total $(( $(date +%s) - t0 )) s" >>"$res/sweep.txt"
  if [ -n "${OUT:-}" ]; then cp "$res/sweep.txt" "$OUT/"; fi
}

phase_launch-cost() {
  local arch round
  need 1 || exit 0
  arch=$(arch)
  workdir
  if ! { timeout 300 nvcc -arch="sm_$arch" -cubin -DKERNELS -o "$work/launch_cost.cubin" "$harness/launch_cost.cu" &&
    timeout 300 nvcc -O2 -std=c++17 -o "$work/launch_cost" "$harness/launch_cost.cu" -lcuda; } >"$res/build.log" 2>&1; then
    note "build failed: $(tail -n 5 "$res/build.log")"
    exit 1
  fi
  for round in $(seq "${3:-2}"); do
    echo "## round $round"
    timeout 120 "$work/launch_cost" "$work/launch_cost.cubin" "${1:-200}" "${2:-50}" || echo "exit $?"
  done | tee "$res/launch-cost.txt"
  if [ -n "${OUT:-}" ]; then cp "$res/launch-cost.txt" "$OUT/"; fi
}

run_phases "" "$@"
