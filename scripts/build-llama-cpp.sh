#!/bin/bash
# llama.cpp for the serving benchmark's baseline (bench/infer_baselines.py):
# its source as PyPI's llama-cpp-python ships it (vendor/llama.cpp), built
# here with cmake for this CPU (llama-bench, llama-batched-bench, llama-quantize, llama-completion), and its gguf
# Python package. Nothing of it is linked into dtrain; tests never need it.
# usage: scripts/build-llama-cpp.sh [DIR] [avx2|avx512]   (default: .llama.cpp in the repository)
#   avx2: for AVX2 and FMA alone whatever this CPU has, the baseline of a Zen 3 measured on a newer CPU (beside
#   DTRAIN_ROWDOT=avx2 for dtrain's side; ../shared/measuring.md), best in a folder of its own (.llama.cpp-avx2);
#   avx512: AVX-512 with VBMI, VNNI and BF16 but no AMX (an Intel Xeon guest here lists AMX, and llama.cpp's Q8_0 on
#   its AMX tiles stopped at an illegal instruction, tilezero)
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/.llama.cpp}
arch=(-DGGML_NATIVE=ON)
# the two fixed sets share everything but AVX-512's switches; AMX stays off in both
fixed=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AMX_TILE=OFF
       -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
case "${2:-native}" in
native) ;;
avx2 | avx512)
    on=$([ "$2" = avx512 ] && echo ON || echo OFF)
    arch=("${fixed[@]}" -DGGML_AVX512="$on" -DGGML_AVX512_VBMI="$on" -DGGML_AVX512_VNNI="$on" -DGGML_AVX512_BF16="$on"
          -DGGML_AVX_VNNI="$on") ;;
*) echo "build-llama-cpp.sh: the second argument is avx2 or avx512 (or nothing: this CPU's), not '$2'" >&2; exit 2 ;;
esac
mkdir -p "$dir"
cd "$dir"
if [ ! -f src/CMakeLists.txt ]; then
    python3 -m pip download -q --no-deps --no-binary :all: -d dl "llama-cpp-python==0.3.36"
    tar xzf dl/llama_cpp_python-*.tar.gz
    rm -rf src && mv llama_cpp_python-*/vendor/llama.cpp src && rm -rf llama_cpp_python-* dl
fi
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release "${arch[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > cmake.log
cmake --build build -j"$(nproc)" --target llama-bench llama-batched-bench llama-quantize llama-completion > build.log
echo "llama.cpp: $dir/build/bin/llama-bench, llama-quantize; gguf-py: $dir/src/gguf-py"
