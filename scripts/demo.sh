#!/bin/bash
# The main job (make demo): a small byte-level GPT trained on the King James
# Bible (Debian's bible-kjv) by 2 data-parallel ranks for about two minutes,
# then its validation loss, a sample, and where the metrics and the plot are.
# usage: scripts/demo.sh [BUILD_DIR] [STEPS]
set -euo pipefail
build=${1:-build}
steps=${2:-800}
out=$build/demo
mkdir -p "$out"
dtrain=$build/dtrain
if [ ! -s "$out/kjv.txt" ]; then
    # verses one per line, without their references ("Ge1:1 ")
    bible -f Gen1:1-Rev22:21 | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$out/kjv.txt.tmp"
    mv "$out/kjv.txt.tmp" "$out/kjv.txt"
fi
echo "== the King James Bible, $(wc -c < "$out/kjv.txt") bytes: the last 5% held out for validation"
"$dtrain" tokenize --bytes "$out/kjv.txt" "$out/train.bin" --val "$out/val.bin" --val-fraction 0.05
echo "== training: 2 ranks (data parallel over shared memory), 1 thread each"
"$dtrain" train --nproc 2 --threads 1 --data "$out/train.bin" --val-data "$out/val.bin" --eval-every 200 --eval-batches 16 \
    --layers 4 --channels 128 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 16 --steps "$steps" \
    --lr 4e-3 --schedule cosine --warmup 30 --lr-min 4e-4 --shuffle 1 \
    --report "$out" --save "$out/kjv.bin"
"$dtrain" plot "$out/metrics.jsonl" -o "$out/loss.svg"
echo "== a sample (temperature 0.8, top-k 40), prompted with \"And God said\":"
"$dtrain" generate --model "$out/kjv.bin" --prompt "And God said" --tokens 300 --temperature 0.8 --top-k 40
echo
echo "== validation loss (nats per byte) by step:"
grep -o '"step":[0-9]*,.*"val_loss":[0-9.]*' "$out/metrics.jsonl" | sed 's/"step":\([0-9]*\),.*"val_loss":\([0-9.]*\)/  step \1: \2/'
echo "metrics: $out/metrics.jsonl   loss plot: $out/loss.svg   model: $out/kjv.bin"
echo "report: $out/report.html (one page: curves, time per phase, memory, the 2 ranks' timeline; open it in a browser)"
