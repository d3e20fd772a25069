#!/bin/bash
# Packs what bench/gpu_check.sh runs on a lent GPU machine, built here (a CPU machine with nvcc: the GPU machine has
# CUDA but not dtrain's Debian libraries): the GPU checks and bench from BUILD, dtrain and its GPU plugin (beside it), with the shared libraries they need
# that are not the C library's or CUDA's, into DIR/gpu-bin.tar.xz (DIR is ignored by git; name it in the device
# call's carry). A baseline built here by hand (llm.c's train_gpt2cu, docs/gpu.md says how) goes into DIR beside it.
# usage: scripts/gpu-carry.sh [BUILD] [DIR]
set -euo pipefail
build=${1:-build}
dir=${2:-.gpu}
# cuDNN's attention needs its frontend's headers at configure time (libcudnn itself is the GPU machine's)
"$(dirname "$0")/get-cudnn-frontend.sh"
cmake -S "$(dirname "$0")/.." -B "$build" > /dev/null
cmake --build "$build" -j"$(nproc)" --target test_gpu_open test_gpu_kernels test_gpu_lm test_gpu_decode gpu_lm_bench gpu_decode_bench \
  dtrain_cli dtrain_gpu_plugin
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$dir"
bins="$build/tests/test_gpu_open $build/tests/test_gpu_kernels $build/tests/test_gpu_lm $build/tests/test_gpu_decode $build/bench/gpu_lm_bench
      $build/bench/gpu_decode_bench $build/dtrain $build/libdtrain_gpu.so"
cp $bins "$stage/bin/"
# every library they load but the C library's own, the compiler's runtime and CUDA's (the GPU machine has those)
for b in $bins; do ldd "$b"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
  case "$name" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libgcc_s.so*|libstdc++.so*|libcublas*|libcudart*) ;;
    *) cp -L "$path" "$stage/lib/$name" ;;
  esac
done
tar -C "$stage" -cJf "$dir/gpu-bin.tar.xz" bin lib
grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
ls -la "$dir"
