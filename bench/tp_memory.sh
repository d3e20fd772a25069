#!/bin/bash
# Tensor parallelism's memory per rank, measured against formulas: GPT-2
# 124M (12 layers, 12 heads, C 768, vocab 50257), batch 1, at T = 256 and
# 1024, one process against TP 2 and TP 2 with --sp (2 ranks), one step.
# - parameters, gradients, optimizer state per rank: what the run reports,
#   against 1/t of the split tensors plus the replicated ones
#   (dt_gpt2_part_num_params);
# - activations kept from forward for backward per layer: the run with 12
#   layers minus the run with 2, over 10, against dtrain's own formula
#   (fp32, no dropout; kept per layer: the residual stream, LN1/LN2
#   outputs and res2 on the stream's rows R, qkv, attention's output, fc
#   and gelu on all rows split by t; LN statistics; attention's softmax
#   rows, or one log-sum-exp per row from T = 256 (blockwise)):
#     bytes = 4 sbh (4 R/(sb) + 12/t) + 16 R + 4 (a/t) s b (s or 1)
#   and, for the shape, Korthikanti et al.'s (2-byte activations, dropout
#   masks): sbh (10 + 24/t + 5as/(ht)) and with SP sbh (34/t + 5as/(ht)).
# usage: bench/tp_memory.sh [DTRAIN (build/dtrain)]
set -euo pipefail
DTRAIN=${1:-$(dirname "$0")/../build/dtrain}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 300000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
# MiB -> bytes of a line "activations kept ... (rank 0): X MiB"
kept() { grep -o 'activations kept from forward for backward (rank 0): [0-9.]* MiB' "$1" | grep -o '[0-9.]* MiB' | cut -d' ' -f1; }
states() { grep -m1 '  rank 0:' "$1" | sed 's/.*rank 0: \([0-9.]*\), \([0-9.]*\), \([0-9.]*\),.*/\1 \2 \3/'; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'); GPT-2 124M, batch 1, fp32, one step"
printf "%-6s %-10s | %8s %8s %8s | %10s %10s | %12s %12s %8s\n" T layout "params" "grads" "optim" "formula" "(MiB)" \
    "kept/layer" "formula" "Korthikanti"
for T in 256 1024; do
    for layout in "1" "2" "2 sp"; do
        set -- $layout
        t=$1
        args=(--model 124M --vocab 50257 --data "$dir/train.bin" --batch 1 --seq "$T" --steps 1 --threads 1)
        [ "$t" = 2 ] && args+=(--nproc 2 --tp 2)
        [ "${2:-}" = sp ] && args+=(--sp)
        "$DTRAIN" train "${args[@]}" > "$dir/L12" 2>&1
        "$DTRAIN" train "${args[@]}" --layers 2 > "$dir/L2" 2>&1
        read -r p g o <<< "$(states "$dir/L12")"
        k12=$(kept "$dir/L12") k2=$(kept "$dir/L2")
        python3 - "$T" "$t" "${2:-}" "$p" "$g" "$o" "$k12" "$k2" << 'EOF'
import sys
T, t, sp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "sp"
p, g, o, k12, k2 = map(float, sys.argv[4:9])
s, b, h, a, L, V, Vp = T, 1, 768, 12, 12, 50257, 50304
split = L * (12 * h * h + 7 * h)
whole = Vp * h + 1024 * h + L * (12 * h * h + 13 * h) + 2 * h
psi = whole - split - Vp * h + split / t + -(-Vp // t) * h
R = s * b / (t if sp else 1)
att = s if s < 256 else 1  # softmax rows kept, or one log-sum-exp per row (blockwise from T = 256)
ours = 4 * s * b * h * (4 * R / (s * b) + 12 / t) + 16 * R + 4 * (a / t) * s * b * att
kor = s * b * h * ((34 / t) if sp else (10 + 24 / t)) + 5 * a * s * s * b / t
per_layer = (k12 - k2) / 10 * 2**20
mib = 2**20
name = f"tp {t}" + (" + sp" if sp else "") if t > 1 else "one"
print(f"{T:<6} {name:<10} | {p:8.1f} {g:8.1f} {o:8.1f} | {4 * psi / mib:10.1f} {'':>10} | {per_layer / mib:10.2f} MiB "
      f"{ours / mib:8.2f} MiB {kor / mib:8.2f} MiB")
EOF
    done
done
echo "params/grads/optim: MiB per rank as the run reports them; formula: 4 bytes x (1/t of the split tensors + the rest)"
echo "kept/layer: (kept with 12 layers - kept with 2) / 10, measured; formula: dtrain's; Korthikanti: sbh(10 + 24/t + 5as/(ht)), with SP sbh(34/t + 5as/(ht)) (2-byte activations and dropout masks)"
