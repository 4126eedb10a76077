#!/usr/bin/env bash
# Copy-engine all-reduce on 2 GPUs (perf-notes §30): builds ce_allreduce.cu with nvcc and runs
# its variants (chunks K and their schedule, reduce grid, one or two copy streams, the copy-only
# bound, an all-to-all's copies) at 256 MiB, 512 MiB and 1 GiB, twice. Needs nvcc and 2 GPUs; no Rust. Run from the repository root:
# bash scripts/gpu/ce-allreduce.sh. Output: ce-allreduce/ce-allreduce.txt (into $OUT when set).
set -u
cd "$(dirname "$0")/../.."
res=ce-allreduce
mkdir -p "$res"
arch=${ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d .)}
# The library's coll_abi.h and coll.cu first (only coll_f32's kernels: compile time), for the
# lib variants.
# LIBSED=EXPR also builds ce_allreduce_alt with the sed expression EXPR applied to coll.cu: its
# variants are named alt:MODE (an A/B of a change to the library's kernel in one run);
# LIBSED1..LIBSED6 likewise build ce_allreduce_alt1..6, variants alt1:MODE..alt6:MODE.
src=p2p-collective/src/kernels
build() {
  local name=$1 expr=$2
  {
    cat "$src/coll_abi.h"
    sed -e '/^COLL_KERNEL(coll_/{/^COLL_KERNEL(coll_f32,/!d}' -e "$expr" "$src/coll.cu"
    cat scripts/gpu/harness.cuh scripts/gpu/ce_allreduce.cu
  } >"$res/$name.cu"
  if ! nvcc -O3 -std=c++17 -arch="sm_$arch" -o "$res/$name" "$res/$name.cu" -lcuda \
    >"$res/$name.build.log" 2>&1; then
    # Runs in the background: say so in the log, whose runs of $name then fail with exit 127.
    echo "# BUILD FAILED: $name (see $name.build.log)" >>"$log"
    cat "$res/$name.build.log"
    exit 1
  fi
}
log=$res/ce-allreduce.txt
echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1); variant size K grid streams us busbw wrong" >"$log"
build ce_allreduce "" &
for alt in "" 1 2 3 4 5 6; do
  var=LIBSED$alt
  if [ -n "${!var:-}" ]; then
    build "ce_allreduce_alt$alt" "${!var}" &
    echo "# alt$alt: coll.cu with sed '${!var}'" >>"$log"
  fi
done
wait
run() {
  local exe=ce_allreduce mode=${6:-}
  if [[ $mode =~ ^(alt[1-6]?):(.*)$ ]]; then
    exe=ce_allreduce_${BASH_REMATCH[1]}
    set -- "$1" "$2" "$3" "$4" "$5" "${BASH_REMATCH[2]}"
    echo -n "${BASH_REMATCH[1]} " >>"$log"
  fi
  timeout 60 "$res/$exe" "$@" >>"$log" 2>&1 || echo "$exe $*: exit $?" >>"$log"
}
# Each line of $VARIANTS: K GRID STREAMS MODE (see ce_allreduce.cu), run at every size of $SIZES.
VARIANTS=${VARIANTS:-"1 132 1 copyonly
8 132 1 uni
6 132 1 geo
8 132 1 geo
8 132 2 geo
10 132 1 geo
8 32 1 geo
1 0 1 a2a
1 16 1 a2a
1 32 1 a2a"}
for rep in $(seq "${REPS:-2}"); do
  for mib in ${SIZES:-1024 512 256}; do
    it=$((2048 / mib)); [ $it -lt 5 ] && it=5; [ $it -gt 40 ] && it=40
    while read -r k g s mode; do
      [ -n "$k" ] && run "$mib" "$k" "$g" "$s" "$it" "$mode"
    done <<<"$VARIANTS"
  done
done
[ -n "${OUT:-}" ] && cp "$log" "$OUT/"
cat "$log"
