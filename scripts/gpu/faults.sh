#!/usr/bin/env bash
# Faults: ranks that die, stall or never join, strangers, and the GPU memory a communicator
# keeps, on a machine of 2+ GPUs (one GPU: one-gpu.sh extra), from the bundle:
#   bash target/bundle/faults.sh PHASE [ARGS] [PHASE [ARGS]]...   (default: held torchrun suite)
# Carry target/bundle. Each phase's results: $OUT/faults-PHASE[-ARG].tgz (summary.txt first).
# Times are on 2 x H100; a device command has 10 minutes.
#   suite [W]   `p2p-bench faults -n W` (default every GPU) until 200 process faults and 200
#               stranger attempts or FAULT_SECONDS (default 330; the step ends 90 s later);
#               nvidia-smi before and after, and the fault workers left. ~4-7 min.
#   held        `p2p-bench held-memory`: 10 communicators made and dropped in one process per
#               rank, with cuMem (default) and legacy IPC (P2P_CUMEM=0), and --local; nvidia-smi
#               before and after. ~1 min.
#   parts       `p2p-bench held-memory --parts`: each part of a communicator made and dropped
#               alone, with lazy and eager (CUDA_MODULE_LOADING=EAGER) module loading. ~1 min.
#   torchrun    rank 1 exits before it joins, under torchrun --standalone: how long until the
#               agent ends the job (rank 0 waits in the rendezvous with a 60 s limit); then the
#               same under `p2p-bench launch` (rank 0 fails at once, naming rank 1). ~10 s.
#   tests       the bounded-wait GPU tests: p2p-mem's and both collective suites (GPU_TESTS:
#               test-name filters, default gpu; 240 s each). ~3-6 min.
# Example: `bash faults.sh held suite` (4 GPUs), then `bash faults.sh suite 3`.
source "$(dirname "$0")/common.sh"

smi() { nvidia-smi --query-gpu=index,memory.used --format=csv,noheader 2>&1 | tr '\n' ' '; }

phase_suite() {
  local w=${1:-$n} secs=${FAULT_SECONDS:-330}
  need 1 || exit 0
  note "nvidia-smi before faults: $(smi)"
  timeout $((secs + 90)) "$here/p2p-bench" faults -n "$w" --faults 200 --seconds "$secs" \
    --out "$res/faults" >"$res/faults-n$w.log" 2>&1
  note "faults -n $w: exit $?; $(grep -E '^Total|^Measured' "$res/faults-n$w.log" | tr '\n' ' ')"
  note "nvidia-smi after faults: $(smi); processes left: $(pgrep -c -f fault-worker || true)"
}

phase_held() {
  local cumem
  need 1 || exit 0
  note "nvidia-smi before: $(smi)"
  for cumem in 1 0; do
    P2P_CUMEM=$cumem timeout 120 "$here/p2p-bench" launch -n "$n" -- "$here/p2p-bench" held-memory --cycles 10 \
      >"$res/held-cumem$cumem.log" 2>&1
    note "held-memory, process per GPU, P2P_CUMEM=$cumem: exit $?; $(grep -c '^HELD' "$res/held-cumem$cumem.log") lines"
  done
  timeout 120 "$here/p2p-bench" held-memory --local --cycles 10 >"$res/held-local.log" 2>&1
  note "held-memory --local: exit $?"
  note "nvidia-smi after: $(smi)"
}

phase_parts() {
  timeout 120 "$here/p2p-bench" held-memory --parts --cycles 6 >"$res/held-parts.log" 2>&1
  note "held-memory --parts: exit $?"
  CUDA_MODULE_LOADING=EAGER timeout 120 "$here/p2p-bench" held-memory --parts --cycles 6 >"$res/held-parts-eager.log" 2>&1
  note "held-memory --parts, CUDA_MODULE_LOADING=EAGER: exit $?"
}

phase_torchrun() {
  local t0 rc
  cat >"$res/rank.sh" <<EOF
#!/bin/sh
if [ "\$RANK" = 1 ]; then exit 3; fi
P2P_RENDEZVOUS_TIMEOUT_MS=60000 exec "$here/p2p-bench" held-memory --cycles 1
EOF
  chmod +x "$res/rank.sh"
  if command -v torchrun >/dev/null 2>&1; then
    t0=$(date +%s%N)
    timeout 120 torchrun --standalone --nproc-per-node 2 --no-python "$res/rank.sh" >"$res/torchrun.log" 2>&1
    rc=$?
    note "torchrun, rank 1 exits before joining: exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  else
    note "torchrun is not installed here: not run"
  fi
  t0=$(date +%s%N)
  P2P_RENDEZVOUS_TIMEOUT_MS=60000 timeout 120 "$here/p2p-bench" launch -n 2 -- "$res/rank.sh" >"$res/launch.log" 2>&1
  rc=$?
  note "p2p-bench launch, rank 1 exits before joining: exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(grep -m1 -o 'rank 1 (pid [0-9]*) ended[^"]*' "$res/launch.log")"
}

phase_tests() {
  local t
  for t in "$here"/tests/p2p-mem--* "$here"/tests/p2p-collective--gpu_coll "$here"/tests/p2p-collective--gpu_coll_procs; do
    [ -x "$t" ] || continue
    # shellcheck disable=SC2086 # the filters are separate words
    timeout 240 "$t" --include-ignored --test-threads=1 ${GPU_TESTS:-gpu} >"$res/tests-$(basename "$t").log" 2>&1
    note "$(basename "$t"): exit $?; $(grep -E '^test result' "$res/tests-$(basename "$t").log" | tail -n 1)"
    pack
  done
}

run_phases "held torchrun suite" "$@"
