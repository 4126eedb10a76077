#!/usr/bin/env bash
# The seventh session's work, owed a GPU (written with no device time): run in two commands on
# nvidia-h200-x2 (or a machine of more GPUs), each under the device tool's 10 minutes.
#   groups.sh tests   the whole bundle (run.sh: every test executable and the examples), which
#                     now includes the group tests (gpu2_send_recv_matrix (groups),
#                     gpu2_group_all_to_all_under_graph_and_refused_groups, groups in
#                     gpu2_process_per_gpu_send_recv) and the connection liveness test
#                     (gpu1_a_killed_peer_ends_a_watched_connection_wait).
#   groups.sh bench   p2p-bench sendrecv (ring and all-to-all, ours beside NCCL, eager and graph)
#                     and a short p2p-bench coll (the shared timing module, the progress bar).
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
