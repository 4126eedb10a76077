#!/usr/bin/env bash
# Groups and send/recv on a GPU (first run 2026-11-23): two commands on nvidia-h200-x2 (or a
# machine of more GPUs), each under the device tool's 10 minutes; carry target/bundle, and
# .nccl-tests for the bench's nccl-tests figures.
#   groups.sh tests   the whole bundle (run.sh: every test executable and the examples), which
#                     now includes the group tests (gpu2_send_recv_matrix (groups),
#                     gpu2_group_all_to_all_under_graph_and_refused_groups, groups in
#                     gpu2_process_per_gpu_send_recv) and the connection liveness test
#                     (gpu1_a_killed_peer_ends_a_watched_connection_wait).
#   groups.sh bench   nccl-tests sendrecv and alltoall (plain, graph, registered windows under
#                     graph; when .nccl-tests is carried), p2p-bench sendrecv (ring and all-to-all,
#                     ours beside NCCL plain and on ncclMemAlloc buffers, eager and graph) and a
#                     short p2p-bench coll (the shared timing module, the progress bar).
# Results: $OUT/groups-tests.tgz or $OUT/groups-bench.tgz (summary.txt first).
phase=${1:-tests}
BATCH=groups-$phase
source "$(dirname "$0")/common.sh"
case $phase in
  tests)
    "$here/run.sh" >"$res/run.log" 2>&1
    note "run.sh: $(tail -n 1 "$res/run.log")"
    grep -E '^test .* FAILED|panicked|^FAIL' "$res/run.log" | head -n 20 | tee -a "$res/summary.txt"
    for t in send_recv_matrix group_all_to_all process_per_gpu_send_recv killed_peer_ends split_views; do
      grep -h -E "$t|groups:|replays of an all-to-all|after [0-9.]+m?s\)" "$here"/bundle-logs/*.log 2>/dev/null \
        | head -n 6 >>"$res/summary.txt"
    done
    cp -r "$here/bundle-logs" "$res/" 2>/dev/null
    ;;
  bench)
    same_nccl
    # nccl-tests' own send/recv and all-to-all beside ours (carry .nccl-tests from
    # `../shared/tools/nccl-tests.sh prepare`): plain, under graph (where NCCL registers the
    # user buffers: its best send/recv mode, perf-notes §26) and on ncclMemAlloc windows.
    if [ -f "$root/.nccl-tests/build.sh" ] && [ ! -x "$nt/sendrecv_perf" ]; then
      bash "$root/.nccl-tests/build.sh" >"$res/nccl-tests-build.log" 2>&1
      note "nccl-tests build: exit $?"
    fi
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
    ;;
  *)
    echo "usage: groups.sh tests|bench" >&2
    exit 2
    ;;
esac
note "done"
pack
