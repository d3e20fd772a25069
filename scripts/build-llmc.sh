#!/bin/bash
# llm.c's train_gpt2cu, the GPU baseline of bench/gpu_check.sh's llmc part, built here (nvcc, for Hopper) from a
# checkout of karpathy/llm.c (SRC; docs/gpu.md names the commit the runs used) into OUT (default .gpu, what the device
# call carries): train_gpt2cu with its own attention kernels, and train_gpt2cu-cudnn with cuDNN's fused attention
# (its fastest path; cuDNN's frontend headers from scripts/get-cudnn-frontend.sh, libcudnn.so.9 from the GPU machine's
# library path at run time). One line is patched for CUDA 13 (cudaMemAdvise takes a cudaMemLocation now, in the
# managed-memory fallback of llmc/cuda_utils.cuh). cuDNN's frontend compiles kernels at run time through NVRTC
# (-lnvrtc; PyTorch's nvidia-cuda-nvrtc wheel has it on the GPU machine).
# usage: scripts/build-llmc.sh SRC [OUT]
set -euo pipefail
src=${1:?usage: scripts/build-llmc.sh LLM.C-CHECKOUT [OUT]}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${2:-$root/.gpu}" && cd "${2:-$root/.gpu}" && pwd)
"$root/scripts/get-cudnn-frontend.sh" > /dev/null
fe=$root/.cudnn-frontend/include
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src"/. "$work"
cd "$work"
sed -i 's/cudaMemAdvise(\*out, bytes, cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdvise(*out, bytes, cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' llmc/cuda_utils.cuh
grep -q cudaMemLocationTypeHost llmc/cuda_utils.cuh || { echo "build-llmc.sh: the CUDA 13 patch did not apply" >&2; exit 1; }
flags=(--threads=0 -t=0 --use_fast_math -std=c++17 -O3 --generate-code "arch=compute_90,code=[compute_90,sm_90]" -DENABLE_BF16)
nvcc "${flags[@]}" train_gpt2.cu -lcublas -lcublasLt -o "$out/train_gpt2cu"
nvcc -c "${flags[@]}" -DENABLE_CUDNN -I"$fe" llmc/cudnn_att.cpp -o cudnn_att.o
nvcc "${flags[@]}" -DENABLE_CUDNN -I"$fe" train_gpt2.cu cudnn_att.o -lcublas -lcublasLt -lcudnn -lnvrtc -o "$out/train_gpt2cu-cudnn"
ls -la "$out"/train_gpt2cu*
