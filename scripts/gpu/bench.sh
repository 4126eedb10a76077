#!/usr/bin/env bash
# Performance on a machine of 2+ GPUs, from the bundle, NCCL beside ours where it says so:
#   bash target/bundle/bench.sh PHASE [ARGS] [PHASE [ARGS]]...   (no default)
# Carry target/bundle; add .nccl-tests (`../shared/tools/nccl-tests.sh prepare`) for machine,
# probe and sendrecv, and the other p2p-bench binaries for ab. Each phase's results:
# $OUT/bench-PHASE[-ARG].tgz (summary.txt first), packed after every step. Times are on 2-4 x
# H100/H200; a device command has 10 minutes.
#   machine       the machine's record: nvidia-smi, `p2p-bench topo` (text and a fixture's
#                 JSON), the doctor, `p2p-bench coll` on every GPU beside NCCL's three modes
#                 (BENCH_ARGS, default --factor 4; BENCH_TIMEOUT, 400 s), then nccl-tests in every
#                 mode (built in the background meanwhile). ~6-9 min.
#   table W       the table at W ranks (default every GPU): `p2p-bench coll`, every op, 8 B -
#                 1 GiB, factor FACTOR (default 8), with the graph gate and the watchdog
#                 (TABLE_TIMEOUT, default 540 s; a run cut short keeps its rows in
#                 coll-partial.json; TABLE_ARGS: more flags). ~2 min at 2 ranks.
#   probe         the benchmark's hang (docs/performance.md, "How we measure": NCCL issue 1859 with
#                 --nccl-shared-p2p-buffers, the same without registration, the default, the issue's
#                 own 1 GiB command); graph timing with and without the gate beside
#                 nccl-tests -G 100 (small all-reduce); the copy engines on 4 and 3 ranks against
#                 the defaults (docs/performance.md, "Copy engines for all-gather and
#                 all-to-all"; skipped where the GPUs are fewer), all-gather and all-to-all from
#                 16 MiB. ~8 min on 4 GPUs.
#   ce [W]        the copy engines on more than two ranks (docs/performance.md, "Copy engines for
#                 all-gather and all-to-all"; owed: docs/runbook.md, "Runs still owed") at W ranks
#                 (default every GPU): all-gather and all-to-all from 16 MiB with
#                 --ce-more-ranks-mib 0 against the defaults, two rounds (130 s each run). ~5 min.
#   overlap [W]   overlapped steps (docs/performance.md, "Overlapped steps") against the steps in
#                 turn at W ranks (default every GPU): every collective, f32, 2 MiB - 1 GiB by 8,
#                 --overlap-min-kib 0 --overlap-chunks OVERLAP_CHUNKS (default 4) against the
#                 defaults, beside NCCL's plain and symmetric modes, two rounds (120 s a run).
#                 ~7 min at 4 ranks.
#   push [W]      the push all-reduce (docs/performance.md, "The push all-reduce") at W ranks
#                 (default every GPU): P2P_ALGO=push in turn, push overlapped, and the defaults
#                 (the direct all-reduce on registered buffers), f32, 2 MiB - 1 GiB by 8,
#                 beside NCCL's plain and symmetric modes, two rounds, the order alternating
#                 (80 s a run). ~7 min at 4 ranks.
#   splitout [W [ROUND]]
#                 the split into outputs (docs/performance.md, "The split into outputs") at W
#                 ranks (default every GPU): P2P_ALGO=splitout and P2P_ALGO=split, each in turn
#                 and overlapped, reduce and broadcast, f32, 2 MiB - 1 GiB by 8, beside NCCL's
#                 plain and symmetric modes; ROUND 1 (default) in that order, 2 the reverse
#                 (90 s a run). ~6 min at 4 ranks a round.
#   relay [W [ROUND]]
#                 the relayed collectives (docs/performance.md, "The relayed collectives") at W
#                 ranks (default every GPU): P2P_ALGO=relay cut into at least 4, 8 and 16
#                 chunks, all-reduce, reduce and broadcast, and P2P_ALGO=splitout overlapped,
#                 reduce and broadcast, f32, 2 MiB - 1 GiB by 8, beside NCCL's plain and
#                 symmetric modes; ROUND 1 (default) in that order, 2 the reverse (120 s a run).
#                 ~7 min at 4 ranks a round.
#   host          `p2p-bench host` on 2, 3 and every GPU (those the machine has), two rounds: the
#                 host's cost of one call, split (docs/performance.md, "Host cost of a call"; no
#                 NCCL). ~2 min.
#   sendrecv      nccl-tests sendrecv and alltoall (plain, graph, registered windows under
#                 graph), `p2p-bench sendrecv` (ring and all-to-all, ours beside NCCL plain and on
#                 ncclMemAlloc buffers, eager and graph) and a short `p2p-bench coll`
#                 all-reduce. ~6 min on 2 GPUs.
#   kernels       the shipped cubins (NVRTC 12.4) against NVRTC's own compile on the machine
#                 (P2P_KERNELS=compile), ours only, MIN_BYTES (default 8) - MAX_MIB MiB (default
#                 64) by factor 8, ROUNDS rounds each (default 2), alternating, 200 s a run.
#                 ~4 min to 64 MiB.
#   ab NAME=BINARY... -- P2P-BENCH-ARGS...
#                 A/B of p2p-bench binaries (built at other commits, carried, e.g. target/ab)
#                 on one machine in one run: each binary ROUNDS times (default 2), the order
#                 alternating, BENCH_TIMEOUT (default 300 s) a run; each run into NAME-rN/
#                 (`host` into NAME-rN/host.json, the others as their --out).
#                 Takes every word after it, so it comes last.
# Example: `bash bench.sh ab old=../ab/p2p-bench-X new=./p2p-bench -- coll --no-nccl --max-mib 64`.
source "$(dirname "$0")/common.sh"
REST=ab

