#!/usr/bin/env bash
# Builds candle-app: candle-core 0.11 with its `cuda` feature beside p2p-collective. candle's
# kernels need nvcc, taken from PyPI (CUDA 13.0: nvcc, nvvm, runtime headers, CCCL) into
# target/cuda13; cudarc links the CUDA libraries at build time, so link-stubs.sh stands in for
# them (the binary loads the real ones on the GPU machine).
#   bash .ci/downstream/candle.sh check        (CI: compiles everything, candle's kernels too;
#                                               links nothing)
#   bash .ci/downstream/candle.sh build OUT    (the release binary, copied into OUT)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cuda="$root/target/cuda13"
if [ ! -x "$cuda/nvidia/cu13/bin/nvcc" ]; then
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$cuda" \
    "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-runtime==13.0.96" \
    "nvidia-cuda-cccl==13.0.85" "nvidia-cuda-crt==13.0.88"
fi
# candle's kernels link the CUDA runtime: PyPI ships its soname only, so add the link name.
ln -sf libcudart.so.13 "$cuda/nvidia/cu13/lib/libcudart.so"
target="$root/target/downstream-candle-app"
bash "$here/link-stubs.sh" "$target/stubs"
mode="${1:-check}"
# nvcc and its headers for candle's kernels (sm_90: H100/H200); the stand-ins for linking.
export PATH="$cuda/nvidia/cu13/bin:$PATH" CUDA_HOME="$cuda/nvidia/cu13" CUDA_ROOT="$target/stubs" \
  CUDA_COMPUTE_CAP=90 CUDARC_CUDA_VERSION=13000
if [ "$mode" = build ]; then
  cargo build --release --quiet --manifest-path "$here/candle-app/Cargo.toml" --target-dir "$target"
  mkdir -p "$2"
  # Under its own name: check.sh writes p2p-downstream-candle (cudarc's candle feature) there.
  cp "$target/release/p2p-downstream-candle" "$2/p2p-downstream-candle-core"
else
  cargo check --quiet --manifest-path "$here/candle-app/Cargo.toml" --target-dir "$target"
fi
echo "== downstream: candle-core 0.11 (cuda) with p2p-collective builds"
