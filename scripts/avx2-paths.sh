#!/bin/bash
# Runs a command on the AVX2 paths, what a Zen 3 runs, on a CPU with AVX-512: dtrain's run-time choices (OpenBLAS's
# Haswell kernels, the AVX2 row kernels, no bf16 GEMM) and its baselines' alike (PyTorch's ATen kernels, MKL and
# oneDNN held to AVX2), so that a ratio measured here compares the same instruction sets on both sides. With a build
# configured with -DDT_MARCH=znver3 the compiled loops are a Zen 3's too. llama.cpp is a build of its own:
# scripts/build-llama-cpp.sh .llama.cpp-avx2 avx2, then DTRAIN_LLAMA_CPP=.llama.cpp-avx2.
# usage: scripts/avx2-paths.sh COMMAND [ARGS...]     (e.g. scripts/avx2-paths.sh bash bench/moe_ep.sh build/dtrain)
set -eu
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
export OPENBLAS_CORETYPE=Haswell DTRAIN_BF16_GEMM=0 DTRAIN_ROWDOT=avx2
export ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
exec "$@"
