#!/bin/bash
# llama.cpp for the serving benchmark's baseline (bench/infer_baselines.py):
# its source as PyPI's llama-cpp-python ships it (vendor/llama.cpp), built
# here with cmake for this CPU (llama-bench, llama-batched-bench, llama-quantize, llama-completion), and its gguf
# Python package. Nothing of it is linked into dtrain; tests never need it.
# usage: scripts/build-llama-cpp.sh [DIR]   (default: .llama.cpp in the repository)
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/.llama.cpp}
mkdir -p "$dir"
cd "$dir"
if [ ! -f src/CMakeLists.txt ]; then
    python3 -m pip download -q --no-deps --no-binary :all: -d dl "llama-cpp-python==0.3.36"
    tar xzf dl/llama_cpp_python-*.tar.gz
    rm -rf src && mv llama_cpp_python-*/vendor/llama.cpp src && rm -rf llama_cpp_python-* dl
fi
cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > cmake.log
cmake --build build -j"$(nproc)" --target llama-bench llama-batched-bench llama-quantize llama-completion > build.log
echo "llama.cpp: $dir/build/bin/llama-bench, llama-quantize; gguf-py: $dir/src/gguf-py"
