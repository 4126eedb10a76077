#!/usr/bin/env bash
# Issues 36 and 37 on 2+ GPUs (carry target/bundle, with downstream/p2p-downstream-candle-core
# from `.ci/downstream/candle.sh build`). Results: $OUT/final-36-37.tgz.
# 1. candle-core 0.11 itself (cuda) beside p2p: candle tensors all-reduced by p2p, twice.
# 2. The new GPU tests: synchronize's limit on a held stream, typed buffers.
# 3. run.sh whole (RUN_TIMEOUT, 300 s), then p2p-bench faults -n 2 for 100 s.
source "$(dirname "$0")/common.sh"
exe=$here/downstream/p2p-downstream-candle-core
ldd "$exe" >"$res/candle-ldd.txt" 2>&1
if grep -q "not found" "$res/candle-ldd.txt"; then
  # The CUDA 13 libraries candle links, wherever this machine keeps them.
  extra=$(find / -xdev \( -name 'libcublas.so.13' -o -name 'libcurand.so.10' -o -name 'libcudart.so.13' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH="${extra}${LD_LIBRARY_PATH:-}"
  ldd "$exe" >>"$res/candle-ldd.txt" 2>&1
fi
for round in 1 2; do
  out=$(XDG_CACHE_HOME=$(mktemp -d) timeout 120 "$exe" 2>&1)
  note "candle-core round $round: exit $?: $(tail -n 1 <<<"$out")"
  echo "$out" >"$res/candle-core-$round.log"
done
pack
timeout 120 "$here/tests/p2p-collective--gpu_coll" --include-ignored --test-threads=1 --nocapture \
  gpu2_synchronize gpu2_a_typed >"$res/gpu-tests.log" 2>&1
note "new GPU tests: exit $?; $(grep -E '^test result' "$res/gpu-tests.log")"
pack
OUT= timeout "${RUN_TIMEOUT:-300}" bash "$here/run.sh" >"$res/run.log" 2>&1
note "run.sh: exit $?; $(tail -n 1 "$res/run.log")"
tar czf "$res/bundle-logs.tgz" -C "$here" bundle-logs 2>/dev/null
pack
timeout 150 "$here/p2p-bench" faults -n 2 --seconds 100 --out "$res/faults" >"$res/faults.log" 2>&1
note "faults -n 2 (100 s): exit $?; $(grep -iE 'hang|wrong|leak' "$res/faults.log" | tail -n 3 | tr '\n' ' ')"
pack
