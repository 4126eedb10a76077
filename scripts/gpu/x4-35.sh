#!/usr/bin/env bash
# Issue 35 on a 4-GPU machine (phase probe also on 2 GPUs, without the copy-engine sweeps), in phases each under the device tool's 10 minutes. Carry
# target/bundle (and .nccl-tests for phase probe). Results: $OUT/x4-35-PHASE.tgz.
#   x4-35.sh probe  the benchmark hang (perf-notes §47: NCCL issue 1859 reproduced with
#                   --nccl-shared-p2p-buffers, then the same without registration, then the
#                   default, then the issue's own 1 GiB command); graph timing with and without
#                   the gate beside nccl-tests -G 100 (small all-reduce); the copy engines on
#                   3 and 4 ranks against the defaults (perf-notes §35), all-gather and
#                   all-to-all from 16 MiB.
#   x4-35.sh table W  p2p-bench coll at W ranks, every op, 8 B - 1 GiB, factor 8 (TABLE_TIMEOUT,
#                   default 540 s; a run cut short keeps its rows in coll-partial.json).
phase=${1:-probe}
BATCH=x4-35-$phase${2:+-$2}
source "$(dirname "$0")/common.sh"
finish() { note "${1:-done}"; pack; }
bench() { # bench TAG TIMEOUT ARGS...: one p2p-bench coll run into $res/TAG
  local tag=$1 t=$2; shift 2
  timeout "$t" "$here/p2p-bench" coll "$@" --out "$res/$tag" >"$res/$tag.md" 2>"$res/$tag.err"
  note "coll $tag ($*): exit $?; $(grep -c STALLED "$res/$tag.err") STALLED, $(grep -c 'ERROR\|FATAL' "$res/$tag.err") ERROR/FATAL lines"
  grep -E 'STALLED|ERROR|FATAL' "$res/$tag.err" | head -n 4 | tee -a "$res/summary.txt"
  pack
}
case $phase in
  probe)
    same_nccl
    { nvidia-smi; nvidia-smi topo -m; } >"$res/nvidia-smi.txt" 2>&1
    if [ -d "$root/.nccl-tests" ] && [ ! -x "$nt/all_reduce_perf" ]; then
      (nice -n 19 taskset -c "$(( $(nproc) / 2 ))-$(( $(nproc) - 1 ))" bash "$root/.nccl-tests/build.sh" >"$res/nccl-tests-build.log" 2>&1) &
      build=$!
    fi
    hang=(--ops all_to_all,broadcast --min-bytes 2097152 --max-mib 2 --samples 10 --nccl-modes plain,symmetric --no-registered --deadline-s 15)
    NCCL_DEBUG=WARN bench hang-shared 90 "${hang[@]}" --nccl-shared-p2p-buffers
    NCCL_LOCAL_REGISTER=0 NCCL_GRAPH_REGISTER=0 bench hang-shared-noreg 90 "${hang[@]}" --nccl-shared-p2p-buffers
    bench hang-default 90 "${hang[@]}"
    bench hang-issue-1g 120 --ops all_to_all,broadcast --min-bytes 1073741824 --max-mib 1024 --samples 10 --nccl-modes plain,symmetric --deadline-s 30
    bench graph-small 120 --ops all_reduce --types float --min-bytes 8 --max-mib 1 --factor 8 --graph-ungated --nccl-modes plain,symmetric --no-registered
    [ -n "${build:-}" ] && { wait "$build"; note "nccl-tests build: exit $?"; }
    nccl_tests all_reduce sym-graph -b 8 -e 2M -f 8 -R 2 -G 100
    nccl_tests all_reduce plain-graph -b 8 -e 2M -f 8 -G 100
    for w in 4 3; do
      [ "$w" -gt "$n" ] && { note "copy engines at $w ranks: skipped, $n GPUs here"; continue; }
      for v in ce0 defaults; do
        f=(); [ $v = ce0 ] && f=(--ce-more-ranks-mib 0)
        bench "ce-w$w-$v" 100 --gpus "$w" --ops all_gather,all_to_all --min-bytes 16777216 --factor 4 --nccl-modes copy_engine --samples 10 "${f[@]}"
      done
    done
    ;;
  table)
    w=${2:-$n}
    same_nccl
    bench "coll-w$w" "${TABLE_TIMEOUT:-540}" --gpus "$w" --factor 8 ${TABLE_ARGS:-}
    ;;
  *) finish "x4-35.sh: unknown phase $phase (probe, table)"; exit 2 ;;
esac
finish
