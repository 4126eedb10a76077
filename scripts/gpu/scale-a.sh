#!/usr/bin/env bash
# Issue 12, batch A for a machine: the topology as recorded there (fixture), the doctor, our
# collectives beside NCCL's three modes at the full world size, and nccl-tests (built here, in
# the background while our benchmark runs on other cores) as the outside cross-check.
# Usage: BENCH_ARGS="--factor 4" scale-a.sh   Results: $OUT/scale-a.tgz
source "$(dirname "$0")/common.sh"
same_nccl
{ nvidia-smi; nvidia-smi topo -m; nvidia-smi nvlink -s; } >"$res/nvidia-smi.txt" 2>&1
"$here/p2p-bench" topo >"$res/topo.txt" 2>&1
"$here/p2p-bench" topo --json >"$res/topo.json" 2>"$res/topo-json.err"
"$here/p2p-bench" doctor >"$res/doctor.txt" 2>&1; note "doctor: exit $? ($(tail -n 1 "$res/doctor.txt"))"
pack
if [ -d "$root/.nccl-tests" ] && [ ! -x "$nt/all_reduce_perf" ]; then
  (nice -n 19 taskset -c "$(( $(nproc) / 2 ))-$(( $(nproc) - 1 ))" bash "$root/.nccl-tests/build.sh" >"$res/nccl-tests-build.log" 2>&1) &
  build=$!
fi
timeout "${BENCH_TIMEOUT:-400}" taskset -c 0-$(( $(nproc) / 2 - 1 )) "$here/p2p-bench" coll ${BENCH_ARGS:-} --out "$res/coll-w$n" >"$res/coll-w$n.md" 2>"$res/coll-w$n.err"
note "p2p-bench coll ${BENCH_ARGS:-} on $n GPUs: exit $?"
grep -E "^\[" "$res/coll-w$n.err" | tail -n 3
pack
[ -n "${build:-}" ] && { wait "$build"; note "nccl-tests build: exit $?"; }
for op in all_reduce all_gather reduce_scatter alltoall broadcast reduce; do
  nccl_tests "$op" plain -b 8 -e 1G -f 4
  case $op in broadcast|reduce) ;; *) nccl_tests "$op" sym -b 8 -e 1G -f 4 -R 2 ;; esac
  case $op in all_gather|alltoall) nccl_tests "$op" ce -b 8 -e 1G -f 4 -x 2 -R 2 ;; esac
done
nccl_tests all_reduce sym-graph -b 8 -e 64M -f 4 -R 2 -G 100
nccl_tests all_reduce plain-graph -b 8 -e 64M -f 4 -G 100
note "done"
pack
