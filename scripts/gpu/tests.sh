#!/usr/bin/env bash
# The correctness suites on a machine of 2+ GPUs (one GPU: one-gpu.sh), from the bundle:
#   bash target/bundle/tests.sh PHASE [ARGS] [PHASE [ARGS]]...   (default: run)
# Carry target/bundle. Each phase's results: $OUT/tests-PHASE[-ARG].tgz (summary.txt first),
# packed after every step. Times are on 2-4 x H100/H200; a device command has 10 minutes.
#   suites        both collective suites at every GPU (`gpu_coll` one process, `gpu_coll_procs`
#                 one process per GPU; every test, counts P2PTEST_COUNTS, default
#                 0,1,7,1023,65537,1000003; limits 300 s and 150 s), then the process-per-GPU
#                 matrix with P2P_CUMEM=0 (legacy IPC) and P2P_DISABLE=1 (host-staged), 60 s
#                 each. ~5-8 min at 4 ranks.
#   world [W...]  both suites at each W ranks (default: every size from the GPU count down to
#                 2; counts default 0,1,7,1023,65537; limits TEST_TIMEOUT, default 240 s, and
#                 PROCS_TIMEOUT, 150 s; GPU_COLL_FILTER: test-name filters for `gpu_coll`).
#                 ~1-3 min a size.
#   sharings [W]  the process-per-GPU matrix at W ranks (default every GPU) with P2P_CUMEM=0
#                 and P2P_DISABLE=1 (the peer layer's other sharings), 60 s each.
#   examples      the example programs on every GPU: one process, `p2p-bench launch`, torchrun
#                 (run.sh examples, 150 s).
#   downstream    the downstream programs the bundle carries (.ci/downstream/cudarc-app against
#                 cudarc 0.19's CUDA 12.4, 12.8 and 13.0 bindings, candle-core 0.11's cudarc
#                 features, and cudarc 0.18 and 0.17) on every GPU, cold (an empty kernel
#                 cache), twice each: init time, and whether libnvrtc was ever loaded (the
#                 kernels ship compiled). ~1.5 min.
#   sys           a cold start's compile as it was (p2p-bench kernels: NVRTC into an empty
#                 cache), the doctor (driver version, shipped kernels), then p2p-sys's GPU tests
#                 (every driver and NVRTC entry point resolves; the checkpoint API). ~1-2 min.
#   candle        candle-core 0.11 itself beside p2p (candle tensors all-reduced by p2p), twice.
#                 Needs downstream/p2p-downstream-candle-core in the bundle, from
#                 `.ci/downstream/candle.sh build`. ~1 min.
#   hosts         a job over two simulated hosts (MultiHostCommunicator; 4 GPUs, libnccl, torch):
#                 the correctness matrix (every op, type, reduction, counts P2PTEST_COUNTS,
#                 default 0,1,7,1023,65537, and 1000) under `p2p-bench launch -n 4 --hosts 2` and
#                 under two torchruns (`--nnodes 2`, one per host: GPUs 0,1 and 2,3, P2P_HOST_ID
#                 and NCCL_HOSTID per host, one MASTER_PORT), then the time beside NCCL's own
#                 communicator on the same hosts (NCCL_DEBUG=INFO for NET: which transport NCCL
#                 took between them), then a rank's death on the other host (under `p2p-bench
#                 launch`, then under two torchruns), `send`/`recv` alone across and inside the
#                 hosts. ~1-2 min (at most 9).
#   hostbench     `p2p-bench hosts` on the same two simulated hosts: every collective to
#                 HOSTS_MAX_MIB (64) beside NCCL's own communicator, JSON and table. ~20 s.
#   run [FILTER]  run.sh: every test executable and the examples (or those FILTER names),
#                 with a summary of the failures; RUN_TIMEOUT (default 420 s). Takes every word
#                 after it, so it comes last. ~5-7 min whole on 2 GPUs.
# Example: `bash tests.sh downstream sys run` (a cold start, then everything).
source "$(dirname "$0")/common.sh"
REST=run

