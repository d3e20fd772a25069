#!/bin/bash
# Second order against AdamW on the demo's text (the King James Bible, bytes), the d6 shape (6 layers, 384 channels,
# 6 heads) with a byte vocabulary, 2 data-parallel ranks of 1 thread, batch 16 x 64 a rank, the demo's cosine schedule:
# AdamW at three learning rates for STEPS steps, the best one's final validation loss the target; then each of the
# other optimizers at that best rate (Shampoo grafts Adam's step size onto its directions; SOAP is Adam in a rotated
# basis), and the step and the wall time (the steps' own time, evaluations left out, as for AdamW) at which its
# validation loss first reaches the target. Evaluations every 25 steps on 16 batches of the held-out 5%.
# usage: [SECOND_ARGS="--shampoo-block 256"] bench/second_order_d6.sh [BUILD_DIR] [STEPS] [LRS] [OPTIMIZERS]
#   defaults: build 800 "1e-3 2e-3 4e-3" "shampoo soap" (an empty OPTIMIZERS: AdamW alone); SECOND_ARGS: flags the
#   second-order runs add (their results named with them), several sets separated by ';' each run after the one AdamW;
#   EVAL_EVERY (25): steps between evaluations, which place the step a run reaches the target
set -euo pipefail
build=${1:-build}
steps=${2:-800}
lrs=${3-1e-3 2e-3 4e-3}
opts=${4-shampoo soap}
out=$build/bench_second_order
mkdir -p "$out"
dtrain=$build/dtrain
if [ ! -s "$out/train.bin" ]; then
    bible -f Gen1:1-Rev22:21 | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$out/kjv.txt"
    "$dtrain" tokenize --bytes "$out/kjv.txt" "$out/train.bin" --val "$out/val.bin" --val-fraction 0.05 > /dev/null
fi
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
common=(--nproc 2 --threads 1 --data "$out/train.bin" --val-data "$out/val.bin" --eval-every "${EVAL_EVERY:-25}" --eval-batches 16 --model d6
        --vocab 256 --max-seq 64 --seq 64 --batch 16 --steps "$steps" --schedule cosine --warmup 30 --shuffle 1 --quiet)
train() { # NAME LR ARGS...
    local name=$1 lr=$2
    shift 2
    "$dtrain" train "${common[@]}" --lr "$lr" --lr-min "$(awk -v l="$lr" 'BEGIN{print l / 10}')" "$@" --metrics "$out/$name.jsonl" \
        > "$out/$name.out" 2>&1 || { echo "$name failed: $(tail -2 "$out/$name.out")"; return 1; }
}
# NAME [TARGET]: the final validation loss, the steps' wall time; with TARGET the first step at or below it and the
# wall time to it
summary() {
    python3 - "$out/$1.jsonl" "${2:-}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms, val = 0.0, []
for r in rows:
    ms += r.get("ms", 0.0) if "loss" in r else 0.0
    if "val_loss" in r: val.append((r["step"], r["val_loss"], ms))
step, v, t = val[-1]
line = "final val %.4f at step %d, %.1f s of steps" % (v, step, t / 1e3)
if sys.argv[2]:
    hit = next(((s, w) for s, x, w in val if x <= float(sys.argv[2])), None)
    line += ("; reaches %s at step %d after %.1f s" % (sys.argv[2], hit[0], hit[1] / 1e3)) if hit else "; never reaches " + sys.argv[2]
print(line)
PY
}
best=""
for lr in $lrs; do
    train "adamw_$lr" "$lr" --optimizer adamw
    s=$(summary "adamw_$lr")
    echo "adamw lr $lr: $s"
    v=$(echo "$s" | awk '{print $3}')
    if [ -z "$best" ] || awk -v a="$v" -v b="$bestv" 'BEGIN{exit !(a < b)}'; then best=$lr bestv=$v; fi
done
echo "target: AdamW's best, lr $best: val $bestv after $steps steps ($(summary "adamw_$best" | sed 's/.*, //'))"
IFS=';' read -r -a variants <<< "${SECOND_ARGS:-}"
[ ${#variants[@]} -gt 0 ] || variants=("")
for args in "${variants[@]}"; do
    read -r -a extra <<< "$args"
    tag=$(echo "$args" | tr -c 'A-Za-z0-9.\n-' '_' | sed 's/^_*//')
    for o in $opts; do
        train "${o}_$best${tag:+_$tag}" "$best" --optimizer "$o" "${extra[@]}"
        echo "$o lr $best $args: $(summary "${o}_$best${tag:+_$tag}" "$bestv")"
    done
done
