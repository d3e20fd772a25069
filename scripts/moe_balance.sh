#!/bin/bash
# Balancing a mixture of experts on the demo's text (the King James Bible's bytes, the demo's split): a Llama of 4
# layers and 128 channels whose MLP is 8 SwiGLU experts of 172 hidden units, top 2, 200 steps of 16 x 128 tokens.
# MODEL=gpt: a GPT-2 of 4 layers and 128 channels whose MLP is 8 GELU experts of 512 hidden units (gpt2_moe), the rest
# alike. Three runs, alike but for the balancing: none, the auxiliary loss (Switch's, 0.01), and DeepSeek-V3's bias
# (--router sigmoid-bias, the bias moved by --bias-update after each step). Prints each run's validation loss and
# the load (the most chosen expert over the mean: the worst layer's, and the layers' average) over the last 20
# steps, a step's batch at a time, and over the last evaluation's 16 batches (32,768 held-out tokens at once: the
# auxiliary-loss-free paper's MaxVio_global, plus one); each run's metrics and report are in OUT.
# usage: scripts/moe_balance.sh [BUILD] [OUT] [RATE]    (BUILD build, OUT build/moe_balance, RATE 0.01; ONLY_BIAS=1: the
# bias run alone; ROWS=1: each batch's rows drawn from across the text, --shuffle-rows; BATCH=N: N rows a step, 16;
# ACCUM=N: the batch in N micro-batches; MORE=1: also the global-batch loss (0.01, counted over the step's
# micro-batches) and the bias with DeepSeek-V3's sequence-wise loss (1e-4); SEED=N: another initialisation and batch
# order, --seed N --shuffle N)
set -euo pipefail
build=${1:-build}
out=${2:-$build/moe_balance}
rate=${3:-0.01}
dtrain=$build/dtrain
mkdir -p "$out"
if [ ! -s "$build/demo/train.bin" ]; then
    echo "the demo's data first: make demo (or scripts/demo.sh $build)"; exit 1
fi
model=(--model mixtral-tiny)
rows=()
[ -z "${ROWS:-}" ] || rows=(--shuffle-rows)
[ "${MODEL:-}" != gpt ] || model=(--model d6 --layers 4 --channels 128 --heads 4 --experts 8 --ffn 512)
accum=${ACCUM:-1}
common=("${model[@]}" --vocab 256 --max-seq 128 --seq 128 --batch $((${BATCH:-16} / accum)) --grad-accum "$accum" --steps 200 --lr 2e-3 --schedule cosine --warmup 20
        --lr-min 2e-4 --shuffle "${SEED:-1}" --seed "${SEED:-1337}" "${rows[@]}" --data "$build/demo/train.bin" --val-data "$build/demo/val.bin" --eval-every 50 --eval-batches 16
        --print-every 50)
run() { # NAME ARGS
    local name=$1
    shift
    "$dtrain" train "${common[@]}" "$@" --metrics "$out/$name.jsonl" --report "$out/$name" > "$out/$name.out" 2>&1
    local val worst avg
    val=$(grep -o '"val_loss":[0-9.]*' "$out/$name.jsonl" | tail -1 | cut -d: -f2)
    worst=$(grep -o '"expert_load_max_mean":[0-9.]*' "$out/$name.jsonl" | tail -20 | cut -d: -f2 | awk '{s+=$1} END{printf "%.3f", s/NR}')
    avg=$(grep -o '"expert_load_max_mean_avg":[0-9.]*' "$out/$name.jsonl" | tail -20 | cut -d: -f2 | awk '{s+=$1} END{printf "%.3f", s/NR}')
    vworst=$(grep -o '"val_expert_load_max_mean":[0-9.]*' "$out/$name.jsonl" | tail -1 | cut -d: -f2)
    vavg=$(grep -o '"val_expert_load_max_mean_avg":[0-9.]*' "$out/$name.jsonl" | tail -1 | cut -d: -f2)
    printf "%-28s validation loss %s   load max/mean over the last 20 steps: worst layer %s, layers' average %s; over the validation batches: %s, %s\n" \
        "$name" "$val" "$worst" "$avg" "$vworst" "$vavg"
}
[ -n "${ONLY_BIAS:-}" ] || run none
[ -n "${ONLY_BIAS:-}" ] || run aux_0.01 --moe-aux-loss 0.01
run "bias_$rate" --router sigmoid-bias --bias-update "$rate"
[ -z "${MORE:-}" ] || run global_0.01 --moe-global-aux-loss 0.01
[ -z "${MORE:-}" ] || run "bias_${rate}_seq_1e-4" --router sigmoid-bias --bias-update "$rate" --moe-seq-aux-loss 1e-4