# coll_run TAG TIMEOUT ARGS...: one `p2p-bench coll` run into $res/TAG, with the watchdog's
# STALLED lines and the errors counted in the summary.
coll_run() {
  local tag=$1 t=$2; shift 2
  timeout "$t" "$here/p2p-bench" coll "$@" --out "$res/$tag" >"$res/$tag.md" 2>"$res/$tag.err"
  note "coll $tag ($*): exit $?; $(grep -c STALLED "$res/$tag.err") STALLED, $(grep -c 'ERROR\|FATAL' "$res/$tag.err") ERROR/FATAL lines, $(grep -c WRONG "$res/$tag.err") WRONG lines"
  grep -E 'STALLED|ERROR|FATAL|WRONG' "$res/$tag.err" | head -n 4 | tee -a "$res/summary.txt"
  pack
}

phase_machine() {
  local op
  local -a args
  read -r -a args <<<"${BENCH_ARGS:---factor 4}"
  same_nccl
  { nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink -s; } >"$res/nvidia-smi.txt" 2>&1
  timeout 60 "$here/p2p-bench" topo >"$res/topo.txt" 2>&1
  timeout 60 "$here/p2p-bench" topo --json >"$res/topo.json" 2>"$res/topo-json.err"
  timeout 120 "$here/p2p-bench" doctor >"$res/doctor.txt" 2>&1; note "doctor: exit $? ($(tail -n 1 "$res/doctor.txt"))"
  pack
  nccl_tests_build
  timeout "${BENCH_TIMEOUT:-400}" taskset -c 0-$(( $(nproc) / 2 - 1 )) "$here/p2p-bench" coll "${args[@]}" --out "$res/coll-w$n" >"$res/coll-w$n.md" 2>"$res/coll-w$n.err"
  note "p2p-bench coll ${args[*]} on $n GPUs: exit $? ($(grep -c WRONG "$res/coll-w$n.err") WRONG lines)"
  grep -E "^\[" "$res/coll-w$n.err" | tail -n 3
  pack
  nccl_tests_wait
  for op in all_reduce all_gather reduce_scatter alltoall broadcast reduce; do
    nccl_tests "$op" plain -b 8 -e 1G -f 4
    case $op in broadcast|reduce) ;; *) nccl_tests "$op" sym -b 8 -e 1G -f 4 -R 2 ;; esac
    case $op in all_gather|alltoall) nccl_tests "$op" ce -b 8 -e 1G -f 4 -x 2 -R 2 ;; esac
  done
  nccl_tests all_reduce sym-graph -b 8 -e 64M -f 4 -R 2 -G 100
  nccl_tests all_reduce plain-graph -b 8 -e 64M -f 4 -G 100
}

phase_table() {
  local w=${1:-$n}
  local -a more
  need "$w" || exit 0
  read -r -a more <<<"${TABLE_ARGS:-}"
  same_nccl
  coll_run "coll-w$w" "${TABLE_TIMEOUT:-540}" --gpus "$w" --factor "${FACTOR:-8}" "${more[@]}"
}

