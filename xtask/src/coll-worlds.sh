#!/usr/bin/env bash
# The collective suites at every world size from 2 to the machine's GPU count (issue 7's runs):
# for each size, the correctness matrix in one process and with one process per GPU, then the
# benchmark beside NCCL. Usage: coll-worlds.sh [MAX_WORLD]. Logs and results go to ./coll-worlds
# beside this script; when OUT is set (the device tool brings back at most 8 files) they are
# packed into $OUT/coll-worlds.tgz after every world size, so a run cut short keeps what it did.
# Ends with one summary line per world size and `N passed, N failed`.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$here
mkdir -p "$out/coll-worlds"
export NCCL_NVLS_ENABLE=0 RUST_BACKTRACE=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
max=${1:-$gpus}
if [ "$gpus" -lt 2 ] || [ "$max" -lt 2 ]; then
  echo "coll-worlds.sh: needs at least 2 GPUs (found $gpus)" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
[ "$max" -gt "$gpus" ] && max=$gpus
passed=0 failed=0
for w in $(seq 2 "$max"); do
  for exe in p2p-collective--gpu_coll p2p-collective--gpu_coll_procs; do
    log="$out/coll-worlds/$exe-w$w.log"
    P2PTEST_WORLD=$w "$here/tests/$exe" --include-ignored --test-threads=1 --nocapture >"$log" 2>&1
    line=$(grep -E '^test result:' "$log" | tail -n 1)
    p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"${line:-x 0 passed; 1 failed}")
    f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"${line:-x 0 passed; 1 failed}")
    passed=$((passed + p)); failed=$((failed + f))
    echo "world $w $exe: ${line:-no test summary, see $log}"
  done
  if "$here/p2p-bench" coll --gpus "$w" --out "$out/coll-worlds/results-w$w" >"$out/coll-worlds/bench-w$w.md" 2>"$out/coll-worlds/bench-w$w.err"; then
    echo "world $w p2p-bench coll: ok"; passed=$((passed + 1))
  else
    echo "world $w p2p-bench coll: FAILED (see bench-w$w.err)"; failed=$((failed + 1))
  fi
  if [ -n "${OUT:-}" ]; then tar czf "$OUT/coll-worlds.tgz" -C "$out" coll-worlds; fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
