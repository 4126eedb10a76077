# shellcheck shell=bash
# Sourced by the scripts of this folder (tests.sh, bench.sh, faults.sh, sweep.sh, one-gpu.sh),
# which `cargo xtask bundle` copies into target/bundle (harness/ with them). See README.md here.
# Sets: here (the bundle, or scripts/gpu), root (the repository copy on the GPU machine), script
# (the script's name), n (GPUs), nt (nccl-tests binaries, if built); exports the NVLink-multicast
# guards and the tests' fixtures and p2p-bench; defines run_phases (the command line), begin,
# pack (results into $OUT/NAME.tgz), note (a line to the summary), need (a GPU count), same_nccl
# (makes cudarc's `libnccl.so` the library nccl-tests links, `libnccl.so.2`, so both compare one
# NCCL), nccl_tests and coll_ab.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
script=$(basename "$0" .sh)
# NVLink multicast is forbidden on the shared machines: keep it off for anything that runs NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RUST_BACKTRACE=1
# The tests find the bundle's fixtures and p2p-bench here, as under run.sh.
export P2PTEST_FIXTURES=${P2PTEST_FIXTURES:-$here/fixtures} P2PTEST_BENCH_EXE=${P2PTEST_BENCH_EXE:-$here/p2p-bench}
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
nt=$root/.nccl-tests/build
# begin NAME: the results of one phase go to $here/NAME ($res), packed into $OUT/NAME.tgz.
begin() {
  name=$1
  res=$here/$name
  started=$(date +%s)
  mkdir -p "$res"
}
pack() { if [ -n "${OUT:-}" ]; then tar czf "$OUT/$name.tgz" -C "$here" "$name"; fi; }
note() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$res/summary.txt"; }
# need N: true with N or more GPUs; else notes that the phase was skipped.
need() {
  if [ "$n" -ge "$1" ]; then return 0; fi
  note "skipped: needs $1 or more GPUs, found $n"
  return 1
}
# usage: the script's head comment (its phases, their time and what to carry).
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
# run_phases DEFAULTS ARGS...: runs each phase named in ARGS (DEFAULTS when none) in order, as
# phase_NAME in a subshell (its exports stay its own). The numbers after a phase are its
# arguments; a phase listed in $REST takes every word after it instead (so it comes last).
# Each phase writes $here/SCRIPT-PHASE[-FIRSTARG] (FIRSTARG if a plain word) with summary.txt
# first, packed into $OUT/SCRIPT-PHASE[-FIRSTARG].tgz after every step and at its end. Unknown
# phases are refused before anything runs. A phase fails only by `exit N` (a wrong argument, a
# missing build); the script's exit status is the last failing phase's, or 0.
run_phases() {
  local defaults=$1 i j rc=0 status
  shift
  # shellcheck disable=SC2086 # the defaults are separate words
  [ $# -eq 0 ] && set -- $defaults
  if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then usage; exit 2; fi
  local -a words=("$@") phases=() firsts=() lasts=()
  i=0
  while [ "$i" -lt ${#words[@]} ]; do
    if ! declare -F "phase_${words[$i]}" >/dev/null; then
      echo "$script.sh: unknown phase \`${words[$i]}'" >&2
      usage >&2
      exit 2
    fi
    j=$((i + 1))
    if [[ " ${REST:-} " == *" ${words[$i]} "* ]]; then
      j=${#words[@]}
    else
      while [ "$j" -lt ${#words[@]} ] && [[ ${words[$j]} =~ ^[0-9]+$ ]]; do j=$((j + 1)); done
    fi
    phases+=("${words[$i]}") firsts+=($((i + 1))) lasts+=("$j")
    i=$j
  done
  for i in "${!phases[@]}"; do
    local -a args=("${words[@]:${firsts[$i]}:$((lasts[i] - firsts[i]))}")
    local tag=${args[0]:-}
    [[ $tag =~ ^[A-Za-z0-9_.-]+$ ]] || tag=
    begin "$script-${phases[$i]}${tag:+-$tag}"
    # A phase's status is 0 unless it exits with another (its steps' exits are in the summary).
    ( "phase_${phases[$i]}" "${args[@]}"; exit 0 )
    status=$?
    if [ "$status" -eq 0 ]; then
      note "phase ${phases[$i]}${args[*]:+ ${args[*]}}: done"
    else
      rc=$status
      note "phase ${phases[$i]}${args[*]:+ ${args[*]}}: ended with exit $status"
    fi
    pack
  done
  return "$rc"
}
same_nccl() {
  local so so2
  so=$(ldconfig -p | awk '/libnccl\.so \(/{print $NF; exit}')
  so2=$(ldconfig -p | awk '/libnccl\.so\.2 \(/{print $NF; exit}')
  {
    echo "libnccl.so -> ${so:-none} -> $( [ -n "$so" ] && readlink -f "$so")"
    echo "libnccl.so.2 -> ${so2:-none} -> $( [ -n "$so2" ] && readlink -f "$so2")"
    python3 -c 'import torch; print("torch NCCL", torch.cuda.nccl.version())' 2>&1
  } >"$res/nccl-libs.txt"
  if [ -n "$so2" ] && [ "$(readlink -f "$so2")" != "$( [ -n "$so" ] && readlink -f "$so")" ]; then
    mkdir -p /tmp/p2p-nccl && ln -sf "$(readlink -f "$so2")" /tmp/p2p-nccl/libnccl.so
    export LD_LIBRARY_PATH=/tmp/p2p-nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "p2p-bench loads $(readlink -f "$so2") (the library nccl-tests links)" >>"$res/nccl-libs.txt"
  fi
}
# nccl_tests EXE TAG FLAGS...: one run of NCCL's own harness (EXE_perf on every GPU) into
# $res/nccl-tests-EXE-TAG-wN.txt.
nccl_tests() {
  local exe=$1 tag=$2; shift 2
  if [ ! -x "$nt/${exe}_perf" ]; then note "nccl-tests $exe: not built"; return; fi
  NCCL_DEBUG=VERSION timeout 60 "$nt/${exe}_perf" -g "$n" "$@" >"$res/nccl-tests-$exe-$tag-w$n.txt" 2>&1
  note "nccl-tests $exe $tag ($*): exit $?"
}
# nccl_tests_build: builds nccl-tests from the carried .nccl-tests (../shared/tools/nccl-tests.sh
# prepare) in the background on the upper half of the cores, if it is carried and not built;
# sets nccl_build to the job's pid (wait for it before nccl_tests).
nccl_tests_build() {
  nccl_build=
  if [ -d "$root/.nccl-tests" ] && [ ! -x "$nt/all_reduce_perf" ]; then
    # A session of its own (setsid execs the rest in place), so that nccl_tests_wait can stop
    # the whole build, make and compilers included, by its process group.
    setsid nice -n 19 taskset -c "$(( $(nproc) / 2 ))-$(( $(nproc) - 1 ))" bash "$root/.nccl-tests/build.sh" >"$res/nccl-tests-build.log" 2>&1 &
    nccl_build=$!
  fi
}
# Waits for the background nccl-tests build, at most NCCL_BUILD_WAIT seconds (default 420): past
# that the build is killed and the phase goes on without nccl-tests.
nccl_tests_wait() {
  [ -n "${nccl_build:-}" ] || return 0
  local waited=0
  while kill -0 "$nccl_build" 2>/dev/null && [ "$waited" -lt "${NCCL_BUILD_WAIT:-420}" ]; do
    sleep 1
    waited=$((waited + 1))
  done
  if kill -0 "$nccl_build" 2>/dev/null; then
    kill -- "-$nccl_build" 2>/dev/null
    note "nccl-tests build: still running after ${NCCL_BUILD_WAIT:-420} s, killed"
  fi
  wait "$nccl_build"
  note "nccl-tests build: exit $?"
}
# coll_ab TAG "FLAGS" ARGS...: RUNS (default 2) rounds of `p2p-bench coll ARGS`, each round once
# with FLAGS (split on spaces) into $res/coll-TAG-rN and once with the defaults into
# $res/coll-TAG-defaults-rN: a before and after in one session. Each run ends at COLL_TIMEOUT
# seconds (default 300).
coll_ab() {
  local tag=$1 r v
  local -a knobs with
  read -r -a knobs <<<"$2"
  shift 2
  for r in $(seq 1 "${RUNS:-2}"); do
    for v in "$tag" "$tag-defaults"; do
      with=()
      [ "$v" = "$tag" ] && with=("${knobs[@]}")
      timeout "${COLL_TIMEOUT:-300}" "$here/p2p-bench" coll "$@" --out "$res/coll-$v-r$r" "${with[@]}" >"$res/coll-$v-r$r.log" 2>&1
      note "coll $v run $r (${with[*]}): exit $?"
      pack
    done
  done
}