phase_probe() {
  local w v
  local -a hang f
  need 2 || exit 0
  same_nccl
  { nvidia-smi; nvidia-smi topo -m; } >"$res/nvidia-smi.txt" 2>&1
  nccl_tests_build
  # shellcheck disable=SC2054 # the commas are p2p-bench's lists
  hang=(--ops all_to_all,broadcast --min-bytes 2097152 --max-mib 2 --samples 10 --nccl-modes plain,symmetric --no-registered --deadline-s 15)
  NCCL_DEBUG=WARN coll_run hang-shared 90 "${hang[@]}" --nccl-shared-p2p-buffers
  NCCL_LOCAL_REGISTER=0 NCCL_GRAPH_REGISTER=0 coll_run hang-shared-noreg 90 "${hang[@]}" --nccl-shared-p2p-buffers
  coll_run hang-default 90 "${hang[@]}"
  coll_run hang-issue-1g 120 --ops all_to_all,broadcast --min-bytes 1073741824 --max-mib 1024 --samples 10 --nccl-modes plain,symmetric --deadline-s 30
  coll_run graph-small 120 --ops all_reduce --types float --min-bytes 8 --max-mib 1 --factor 8 --graph-ungated --nccl-modes plain,symmetric --no-registered
  nccl_tests_wait
  nccl_tests all_reduce sym-graph -b 8 -e 2M -f 8 -R 2 -G 100
  nccl_tests all_reduce plain-graph -b 8 -e 2M -f 8 -G 100
  for w in 4 3; do
    [ "$w" -gt "$n" ] && { note "copy engines at $w ranks: skipped, $n GPUs here"; continue; }
    for v in ce0 defaults; do
      f=(); [ $v = ce0 ] && f=(--ce-more-ranks-mib 0)
      coll_run "ce-w$w-$v" 100 --gpus "$w" --ops all_gather,all_to_all --min-bytes 16777216 --factor 4 --nccl-modes copy_engine --samples 10 "${f[@]}"
    done
  done
}

phase_ce() {
  local w=${1:-$n}
  need "$w" || exit 0
  same_nccl
  RUNS=2 COLL_TIMEOUT=130 coll_ab "ce-w$w" "--ce-more-ranks-mib 0" --gpus "$w" \
    --ops all_gather,all_to_all --min-bytes 16777216 --nccl-modes copy_engine
}

phase_overlap() {
  local w=${1:-$n}
  need "$w" || exit 0
  same_nccl
  RUNS=2 COLL_TIMEOUT=120 coll_ab "overlap-w$w" "--overlap-min-kib 0 --overlap-chunks ${OVERLAP_CHUNKS:-4}" \
    --gpus "$w" --ops reduce,broadcast,all_reduce,all_gather,reduce_scatter,all_to_all --types float \
    --min-bytes 2097152 --max-mib 1024 --factor 8 --samples 10 --nccl-modes plain,symmetric
}

phase_push() {
  local w=${1:-$n} round v
  local -a order
  need "$w" || exit 0
  same_nccl
  for round in 1 2; do
    order=(push push-overlap defaults)
    [ "$round" = 2 ] && order=(defaults push-overlap push)
    for v in "${order[@]}"; do
      # Only a registered output can take the push: the plain rows of the push runs are
      # planned as usual, with the reason logged ("... it needs the output registered").
      case $v in
        push) P2P_ALGO=push coll_run "push-w$w-$v-r$round" 80 --gpus "$w" --ops all_reduce --types float --min-bytes 2097152 --max-mib 1024 --factor 8 --samples 10 --nccl-modes plain,symmetric ;;
        push-overlap) P2P_ALGO=push coll_run "push-w$w-$v-r$round" 80 --gpus "$w" --ops all_reduce --types float --min-bytes 2097152 --max-mib 1024 --factor 8 --samples 10 --nccl-modes plain,symmetric --overlap-min-kib 0 ;;
        defaults) coll_run "push-w$w-$v-r$round" 80 --gpus "$w" --ops all_reduce --types float --min-bytes 2097152 --max-mib 1024 --factor 8 --samples 10 --nccl-modes plain,symmetric ;;
      esac
    done
  done
}

phase_splitout() {
  local w=${1:-$n} round=${2:-1} v
  local -a order=(splitout splitout-overlap split-overlap split)
  need "$w" || exit 0
  same_nccl
  [ "$round" = 2 ] && order=(split split-overlap splitout-overlap splitout)
  for v in "${order[@]}"; do
    # Only registered outputs can take the split into outputs: the plain rows of its runs are
    # planned as usual (the split), with the reason logged ("... it needs the output registered").
    local -a flags=()
    [ "${v%-overlap}" != "$v" ] && flags=(--overlap-min-kib 0)
    P2P_ALGO=${v%-overlap} coll_run "splitout-w$w-$v-r$round" 90 --gpus "$w" --ops reduce,broadcast \
      --types float --min-bytes 2097152 --max-mib 1024 --factor 8 --samples 10 \
      --nccl-modes plain,symmetric "${flags[@]}"
  done
}

