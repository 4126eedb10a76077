#!/usr/bin/env bash
# Runs the p2p bundle on a GPU machine: every test executable, GPU tests included.
# Usage: run.sh [TEST-NAME-FILTER]   (e.g. `run.sh gpu1_` for the one-GPU tests only)
# Logs go to ./bundle-logs beside this script; when OUT is set (the device tool, which brings back
# at most 8 files) they are also packed into $OUT/bundle-logs.tgz. Ends with `N passed, N failed`.
set -u
here=$(cd "$(dirname "$0")" && pwd)
filter=${1:-}
logs=$here/bundle-logs
mkdir -p "$logs"

# NVLink multicast is forbidden on the shared machines: keep it off for anything that runs NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RUST_BACKTRACE=1
# The tests find the bundle's fixtures and p2p-bench here, not in a source tree.
export P2PTEST_FIXTURES="${P2PTEST_FIXTURES:-$here/fixtures}" P2PTEST_BENCH_EXE="$here/p2p-bench"
# The collective matrices at counts up to 65537: with the full sizes (2^20+3 and 64 Mi elements,
# the tests' default) the whole run took more than the device tool's 10 minutes a command on
# 2 x H200 (2026-11-22). Set P2PTEST_COUNTS to run those.
export P2PTEST_COUNTS="${P2PTEST_COUNTS:-0,1,7,1023,65537}"

if ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "run.sh: no NVIDIA GPU found (no /dev/nvidiaN, nvidia-smi failed): this bundle needs a GPU machine" >&2
  echo "0 passed, 1 failed"
  exit 1
fi
nvidia-smi -L 2>/dev/null | sed 's/^/gpu: /'
"$here/p2p-bench" list 2>&1 | tee "$logs/p2p-bench-list.log"

passed=0 failed=0 broken=0
# The TCPStore client's test against torch needs the store store-check.py serves: it runs below,
# through that script, and is skipped in the loop.
store_test=rendezvous::store::tests::store_against_torch
for exe in "$here"/tests/*; do
  name=$(basename "$exe")
  log="$logs/$name.log"
  echo "== $name"
  # One test at a time: the GPU tests measure free memory and spawn helper processes.
  # --nocapture keeps what passing tests print (figures, which fallback ran) in the log.
  if [ -n "$filter" ]; then
    "$exe" --include-ignored --test-threads=1 --nocapture --skip "$store_test" "$filter" >"$log" 2>&1
  else
    "$exe" --include-ignored --test-threads=1 --nocapture --skip "$store_test" >"$log" 2>&1
  fi
  rc=$?
  grep -E '^test .* \.\.\. (FAILED|ignored)' "$log" | sed 's/^/   /'
  line=$(grep -E '^test result:' "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "   no test summary (exit $rc): see $log"; tail -n 20 "$log" | sed 's/^/   | /'
    broken=$((broken + 1)); failed=$((failed + 1)); continue
  fi
  p=$(sed -E 's/.* ([0-9]+) passed.*/\1/' <<<"$line"); f=$(sed -E 's/.* ([0-9]+) failed.*/\1/' <<<"$line")
  passed=$((passed + p)); failed=$((failed + f))
  echo "   $line"
  if [ "$f" -gt 0 ]; then grep -E -A30 '^---- ' "$log" | head -n 80 | sed 's/^/   | /'; fi
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then broken=$((broken + 1)); failed=$((failed + 1)); fi
done
# p2p's TCPStore client against a real torch.distributed.TCPStore (libuv and classic servers),
# where torch is installed.
if [ -z "$filter" ] || [ "$filter" = store ]; then
  echo "== store-check (p2p-transport's store client against torch's TCPStore)"
  log="$logs/store-check.log"
  if ! python3 -c 'import torch' >/dev/null 2>&1; then
    echo "   torch is not installed here: not run"
  else
    timeout 150 python3 "$here/store-check.py" -- "$here/tests/p2p-transport" --ignored --exact \
      "$store_test" --nocapture >"$log" 2>&1
    rc=$?
    p=$(grep -c ': pass ' "$log"); f=$(grep -c ': FAIL' "$log")
    passed=$((passed + p)); failed=$((failed + f))
    grep -E '^store-check ' "$log" | sed 's/^/   /'
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
      failed=$((failed + 1)); echo "   FAILED (exit $rc): see $log"; tail -n 20 "$log" | sed 's/^/   | /'
    fi
  fi
fi
# The example programs (examples/src/bin): each checks its own results and exits non-zero on a
# wrong element. One process over every GPU, then one process per GPU under p2p-bench launch and,
# where it is installed, under real torchrun.
if [ -z "$filter" ] || [ "$filter" = examples ]; then
  gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
  [ "$gpus" -ge 1 ] || gpus=1
  run_example() {
    local name=$1; shift
    local log="$logs/example-$name.log"
    echo "== example $name"
    timeout 300 "$@" >"$log" 2>&1
    local rc=$?
    if [ "$rc" -eq 0 ]; then
      passed=$((passed + 1)); grep -E "wrong" "$log" | tail -n 1 | sed 's/^/   /'
    else
      failed=$((failed + 1)); echo "   FAILED (exit $rc): see $log"; tail -n 20 "$log" | sed 's/^/   | /'
    fi
  }
  run_example data_parallel "$here/examples/data_parallel"
  run_example tensor_parallel_graph "$here/examples/tensor_parallel_graph"
  run_example torchrun_job-launch "$here/p2p-bench" launch -n "$gpus" -- "$here/examples/torchrun_job"
  run_example moe_dispatch-launch "$here/p2p-bench" launch -n "$gpus" -- "$here/examples/moe_dispatch"
  if command -v torchrun >/dev/null 2>&1; then
    run_example torchrun_job-torchrun torchrun --nproc_per_node="$gpus" --no-python "$here/examples/torchrun_job"
  else
    echo "== example torchrun_job-torchrun: torchrun is not installed here, not run"
  fi
fi
if [ -n "${OUT:-}" ]; then tar czf "$OUT/bundle-logs.tgz" -C "$here" bundle-logs && echo "logs: $OUT/bundle-logs.tgz"; fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
