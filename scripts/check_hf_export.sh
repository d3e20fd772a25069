#!/bin/bash
# ckpt export DIR OUT/ against Hugging Face: GPT2LMHeadModel.from_pretrained(OUT)
# (and LlamaForCausalLM's, for a Llama trained by dtrain: GQA, untied head; Qwen3ForCausalLM's, for a Qwen 3: its
# heads' q and k norms, heads wider than the model / heads)
# loads the folder with no config written by hand, and its loss on the first
# validation batch equals dtrain eval's. Needs the baselines' virtual
# environment (scripts/make-baselines-venv.sh, then pip install transformers).
# usage: scripts/check_hf_export.sh [build/dtrain]
set -euo pipefail
D=${1:-build/dtrain}
venv=${DTRAIN_VENV:-$(cd "$(dirname "$0")/.." && pwd)/.venv-baselines}
[ -x "$venv/bin/python" ] || { echo "no $venv: run scripts/make-baselines-venv.sh, then $venv/bin/pip install transformers" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 100000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$D" tokenize --bytes "$dir/text" "$dir/train.bin" --val "$dir/val.bin" > /dev/null
check() { # NAME HF_CLASS TRAIN_FLAGS...
    local name=$1 cls=$2
    shift 2
    "$D" train --data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 32 --batch 2 --steps 20 \
        --threads 1 --save "$dir/ck-$name" --quiet "$@"
    "$D" ckpt export "$dir/ck-$name" "$dir/hf-$name/"
    local ours
    ours=$("$D" eval --model "$dir/ck-$name" --data "$dir/val.bin" --batch 2 --seq 32 --eval-batches 1 --threads 1 | grep -o "^validation loss [0-9.]*" | cut -d' ' -f3)
    "$venv/bin/python" - "$dir" "$ours" "$name" "$cls" <<'PY'
import sys, numpy as np, torch, transformers
d, ours, name, cls = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
m = getattr(transformers, cls).from_pretrained(d + "/hf-" + name, attn_implementation="eager").eval()
tok = np.fromfile(d + "/val.bin", dtype=np.uint16, offset=1024).astype(np.int64)
x, y = torch.tensor(tok[:64]).view(2, 32), torch.tensor(tok[1:65]).view(2, 32)
with torch.no_grad():
    logits = m(x).logits
hf = float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)))
print(f"transformers {transformers.__version__}: {cls}.from_pretrained loaded the folder; "
      f"loss on the first batch {hf:.6f}, dtrain eval {ours:.6f}, difference {abs(hf - ours):.2e}")
sys.exit(0 if abs(hf - ours) < 1e-4 else 1)
PY
}
check gpt2 GPT2LMHeadModel
check llama LlamaForCausalLM --model llama-tiny --kv-heads 2 --ffn 96
check qwen3 Qwen3ForCausalLM --model qwen3-tiny --kv-heads 2 --ffn 96