phase_relay() {
  local w=${1:-$n} round=${2:-1} v
  local -a order=(relay-c4 relay-c8 relay-c16 splitout-overlap)
  need "$w" || exit 0
  same_nccl
  [ "$round" = 2 ] && order=(splitout-overlap relay-c16 relay-c8 relay-c4)
  for v in "${order[@]}"; do
    # Only registered outputs can take the relay: the plain rows of its runs are planned as
    # usual (the split), with the reason logged ("... they need the output registered").
    local -a flags=(--overlap-chunks "${v#relay-c}") ops=all_reduce,reduce,broadcast
    [ "$v" = splitout-overlap ] && flags=(--overlap-min-kib 0) ops=reduce,broadcast
    P2P_ALGO=${v%%-*} coll_run "relay-w$w-$v-r$round" 120 --gpus "$w" --ops "$ops" \
      --types float --min-bytes 2097152 --max-mib 1024 --factor 8 --samples 10 \
      --nccl-modes plain,symmetric "${flags[@]}"
  done
}

phase_host() {
  local round w f
  need 2 || exit 0
  for round in 1 2; do
    for w in $(printf '%s\n' 2 3 "$n" | sort -un); do
      [ "$w" -gt "$n" ] && continue
      f=$res/host-w$w-r$round
      timeout 120 "$here/p2p-bench" host --gpus "$w" --samples 50 --json "$f.json" >"$f.md" 2>"$f.err"
      note "host on $w GPUs, round $round: exit $?: $(tail -n 1 "$f.md")"
      pack
    done
  done
}

phase_sendrecv() {
  local exe
  need 2 || exit 0
  same_nccl
  # nccl-tests' own send/recv and all-to-all beside ours: plain, under graph (where NCCL
  # registers the user buffers: its best send/recv mode, docs/performance.md, "Send and
  # receive") and on ncclMemAlloc windows.
  nccl_tests_build
  nccl_tests_wait
  for exe in sendrecv alltoall; do
    nccl_tests "$exe" plain -b 8 -e 128M -f 4
    nccl_tests "$exe" graph -b 8 -e 128M -f 4 -G 100
    nccl_tests "$exe" sym-graph -b 8 -e 128M -f 4 -R 2 -G 100
  done
  timeout 240 "$here/p2p-bench" sendrecv --pattern ring --out "$res" >"$res/sendrecv-ring.log" 2>&1
  note "sendrecv ring: exit $?"
  timeout 200 "$here/p2p-bench" sendrecv --pattern all-to-all --max-mib 64 --out "$res" >"$res/sendrecv-a2a.log" 2>&1
  note "sendrecv all-to-all: exit $?"
  timeout 120 "$here/p2p-bench" coll --ops all_reduce --max-mib 64 --factor 4 --out "$res" >"$res/coll.log" 2>&1
  note "coll all_reduce (short): exit $?"
}

phase_kernels() {
  local round mode
  export XDG_CACHE_HOME
  XDG_CACHE_HOME=$(mktemp -d)
  P2P_KERNELS=compile timeout 120 "$here/p2p-bench" kernels >"$res/compile-cache.log" 2>&1
  note "NVRTC compile into the cache: exit $?; $(head -n 1 "$res/compile-cache.log")"
  for round in $(seq 1 "${ROUNDS:-2}"); do
    for mode in shipped compile; do
      P2P_KERNELS=$mode timeout 200 "$here/p2p-bench" coll --no-nccl --min-bytes "${MIN_BYTES:-8}" --max-mib "${MAX_MIB:-64}" --factor 8 \
        --samples 10 --out "$res/$mode-$round" >"$res/$mode-$round.md" 2>"$res/$mode-$round.err"
      note "coll $mode round $round: exit $?"
      pack
    done
  done
}

phase_ab() {
  local round i nb tag bin out
  local -a bins=() order
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  if [ ${#bins[@]} -eq 0 ] || [ $# -eq 0 ]; then note "ab: usage: ab NAME=BINARY... -- P2P-BENCH-ARGS..."; exit 2; fi
  same_nccl
  for round in $(seq 1 "${ROUNDS:-2}"); do
    order=("${bins[@]}")
    if [ $((round % 2)) -eq 0 ]; then
      order=()
      for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("${bins[$i]}"); done
    fi
    for nb in "${order[@]}"; do
      tag=${nb%%=*} bin=${nb#*=}
      out=$res/$tag-r$round
      mkdir -p "$out"
      # `host` writes one JSON file (--json); every other subcommand a results folder (--out).
      if [ "$1" = host ]; then
        timeout "${BENCH_TIMEOUT:-300}" "$bin" "$@" --json "$out/host.json" >"$out/log.txt" 2>&1
      else
        timeout "${BENCH_TIMEOUT:-300}" "$bin" "$@" --out "$out" >"$out/log.txt" 2>&1
      fi
      note "round $round $tag ($bin): exit $?"
      pack
    done
  done
}

run_phases "" "$@"
