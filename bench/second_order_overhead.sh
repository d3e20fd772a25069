#!/bin/bash
# The second-order optimizers' time a step against AdamW's, at their default intervals (the roots or
# decompositions every 10 steps: one in each run's 10 steps is counted, so the mean is the amortized cost), on d6
# (byte vocabulary) and 124M (GPT-2's), 1 process and 2 data-parallel ranks of 1 thread, batch 4 x 64 a rank.
# The first step (allocation, first touch) is left out. The demo's text as bytes (the data does not change the cost).
# Against PyTorch in the same run where the baselines' environment is there (scripts/make-baselines-venv.sh;
# bench/torch_second_order.py: the same shapes, one thread a rank, gloo): AdamW, kfac-pytorch's K-FAC and Meta's
# distributed_shampoo (SHAMPOO_SRC: a clone of github.com/facebookresearch/optimizers; without it Shampoo's is left out).
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
here=$(cd "$(dirname "$0")" && pwd)
py=$here/../.venv-baselines/bin/python
[ -x "$py" ] || echo "(no PyTorch baselines: scripts/make-baselines-venv.sh makes .venv-baselines)"
declare -A ms_of
for m in $models; do
    vocab=()
    shape=(--layers 6 --channels 384 --heads 6 --vocab 256)
    [ "$m" = d6 ] && vocab=(--vocab 256)
    [ "$m" = 124M ] && shape=(--layers 12 --channels 768 --heads 12 --vocab 50304)
    for ranks in 1 2; do
        line="$m, $ranks rank(s), ms a step:"
        base=""
        ms_of=()
        for o in $opts; do
            extra=()
            [ "$o" = kfac ] && extra=(--momentum 0.9)
            if "$dtrain" train --data "$out/train.bin" --model "$m" "${vocab[@]}" --seq 64 --max-seq 64 --batch 4 --steps 11 --nproc "$ranks" \
                --threads 1 --optimizer "$o" "${extra[@]}" --lr 1e-3 --quiet --metrics "$out/oh_$o.jsonl" > "$out/oh_$o.out" 2>&1; then
                ms=$(mean_ms "$out/oh_$o.jsonl")
                ms_of[$o]=$ms
                [ -z "$base" ] && base=$ms
                line="$line $o $ms ($(awk -v a="$ms" -v b="$base" 'BEGIN{printf "%.2f", a / b}')x)"
            else line="$line $o failed ($(tail -1 "$out/oh_$o.out"))"; fi
        done
        echo "$line"
        [ -x "$py" ] || continue
        line="  PyTorch, ms a step:"
        for o in $opts; do
            [ "$o" = soap ] || { [ "$o" = shampoo ] && [ -z "${SHAMPOO_SRC:-}" ]; } && continue
            if t=$("$py" "$here/torch_second_order.py" --optimizer "$o" --ranks "$ranks" "${shape[@]}" 2> "$out/torch_$o.err"); then
                line="$line $o $t (dtrain $(awk -v a="$t" -v b="${ms_of[$o]:-0}" 'BEGIN{if (b > 0) printf "%.2fx", a / b; else printf "-"}') faster)"
            else line="$line $o failed ($(grep -v -i warn "$out/torch_$o.err" | tail -1))"; fi
        done
        echo "$line"
    done
done
