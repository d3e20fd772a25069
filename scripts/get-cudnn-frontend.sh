#!/bin/bash
# cuDNN's frontend (NVIDIA's C++ headers for cuDNN's graph API: its fused attention, SDPA) from PyPI's
# nvidia-cudnn-frontend wheel, into DIR/include, where CMake looks for it (-DDT_CUDNN_FRONTEND=DIR/include to put it
# elsewhere). Headers only: cuDNN itself (libcudnn.so.9) is loaded at run time by --attention cudnn, from the
# library path (PyTorch's nvidia-cudnn wheel has it on a GPU machine). Nothing here is needed without a GPU.
# usage: scripts/get-cudnn-frontend.sh [DIR]   (default: .cudnn-frontend in the repository)
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")/.." && pwd)/.cudnn-frontend}
version=1.32.0
[ -f "$dir/include/cudnn_frontend.h" ] && { echo "cuDNN frontend: $dir/include"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp" "nvidia-cudnn-frontend==$version"
mkdir -p "$dir"
python3 - "$tmp" "$dir" <<'PY'
import glob, sys, zipfile
tmp, out = sys.argv[1:]
with zipfile.ZipFile(glob.glob(tmp + "/*.whl")[0]) as z:
    z.extractall(out, [n for n in z.namelist() if n.startswith("include/")])
PY
echo "cuDNN frontend $version: $dir/include"
