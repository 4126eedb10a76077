#!/usr/bin/env bash
# A/B timing of p2p-bench binaries built at different commits, on one machine in one run, so
# that a difference between them cannot be the machine's. Each binary runs ROUNDS times
# (default 2), the order alternating; each run writes its own results folder.
# Usage: ab-bench.sh NAME=BINARY... -- P2P-BENCH-ARGS...   Results: $OUT/ab-bench.tgz
# Example: ab-bench.sh old=../ab/p2p-bench-8f8915e new=./p2p-bench -- coll --ops all_reduce --max-mib 1
source "$(dirname "$0")/common.sh"
bins=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do bins+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
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
    timeout "${BENCH_TIMEOUT:-300}" "$bin" "$@" --out "$out" >"$out/log.txt" 2>&1
    note "round $round $tag ($bin): exit $?"
    pack
  done
done
note "done"
