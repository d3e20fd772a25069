#!/bin/bash
# The Python baselines' virtual environment (about 5 GB): PyTorch 2.x and torchvision (FSDP2,
# ZeroRedundancyOptimizer), transformers (generate, for bench infer) and DeepSpeed (its CPU accelerator runs ZeRO 1-3
# over gloo), from PyPI. Benchmarks look for it at $DTRAIN_VENV, else
# .venv-baselines in the repository; tests never need it.
# usage: scripts/make-baselines-venv.sh [DIR]
set -euo pipefail
dir=${1:-${DTRAIN_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv-baselines}}
command -v /usr/bin/python3 > /dev/null || { echo "needs Debian's python3 (apt-get install python3 python3-venv)" >&2; exit 1; }
/usr/bin/python3 -m venv "$dir"
"$dir/bin/pip" install --upgrade pip
"$dir/bin/pip" install "torch>=2.6" torchvision numpy  # torchvision: the ResNet-50 baseline
"$dir/bin/pip" install transformers safetensors       # bench infer: HF generate on dtrain's weights
"$dir/bin/pip" install peft trl                       # LoRA's and SFT's oracles (tests/fixtures/lora, sft)
"$dir/bin/pip" install gymnasium box2d pygame envpool  # the environments' oracles and rollout baselines (tests/fixtures/rl)
# DeepSpeed builds its ops on first use; none of them is needed on CPU (DS_BUILD_OPS=0)
DS_BUILD_OPS=0 "$dir/bin/pip" install deepspeed py-cpuinfo
"$dir/bin/python" -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"
echo "baselines: $dir"
