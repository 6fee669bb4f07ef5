#!/usr/bin/env bash
# Packs what a lent GPU machine (docs/gpu.md, "the bundle") needs to run modtrain's GPU
# tests and benchmarks into gpu_bundle.tar.xz at the repository root (git-ignored; carried with
# the device tool, whose limit is 64 MiB). That machine has CUDA, cuDNN and NCCL but none of
# Debian's packages and no network, so the bundle holds:
#   bin/   modtrain, cuda_tests, gpu_training_tests, nccl_tests: a CUDA build for sm_90
#          (H100/H200) without MPI (one process) and without oneDNN, for any x86-64-v3 CPU;
#   lib/   the shared libraries they load beyond the C/C++ runtime and CUDA's (protobuf,
#          Boost.Program_options, OpenBLAS and what it needs);
#   data/  the KJV shards of `modtrain prep --kjv`, byte-level (kjv/) and BPE-8k (kjv_bpe8k/).
# What runs from source there (scripts/gpu_run.sh, the recipes, the PyTorch twins
# benchmarks/pytorch/pytorch_gpu.py and pytorch_decode.py) travels with the working tree instead.
# Usage: scripts/gpu_bundle.sh   (BUILD=dir to build elsewhere than build-gpu-bundle)
#        BASE=rev scripts/gpu_bundle.sh   also packs revision rev (say, main before a change) as
#        gpu_bundle_base.tar.xz, from a git worktree in build-gpu-base/: carry both and run
#        `GPU_BUNDLE=gpu_bundle_base.tar.xz TAG=base_ scripts/gpu_run.sh eager` for a
#        before-and-after on one machine (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${BASE:-}" ]; then
  tree=build-gpu-base  # kept, with its build folder, so the next base builds incrementally
  if [ -e "$tree/.git" ]; then
    git -C "$tree" checkout -q --detach "$(git rev-parse "$BASE")"
  else
    rm -rf "$tree"
    git worktree add --force --detach "$tree" "$BASE" > /dev/null
  fi
  mkdir -p data
  ln -sfn "$PWD/data" "$tree/data"  # the shards are the same: made once, here
  (cd "$tree" && BASE= scripts/gpu_bundle.sh)
  mv "$tree/gpu_bundle.tar.xz" gpu_bundle_base.tar.xz
  echo "gpu_bundle: gpu_bundle_base.tar.xz is $(git rev-parse --short "$BASE")"
fi
build=${BUILD:-build-gpu-bundle}
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DMOD_CUDA_ARCHITECTURES=90 -DMOD_USE_MPI=OFF \
  -DMOD_USE_ONEDNN=OFF -DMOD_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3" \
  -DMOD_BUILD_BENCHMARKS=OFF > "$build/configure.log" 2>&1 || {
  cat "$build/configure.log"
  exit 1
}
cmake --build "$build" --target modtrain cuda_tests gpu_training_tests nccl_tests
bins=("$build/launcher/modtrain" "$build/tests/cuda_tests" "$build/tests/gpu_training_tests"
      "$build/tests/nccl_tests")

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/gpu_bundle"
mkdir -p "$root/bin" "$root/lib" "$root/data"
for b in "${bins[@]}"; do strip -o "$root/bin/$(basename "$b")" "$b"; done

# Libraries: what ldd resolves, minus the C/C++ runtime (the GPU machine's is as new or newer)
# and CUDA's own (there under /usr/local/cuda or Python's nvidia packages). OpenBLAS is opened
# with dlopen, so it and its dependencies are added by name.
system='/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so'
cuda='/lib(cuda|cudart|cublas|cublasLt|nccl|cudnn[^/]*)\.so'
openblas=$(ldconfig -p | awk '/libopenblas\.so\.0 /{p = $NF} END {print p}')
[ -n "$openblas" ] || { echo "gpu_bundle: libopenblas.so.0 not found (scripts/install_deps.sh)" >&2; exit 1; }
{ ldd "${bins[@]}"; ldd "$openblas"; echo "x => $openblas (0)"; } \
  | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
  | grep -Ev "$system" | grep -Ev "$cuda" \
  | while read -r lib; do cp -L "$lib" "$root/lib/$(basename "$lib")"; done

# CUPTI for train.profile_steps: opened with dlopen, so ldd does not list it.
cupti=$(ls /usr/local/cuda/lib64/libcupti.so.* /usr/local/cuda/lib/libcupti.so.* \
  /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.* 2>/dev/null | head -1 || true)
[ -z "$cupti" ] || cp -L "$cupti" "$root/lib/$(basename "$cupti" | cut -d. -f1-3)"

# The KJV twice: byte-level for the tiny recipes, BPE-8k for the GPT-2-small ones.
[ -f data/kjv/dataset.textproto ] || "$build/launcher/modtrain" prep --kjv --out data/kjv
[ -f data/kjv_bpe8k/dataset.textproto ] ||
  "$build/launcher/modtrain" prep --kjv --tokenizer bpe --vocab-size 8192 --out data/kjv_bpe8k
cp -r data/kjv data/kjv_bpe8k "$root/data/"

tar -C "$stage" -cJf gpu_bundle.tar.xz gpu_bundle
size=$(stat -c %s gpu_bundle.tar.xz)
echo "gpu_bundle: gpu_bundle.tar.xz, $((size / 1024 / 1024)) MiB ($(ls "$root/lib" | wc -l) libraries)"
if [ "$size" -gt $((64 * 1024 * 1024)) ]; then
  echo "gpu_bundle: over the device tool's 64 MiB carry limit" >&2
  exit 1
fi
