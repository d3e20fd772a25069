#!/bin/bash
# What LoRA costs against full fine-tuning, and against PEFT + PyTorch, on one model and batch, in one run: tok/s
# (the median of the steps after the first) and peak memory of
#   dtrain, every weight trained          dtrain train --model M
#   dtrain, LoRA                           ... --lora-rank R --lora-targets L
#   PEFT + PyTorch, LoRA                   bench/peft_lora.py (transformers' model, peft's adapters, eager, f32)
#   PyTorch, every weight trained          bench/peft_lora.py --full
# for each thread count, the runs alternating (each twice, the faster kept), the CPU named. Needs the baselines'
# environment (scripts/make-baselines-venv.sh) for the PyTorch rows. LoRA's FLOPs a token are 4 N + attention + 6 x the
# adapters (no weight gradients for the frozen base) against full training's 6 N + attention: the ratio's ceiling.
# usage: bench/lora_cost.sh DTRAIN [MODEL (124M)] [RANK (16)] [TARGETS (c_attn)] [THREADS ("1 2")]
set -eu
DTRAIN=$1
MODEL=${2:-124M} RANK=${3:-16} TARGETS=${4:-c_attn} THREADS=${5:-1 2}
B=4 T=256 STEPS=6
here=$(cd "$(dirname "$0")" && pwd)
venv=${DTRAIN_VENV:-$here/../.venv-baselines}
[ -x "$venv/bin/python" ] || { echo "no baselines' environment at $venv: scripts/make-baselines-venv.sh makes it" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 3000000 /dev/urandom | od -An -tu2 -w2 -v | awk '{print $1 % 49000}' | head -200000 > "$dir/ids"
python3 - "$dir/ids" "$dir/tok.bin" <<'EOF'
import struct, sys
ids = [int(x) for x in open(sys.argv[1])]
with open(sys.argv[2], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
    f.write(struct.pack("<%dH" % len(ids), *ids))
EOF
median() { sort -g | awk '{a[NR]=$1} END{print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
dtrain_run() { # THREADS ARGS... -> "tok/s MiB"
    local t=$1
    shift
    "$DTRAIN" train --model "$MODEL" --data "$dir/tok.bin" --batch $B --seq $T --steps $STEPS --threads "$t" --lr 1e-4 "$@" \
        --metrics "$dir/m.jsonl" > "$dir/out" 2>&1 || { tail -3 "$dir/out" >&2; exit 1; }
    local tps mem
    tps=$(grep -o '"tok_per_s":[0-9.]*' "$dir/m.jsonl" | cut -d: -f2 | tail -n +2 | median)
    mem=$(grep -o "^peak memory [0-9.]*" "$dir/out" | awk '{print $3}')
    echo "$tps $mem"
}
torch_run() { # THREADS ARGS...
    local t=$1
    shift
    "$venv/bin/python" "$here/peft_lora.py" --model "$MODEL" --batch $B --seq $T --steps $STEPS --threads "$t" --rank "$RANK" \
        --targets "$TARGETS" "$@" > "$dir/p.jsonl" 2> "$dir/p.err" || { tail -3 "$dir/p.err" >&2; exit 1; }
    local tps mem
    tps=$(grep -o '"ms": [0-9.]*' "$dir/p.jsonl" | awk -v n=$((B * T)) '{print n * 1000 / $2}' | tail -n +2 | median)
    mem=$(grep -o '"peak_rss_mib": [0-9.]*' "$dir/p.jsonl" | awk '{print $2}')
    echo "$tps $mem"
}
cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
flags=$(grep -m1 "^flags" /proc/cpuinfo)
case "$flags" in *avx512_bf16*) cpu="$cpu (AVX-512 with avx512_bf16: Zen 4 or later)" ;; *avx2*) cpu="$cpu (AVX2)" ;; esac
echo "CPU: $cpu; $MODEL, batch $B x $T, LoRA rank $RANK on $TARGETS, AdamW, f32; tok/s: median of steps 2..$STEPS; each run twice, alternating"
printf "%-8s %-34s %10s %12s\n" threads run "tok/s" "peak MiB"
for t in $THREADS; do
    declare -A best=() mem=()
    for rep in 1 2; do
        for run in full lora peft torch; do
            case $run in
                full) r=$(dtrain_run "$t") ;;
                lora) r=$(dtrain_run "$t" --lora-rank "$RANK" --lora-targets "$TARGETS") ;;
                peft) r=$(torch_run "$t") ;;
                torch) r=$(torch_run "$t" --full) ;;
            esac
            set -- $r
            if [ -z "${best[$run]:-}" ] || awk "BEGIN{exit !($1 > ${best[$run]})}"; then best[$run]=$1; fi
            mem[$run]=$2
        done
    done
    printf "%-8s %-34s %10.1f %12.0f\n" "$t" "dtrain, every weight" "${best[full]}" "${mem[full]}"
    printf "%-8s %-34s %10.1f %12.0f\n" "$t" "dtrain, LoRA" "${best[lora]}" "${mem[lora]}"
    printf "%-8s %-34s %10.1f %12.0f\n" "$t" "PEFT + PyTorch, LoRA" "${best[peft]}" "${mem[peft]}"
    printf "%-8s %-34s %10.1f %12.0f\n" "$t" "PyTorch, every weight" "${best[torch]}" "${mem[torch]}"
    awk -v f="${best[full]}" -v l="${best[lora]}" -v p="${best[peft]}" -v mf="${mem[full]}" -v ml="${mem[lora]}" -v t="$t" \
        'BEGIN{printf "%-8s LoRA / every weight %.2fx; dtrain LoRA / PEFT %.2fx; memory LoRA / every weight %.2fx\n", t, l / f, l / p, ml / mf}'
done
