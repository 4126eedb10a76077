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
for features in cuda-12040 cuda-12080 cuda-13000 candle; do
  echo "== downstream: cudarc with feature set '$features'"
  target="$here/../../target/downstream-$features"
  if [ "$mode" = build ] && [ "$features" = candle ]; then
    # Linked against stand-ins for CUDA 13's libraries (none here); on the GPU machine the
    # binary loads the driver's libcuda.so.1, the only library it keeps a reference to.
    bash "$here/link-stubs.sh" "$target/stubs"
    CUDA_PATH="$target/stubs" CUDARC_CUDA_VERSION=13000 cargo build --release --quiet \
      --manifest-path "$here/cudarc-app/Cargo.toml" --features "$features" --target-dir "$target"
    mkdir -p "$out"
    cp "$target/release/p2p-downstream-cudarc" "$out/p2p-downstream-$features"
  elif [ "$mode" = build ]; then
    cargo build --release --quiet --manifest-path "$here/cudarc-app/Cargo.toml" \
      --features "$features" --target-dir "$target"
    mkdir -p "$out"
    cp "$target/release/p2p-downstream-cudarc" "$out/p2p-downstream-$features"
  elif [ "$features" = candle ]; then
    # candle links libcuda, cuBLAS and cuRAND at build time (dynamic-linking): `check` compiles
    # every crate without linking, which is what a shared build needs from us.
    # Its CUDA version comes from the build system (no nvcc here, so the variable says it).
    CUDARC_CUDA_VERSION=12080 cargo check --quiet --manifest-path "$here/cudarc-app/Cargo.toml" \
      --features "$features" --target-dir "$target"
  else
    cargo check --quiet --manifest-path "$here/cudarc-app/Cargo.toml" \
      --features "$features" --target-dir "$target"
  fi
done
echo "== downstream: every configuration builds"
