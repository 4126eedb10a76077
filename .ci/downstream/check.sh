#!/usr/bin/env bash
# Builds the downstream program (cudarc-app) once per cudarc configuration a user may choose,
# each in its own target directory: proof that p2p shares a dependency graph with them.
#   bash .ci/downstream/check.sh            # check every configuration (CI)
#   bash .ci/downstream/check.sh build DIR  # build the release binaries into DIR instead (candle's
#                                           # linked against stand-ins: link-stubs.sh)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-check}"
out="${2:-}"
for features in cuda-12040 cuda-12080 cuda-13000 candle cudarc-0-18 cudarc-0-17; do
  echo "== downstream: cudarc with feature set '$features'"
  target="$here/../../target/downstream-$features"
  env=()
  if [ "$features" = candle ]; then
    # candle's cudarc takes its CUDA version from the build system (no nvcc here, so the
    # variable says it) and links libcuda, cuBLAS and cuRAND at build time: `check` compiles
    # without linking; `build` links against stand-ins for CUDA 13's libraries, and on the GPU
    # machine the binary keeps a reference to the driver's libcuda.so.1 alone.
    env=(CUDARC_CUDA_VERSION=12080)
    if [ "$mode" = build ]; then
      bash "$here/link-stubs.sh" "$target/stubs"
      env=(CUDARC_CUDA_VERSION=13000 CUDA_PATH="$target/stubs")
    fi
  fi
  if [ "$mode" = build ]; then
    cmd=(build --release)
  else
    cmd=(check)
  fi
  env "${env[@]}" cargo "${cmd[@]}" --quiet --manifest-path "$here/cudarc-app/Cargo.toml" \
    --features "$features" --target-dir "$target"
  if [ "$mode" = build ]; then
    mkdir -p "$out"
    cp "$target/release/p2p-downstream-cudarc" "$out/p2p-downstream-$features"
  fi
done
echo "== downstream: every configuration builds"