# suite WORLD COUNTS LIMIT_GPU_COLL LIMIT_PROCS: both correctness suites at WORLD ranks.
suite() {
  local w=$1 counts=$2 exe limit log filter
  for exe in p2p-collective--gpu_coll p2p-collective--gpu_coll_procs; do
    limit=$3 filter=
    if [ "$exe" = p2p-collective--gpu_coll_procs ]; then limit=$4; else filter=${GPU_COLL_FILTER:-}; fi
    log=$res/$exe-w$w.log
    # shellcheck disable=SC2086 # the filters are separate words
    P2PTEST_WORLD=$w P2PTEST_COUNTS=${P2PTEST_COUNTS:-$counts} timeout "$limit" "$here/tests/$exe" $filter --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
    note "world $w $exe: exit $?: $(grep -E '^test result:' "$log" | tail -n 1)"
    grep -E '^test .* FAILED|^WRONG|panicked' "$log" | head -n 5 | tee -a "$res/summary.txt"
    pack
  done
}
# sharings WORLD: the process-per-GPU matrix with legacy IPC and host-staged workspaces.
sharings() {
  local w=$1 env log
  for env in P2P_CUMEM=0 P2P_DISABLE=1; do
    log=$res/procs-matrix-$env-w$w.log
    env "$env" P2PTEST_WORLD="$w" P2PTEST_COUNTS=0,1,7,1023,65537 timeout 60 \
      "$here/tests/p2p-collective--gpu_coll_procs" gpu2_process_per_gpu_matrix --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
    note "world $w procs matrix $env: exit $?: $(grep -E '^test result:' "$log" | tail -n 1) ($(grep -m1 -o 'shared via [^,)]*' "$log"))"
    pack
  done
}

phase_suites() {
  need 2 || exit 0
  suite "$n" 0,1,7,1023,65537,1000003 300 150
  sharings "$n"
}

