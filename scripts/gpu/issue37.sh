#!/usr/bin/env bash
# Issue 37 (faults on separate GPUs) on 2+ GPUs; carry target/bundle. Results: $OUT/issue37.tgz.
# Phases, in the order given (default: held torchrun faults):
#   held      p2p-bench held-memory: 10 communicators made and dropped in one process, per
#             rank, with cuMem (default) and legacy IPC (P2P_CUMEM=0), and --local; nvidia-smi
#             before and after.
#   torchrun  rank 1 exits before it joins, under torchrun --standalone: how long until the
#             agent ends the job (rank 0 waits in the rendezvous with a 60 s limit); and the same
#             under p2p-bench launch (rank 0 fails at once, naming rank 1).
#   faults    p2p-bench faults -n $n until 200 process faults and 200 stranger attempts
#             (FAULT_SECONDS, default 330).
#   parts     p2p-bench held-memory --parts: each part of a communicator made and dropped alone.
#   tests     the bounded-wait GPU tests (GPU_TESTS: test-name filters, default gpu).
#   ab        all-reduce and all-gather, 512 KiB-64 MiB, ours only (registered buffers among
#             them): p2p-bench-old (BEFORE the bounded waits, if carried) against p2p-bench,
#             alternating, two rounds.
source "$(dirname "$0")/common.sh"
smi() { nvidia-smi --query-gpu=index,memory.used --format=csv,noheader 2>&1 | tr '\n' ' '; }
for phase in ${*:-held torchrun faults}; do
  case $phase in
  held)
    note "nvidia-smi before: $(smi)"
    for cumem in 1 0; do
      P2P_CUMEM=$cumem timeout 120 "$here/p2p-bench" launch -n "$n" -- "$here/p2p-bench" held-memory --cycles 10 \
        >"$res/held-cumem$cumem.log" 2>&1
      note "held-memory, process per GPU, P2P_CUMEM=$cumem: exit $?; $(grep -c '^HELD' "$res/held-cumem$cumem.log") lines"
    done
    timeout 120 "$here/p2p-bench" held-memory --local --cycles 10 >"$res/held-local.log" 2>&1
    note "held-memory --local: exit $?"
    note "nvidia-smi after: $(smi)"
    ;;
  parts)
    timeout 120 "$here/p2p-bench" held-memory --parts --cycles 6 >"$res/held-parts.log" 2>&1
    note "held-memory --parts: exit $?"
    CUDA_MODULE_LOADING=EAGER timeout 120 "$here/p2p-bench" held-memory --parts --cycles 6 >"$res/held-parts-eager.log" 2>&1
    note "held-memory --parts, CUDA_MODULE_LOADING=EAGER: exit $?"
    ;;
  ab)
    for r in 1 2; do
      for b in p2p-bench-old p2p-bench; do
        [ -x "$here/$b" ] || continue
        timeout 150 "$here/$b" coll --ops all_reduce,all_gather --min-bytes 524288 --max-mib 64 --no-nccl \
          --out "$res/ab-$b-r$r" >"$res/ab-$b-r$r.log" 2>&1
        note "ab $b round $r: exit $?"
      done
    done
    ;;
  torchrun)
    cat >"$res/rank.sh" <<EOF
#!/bin/sh
if [ "\$RANK" = 1 ]; then exit 3; fi
P2P_RENDEZVOUS_TIMEOUT_MS=60000 exec "$here/p2p-bench" held-memory --cycles 1
EOF
    chmod +x "$res/rank.sh"
    t0=$(date +%s%N)
    timeout 120 torchrun --standalone --nproc-per-node 2 --no-python "$res/rank.sh" >"$res/torchrun.log" 2>&1
    rc=$?
    note "torchrun, rank 1 exits before joining: exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    t0=$(date +%s%N)
    P2P_RENDEZVOUS_TIMEOUT_MS=60000 timeout 120 "$here/p2p-bench" launch -n 2 -- "$res/rank.sh" >"$res/launch.log" 2>&1
    rc=$?
    note "p2p-bench launch, rank 1 exits before joining: exit $rc after $(( ($(date +%s%N) - t0) / 1000000 )) ms: $(grep -m1 -o 'rank 1 (pid [0-9]*) ended[^"]*' "$res/launch.log")"
    ;;
  faults)
    fds0=$(ls /proc/self/fd | wc -l)
    note "nvidia-smi before faults: $(smi)"
    timeout $(( ${FAULT_SECONDS:-330} + 90 )) "$here/p2p-bench" faults -n "$n" --faults 200 --seconds "${FAULT_SECONDS:-330}" \
      --out "$res/faults" >"$res/faults-n$n.log" 2>&1
    note "faults -n $n: exit $?; $(grep -E '^Total|^Measured' "$res/faults-n$n.log" | tr '\n' ' ')"
    note "nvidia-smi after faults: $(smi); processes left: $(pgrep -c -f fault-worker || true)"
    ;;
  tests)
    for t in "$here"/tests/p2p-mem--* "$here"/tests/p2p-collective--gpu_coll "$here"/tests/p2p-collective--gpu_coll_procs; do
      [ -x "$t" ] || continue
      # shellcheck disable=SC2086
      timeout 240 "$t" --include-ignored --test-threads=1 ${GPU_TESTS:-gpu} >"$res/tests-$(basename "$t").log" 2>&1
      note "$(basename "$t"): exit $?; $(grep -E '^test result' "$res/tests-$(basename "$t").log" | tail -n 1)"
    done
    ;;
  esac
  pack
done
