#!/usr/bin/env bash
# Link-time stand-ins for the CUDA libraries a cudarc build with `dynamic-linking` links (candle's
# configuration): a stub libcuda, libnvrtc, libcublas, libcublasLt and libcurand exporting every
# entry point cudarc's bindings declare, under the sonames of CUDA 13. Only for linking here,
# where there is no CUDA: the binary loads the real libraries (the driver's, the toolkit's) on
# the GPU machine.   link-stubs.sh DIR   (writes DIR/lib64/*.so; point CUDA_PATH at DIR)
set -euo pipefail
dir="$1/lib64"
mkdir -p "$dir"
here="$(cd "$(dirname "$0")" && pwd)"
# cudarc 0.19's sources (candle 0.11's cudarc), from the app's build with that version.
src=$(cargo metadata --format-version 1 --features v0-19 --manifest-path "$here/cudarc-app/Cargo.toml" 2>/dev/null |
  python3 -c 'import json,sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"]=="cudarc" and p["version"].startswith("0.19.")).rsplit("/",1)[0])')
stub() { # stub MODULE LIB SONAME
  grep -ohE 'pub unsafe fn [a-zA-Z][A-Za-z0-9_]*\(' "$src/src/$1/sys/mod.rs" | sed -E 's/pub unsafe fn ([A-Za-z0-9_]+)\(/void \1(void) {}/' | sort -u >"$dir/$2.c"
  cc -shared -fPIC -o "$dir/lib$2.so" -Wl,-soname,"$3" "$dir/$2.c"
}
stub driver cuda libcuda.so.1
stub nvrtc nvrtc libnvrtc.so.13
stub cublas cublas libcublas.so.13
stub cublaslt cublasLt libcublasLt.so.13
stub curand curand libcurand.so.10
