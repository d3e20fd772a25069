#!/bin/bash
# The second-order optimizers' time a step against AdamW's, at their default intervals (the roots or
# decompositions every 10 steps: one in each run's 10 steps is counted, so the mean is the amortized cost), on d6
# (byte vocabulary) and 124M (GPT-2's), 1 process and 2 data-parallel ranks of 1 thread, batch 4 x 64 a rank.
# The first step (allocation, first touch) is left out. The demo's text as bytes (the data does not change the cost).
# usage: bench/second_order_overhead.sh [BUILD_DIR] [MODELS] [OPTIMIZERS]
#   defaults: build "d6 124M" "adamw shampoo soap kfac"
set -euo pipefail
build=${1:-build}
models=${2-d6 124M}
opts=${3-adamw shampoo soap kfac}
dtrain=$build/dtrain
out=$build/bench_second_order
mkdir -p "$out"
if [ ! -s "$out/train.bin" ]; then
    bible -f Gen1:1-Rev22:21 | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$out/kjv.txt"
    "$dtrain" tokenize --bytes "$out/kjv.txt" "$out/train.bin" --val "$out/val.bin" --val-fraction 0.05 > /dev/null
fi
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
mean_ms() { python3 -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])][1:]
print('%.0f' % (sum(x['ms'] for x in r) / len(r)))" "$1"; }
for m in $models; do
    vocab=()
    [ "$m" = d6 ] && vocab=(--vocab 256)
    for ranks in 1 2; do
        line="$m, $ranks rank(s), ms a step:"
        base=""
        for o in $opts; do
            extra=()
            [ "$o" = kfac ] && extra=(--momentum 0.9)
            if "$dtrain" train --data "$out/train.bin" --model "$m" "${vocab[@]}" --seq 64 --max-seq 64 --batch 4 --steps 11 --nproc "$ranks" \
                --threads 1 --optimizer "$o" "${extra[@]}" --lr 1e-3 --quiet --metrics "$out/oh_$o.jsonl" > "$out/oh_$o.out" 2>&1; then
                ms=$(mean_ms "$out/oh_$o.jsonl")
                [ -z "$base" ] && base=$ms
                line="$line $o $ms ($(awk -v a="$ms" -v b="$base" 'BEGIN{printf "%.2f", a / b}')x)"
            else line="$line $o failed ($(tail -1 "$out/oh_$o.out"))"; fi
        done
        echo "$line"
    done
done