phase_world() {
  need 2 || exit 0
  local w
  local -a worlds=("$@")
  [ ${#worlds[@]} -eq 0 ] && mapfile -t worlds < <(seq "$n" -1 2)
  for w in "${worlds[@]}"; do
    if [ "$w" -lt 2 ] || [ "$w" -gt "$n" ]; then note "world: W must be 2 to $n, not $w"; exit 2; fi
  done
  for w in "${worlds[@]}"; do
    suite "$w" 0,1,7,1023,65537 "${TEST_TIMEOUT:-240}" "${PROCS_TIMEOUT:-150}"
  done
}

phase_sharings() {
  need 2 || exit 0
  sharings "${1:-$n}"
}

phase_examples() {
  timeout 150 "$here/run.sh" examples >"$res/examples.log" 2>&1
  note "examples on $n GPUs: $(tail -n 1 "$res/examples.log")"
  grep -E '^== example|FAILED|wrong' "$res/examples.log" | tee -a "$res/summary.txt"
  cp -r "$here/bundle-logs" "$res/" 2>/dev/null
}

phase_downstream() {
  local v round cache out
  { nvidia-smi; ldconfig -p | grep -E 'libnvrtc|libcuda\.' ; } >"$res/machine.txt" 2>&1
  note "GPUs: $n; driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1)"
  for v in cuda-12040 cuda-12080 cuda-13000 candle cudarc-0-18 cudarc-0-17; do
    for round in 1 2; do
      cache=$(mktemp -d)
      out=$(XDG_CACHE_HOME=$cache timeout 120 "$here/downstream/p2p-downstream-$v" 2>&1)
      note "downstream $v round $round: exit $?: $(tail -n 1 <<<"$out")"
      echo "$out" >"$res/downstream-$v-$round.log"
      rm -rf "$cache"
    done
  done
}

phase_sys() {
  local cache t
  cache=$(mktemp -d)
  XDG_CACHE_HOME=$cache timeout 180 "$here/p2p-bench" kernels >"$res/nvrtc-cold-compile.log" 2>&1
  note "p2p-bench kernels into an empty cache (the compile a cold start paid before): exit $?: $(head -n 1 "$res/nvrtc-cold-compile.log")"
  rm -rf "$cache"
  timeout 120 "$here/p2p-bench" doctor >"$res/doctor.txt" 2>&1
  note "doctor: exit $?; $(grep -E 'driver|kernels' "$res/doctor.txt" | head -n 4 | tr '\n' ' ')"
  pack
  for t in "$here"/tests/p2p-sys--gpu*; do
    timeout 120 "$t" --include-ignored --test-threads=1 --nocapture >"$res/$(basename "$t").log" 2>&1
    note "$(basename "$t"): exit $?; $(grep -E '^test result' "$res/$(basename "$t").log")"
  done
}

phase_candle() {
  local exe=$here/downstream/p2p-downstream-candle-core extra round out
  if [ ! -x "$exe" ]; then note "candle: $exe missing (.ci/downstream/candle.sh build)"; exit 1; fi
  ldd "$exe" >"$res/candle-ldd.txt" 2>&1
  if grep -q "not found" "$res/candle-ldd.txt"; then
    # The CUDA 13 libraries candle links, wherever this machine keeps them.
    extra=$(timeout 60 find / -xdev \( -name 'libcublas.so.13' -o -name 'libcurand.so.10' -o -name 'libcudart.so.13' \) -print0 2>/dev/null | xargs -0 -r -n1 dirname | sort -u | tr '\n' ':')
    export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:-}"
    ldd "$exe" >>"$res/candle-ldd.txt" 2>&1
  fi
  for round in 1 2; do
    out=$(XDG_CACHE_HOME=$(mktemp -d) timeout 120 "$exe" 2>&1)
    note "candle-core round $round: exit $?: $(tail -n 1 <<<"$out")"
    echo "$out" >"$res/candle-core-$round.log"
  done
}

# torchruns PORT LOG LIMIT TEST: the test executable $t's TEST (every test whose name holds it)
# under two torchruns --nnodes 2 at once, one per simulated host of two GPUs ({0, 1} and
# {2, 3}), each with its host identity, one job secret, LIMIT seconds; their output in
# $res/LOG0.log and LOG1.log, each torchrun's exit status and seconds in a note.
torchruns() {
  local port=$1 log=$2 limit=$3 test=$4 h secret
  local -a pids=()
  secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  for h in 0 1; do
    rm -f "$res/$log$h.status"  # a warm machine keeps the last run's
    (
      start=$SECONDS
      CUDA_VISIBLE_DEVICES=$((2 * h)),$((2 * h + 1)) P2P_HOST_ID=sim-host-$h NCCL_HOSTID=sim-host-$h P2P_JOB_SECRET=$secret \
        timeout -k 10 "$limit" torchrun --nnodes 2 --node-rank "$h" --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
        --no-python "$t" "$test" --include-ignored --nocapture >"$res/$log$h.log" 2>&1
      echo "exit $? after $((SECONDS - start)) s (limit $limit s; 124/137: killed at it)" >"$res/$log$h.status"
    ) &
    pids+=($!)
  done
  wait "${pids[@]}"
  for h in 0 1; do note "torchrun $log$h: $(cat "$res/$log$h.status" 2>/dev/null || echo 'no status written')"; done
  # A torchrun killed at its limit may leave its workers behind (they run in sessions of their
  # own): end every process of the test executable still running, and say so.
  if pkill -9 -f -- "$(printf '%s' "$t" | sed 's/[][\.*^$+?(){}|]/\\&/g')" 2>/dev/null; then
    note "torchruns $log: processes of $(basename "$t") were still running after the torchruns ended (killed)"
  fi
}

phase_hosts() {
  need 4 || exit 0
  local t=$here/tests/p2p-collective--gpu_multihost body=gpu2_every_op_type_and_count_over_two_simulated_hosts
  local h
  export P2PTEST_COUNTS=${P2PTEST_COUNTS:-0,1,7,1023,65537}
  timeout -k 5 90 "$here/p2p-bench" launch -n 4 --hosts 2 -- "$t" "$body" --exact --include-ignored --nocapture >"$res/launch-hosts.log" 2>&1
  note "p2p-bench launch -n 4 --hosts 2, correctness: exit $?: $(grep -E 'cases over' "$res/launch-hosts.log" | tr '\n' ' ')"
  grep -E 'panicked|wrong, first' "$res/launch-hosts.log" | head -n 8 | tee -a "$res/summary.txt"
  pack
  # torchrun --nnodes 2 on one machine: one torchrun per simulated host, its own GPUs and host
  # identity, one store (node 0's agent at MASTER_PORT), one job secret.
  torchruns 29533 torchrun-host 90 "$body"
  for h in 0 1; do
    note "torchrun --nnodes 2, host $h: $(grep -E 'cases over' "$res/torchrun-host$h.log" | tr '\n' ' ')"
    grep -E 'panicked|wrong, first|Error|error:' "$res/torchrun-host$h.log" | head -n 8 | tee -a "$res/summary.txt"
  done
  pack
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET timeout -k 5 120 "$t" gpu2_time_beside --include-ignored --nocapture >"$res/time.log" 2>&1
  note "time beside NCCL: exit $?"
  grep -E '^multihost-bench' "$res/time.log" | tee -a "$res/summary.txt"
  grep -m 3 -E 'NET/|Using network' "$res/time.log" | tee -a "$res/summary.txt"
  pack
  timeout -k 5 60 "$t" gpu2_a_rank_that_dies --include-ignored --nocapture >"$res/fault.log" 2>&1
  note "a rank's death on the other host: exit $?: $(grep -E 'found the failure|aborted in|freed in|launcher:' "$res/fault.log" | tr '\n' ' ')"
  pack
  timeout -k 5 60 "$t" gpu2_send_and_recv_alone --include-ignored --nocapture >"$res/sendrecv.log" 2>&1
  note "send/recv alone across and inside the hosts: exit $?: $(grep -E 'exchanges exact|panicked' "$res/sendrecv.log" | tr '\n' ' ')"
  pack
  # The same death under two torchruns: no job-wide socket there, so the other host's ranks
  # learn it from NCCL (its error, or the P2P_TIMEOUT_MS deadline, 10 s here; NCCL's own waits
  # are P2P_RENDEZVOUS_TIMEOUT_MS, 20 s here). Last of the
  # tests (its first try, 2026-11-27, outlived its limits and left no log); NCCL's warnings on.
  (export P2P_TIMEOUT_MS=10000 P2P_RENDEZVOUS_TIMEOUT_MS=20000 NCCL_DEBUG=WARN && torchruns 29534 torchrun-death-host 90 gpu2_a_rank_that_dies_on_the_other_host_is_found_by_every_survivor)
  for h in 0 1; do
    note "a rank's death under torchrun, host $h: $(grep -E 'found the failure|exiting without|aborted in|freed in' "$res/torchrun-death-host$h.log" | tr '\n' ' ')"
  done
  pack
}

# p2p-bench hosts on two simulated hosts: every collective 8 KiB - HOSTS_MAX_MIB (64) beside
# NCCL, the JSON and table.
phase_hostbench() {
  need 4 || exit 0
  timeout -k 10 200 "$here/p2p-bench" launch -n 4 --hosts 2 -- "$here/p2p-bench" hosts --max-mib "${HOSTS_MAX_MIB:-64}" --out "$res" >"$res/bench.log" 2>&1
  note "p2p-bench hosts: exit $?"
  grep -E '^hosts: ' "$res/bench.log" | tail -n 40 | tee -a "$res/summary.txt"
}

phase_run() {
  OUT='' timeout "${RUN_TIMEOUT:-420}" bash "$here/run.sh" "$@" >"$res/run.log" 2>&1
  note "run.sh $*: exit $?; $(tail -n 1 "$res/run.log")"
  grep -E '^test .* FAILED|panicked|^FAIL|no test summary' "$res/run.log" | head -n 20 | tee -a "$res/summary.txt"
  cp -r "$here/bundle-logs" "$res/" 2>/dev/null
}

run_phases run "$@"
