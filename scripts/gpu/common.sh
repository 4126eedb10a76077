# Sourced by the batch scripts in this folder (copied into target/bundle by `cargo xtask bundle`).
# Sets: here (the bundle), root (the repository copy on the GPU machine), res (results folder),
# n (GPUs), nt (nccl-tests binaries, if built); exports the NVLink-multicast guards; defines
# pack (results into $OUT/NAME.tgz), note (a line to the summary) and same_nccl (makes
# cudarc's `libnccl.so` the library nccl-tests links, `libnccl.so.2`, so both compare one NCCL).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
name=${BATCH:-$(basename "$0" .sh)}
res=$here/$name
mkdir -p "$res"
# NVLink multicast is forbidden on the shared machines: keep it off for anything that runs NCCL.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RUST_BACKTRACE=1
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
nt=$root/.nccl-tests/build
started=$(date +%s)
pack() { if [ -n "${OUT:-}" ]; then tar czf "$OUT/$name.tgz" -C "$here" "$name"; fi; }
note() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$res/summary.txt"; }
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
# nccl-tests NAME FLAGS...: one run of NCCL's own harness into $res/nccl-tests-NAME.txt.
nccl_tests() {
  local exe=$1 tag=$2; shift 2
  if [ ! -x "$nt/${exe}_perf" ]; then note "nccl-tests $exe: not built"; return; fi
  NCCL_DEBUG=VERSION timeout 60 "$nt/${exe}_perf" -g "$n" "$@" >"$res/nccl-tests-$exe-$tag-w$n.txt" 2>&1
  note "nccl-tests $exe $tag ($*): exit $?"
}
# coll_ab TAG "FLAGS" ARGS...: RUNS (default 2) rounds of `p2p-bench coll ARGS`, each round once
# with FLAGS (split on spaces) into $res/coll-TAG-rN and once with the defaults into
# $res/coll-TAG-defaults-rN: a before and after in one session. Each run ends at COLL_TIMEOUT
# seconds (default 300).
coll_ab() {
  local tag=$1 r v
  local -a flags f
  read -r -a flags <<<"$2"
  shift 2
  for r in $(seq 1 "${RUNS:-2}"); do
    for v in "$tag" "$tag-defaults"; do
      f=()
      [ "$v" = "$tag" ] && f=("${flags[@]}")
      timeout "${COLL_TIMEOUT:-300}" "$here/p2p-bench" coll "$@" --out "$res/coll-$v-r$r" "${f[@]}" >"$res/coll-$v-r$r.log" 2>&1
      note "coll $v run $r (${f[*]}): exit $?"
      pack
    done
  done
}
