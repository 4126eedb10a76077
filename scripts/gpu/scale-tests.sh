#!/usr/bin/env bash
# Issue 12: the collective correctness suites at the given world sizes (default: every size from
# the machine's GPU count down to 2): one process driving every GPU (`gpu_coll`) and one
# process per GPU (`gpu_coll_procs`). Counts: P2PTEST_COUNTS (default 0,1,7,1023,65537).
# GPU_COLL_FILTER: test-name filters for gpu_coll (space separated; default: every test).
# Usage: scale-tests.sh [WORLD...]   Results: $OUT/scale-tests.tgz
source "$(dirname "$0")/common.sh"
export P2PTEST_COUNTS=${P2PTEST_COUNTS:-0,1,7,1023,65537}
worlds=${*:-$(seq "$n" -1 2)}
for w in $worlds; do
  for exe in p2p-collective--gpu_coll p2p-collective--gpu_coll_procs; do
    log=$res/$exe-w$w.log
    filter=""
    [ "$exe" = p2p-collective--gpu_coll ] && filter=${GPU_COLL_FILTER:-}
    # shellcheck disable=SC2086 # the filters are separate words
    P2PTEST_WORLD=$w timeout "${TEST_TIMEOUT:-300}" "$here/tests/$exe" $filter --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
    rc=$?
    note "world $w $exe: exit $rc: $(grep -E '^test result:' "$log" | tail -n 1)"
    grep -E '^test .* FAILED|^WRONG|panicked' "$log" | head -n 5
    pack
  done
done
note "done"
