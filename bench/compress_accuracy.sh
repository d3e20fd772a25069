#!/bin/bash
# Gradient compression's cost in accuracy: the demo's model and recipe (make demo: 4 layers, 128 wide, byte-level, the
# King James Bible, 2 data-parallel ranks, 800 AdamW steps, cosine schedule) dense and with each codec setting given,
# from the same seed; the validation loss every 200 steps and at the end, and each against dense. Where the baselines'
# virtual environment is, PyTorch DDP over gloo trains the same model from dtrain's initial weights dense and with
# torch's powerSGD_hook at each PowerSGD setting (bench/torch_compress_accuracy.py), in the same run: its gap beside.
# LR and LR_MIN (the demo's 4e-3 and 4e-4) set both frameworks' schedule: PyTorch's GPT-2 (bench/torch_gpt2.py's)
# stalls near the bytes' unigram loss (3.03 after 100 steps, dtrain 2.31) at the demo's 4e-3 and trains at 1e-3.
# usage: bench/compress_accuracy.sh [STEPS (800)] [SETTINGS ("powersgd:2:30 powersgd:4:30 topk:0.01:30"), each
#        powersgd:RANK:START, topk:DENSITY:START[:EXCHANGE] (allgather, oktopk; auto by default), onebit:-:START
#        (1-bit Adam, its variance frozen at START) or zeroone:H:START (0/1 Adam: its variance's last step START, local
#        intervals up to H steps, ZO_SCALER (100) steps at each before it doubles, ZO_KAPPA (DeepSpeed's 16) variance
#        updates at each spacing; its bytes a step the run's mean: most of its steps send nothing)]
set -euo pipefail
steps=${1:-800}
settings=${2:-powersgd:2:30 powersgd:4:30 topk:0.01:30}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bible -f Gen1:1-Rev22:21 | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$work/kjv.txt"
"$build/dtrain" tokenize --bytes "$work/kjv.txt" "$work/train.bin" --val "$work/val.bin" --val-fraction 0.05 > /dev/null
recipe=(--nproc 2 --threads 1 --data "$work/train.bin" --val-data "$work/val.bin" --eval-every 200 --eval-batches 16 --layers 4
        --channels 128 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 16 --steps "$steps" --lr "${LR:-4e-3}" --schedule cosine
        --warmup 30 --lr-min "${LR_MIN:-4e-4}" --shuffle 1 --quiet)
vals() { grep -o '"val_loss":[0-9.]*' "$1" | cut -d: -f2 | tr '\n' ' '; }
last() { grep -o '"val_loss":[0-9.]*' "$1" | tail -1 | cut -d: -f2; }
median() { python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][5:]
print('%.1f %.0f %.2f %.0f' % (statistics.median(r['ms'] for r in rows), statistics.median(r.get('grad_sent_bytes', 0) for r in rows),
      statistics.median(r.get('compress_ratio', 1) for r in rows), statistics.mean(r.get('grad_sent_bytes', 0) for r in rows)))" "$1"; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; the demo's recipe, $steps steps, 2 ranks, lr ${LR:-4e-3} to ${LR_MIN:-4e-4}"
printf "%-22s %-44s %10s %12s %14s %8s\n" setting "val loss by 200 steps" "vs dense" "ms/step" "bytes/step" ratio
"$build/dtrain" train "${recipe[@]}" --metrics "$work/dense.jsonl"
dense=$(last "$work/dense.jsonl")
read -r ms b r mb <<< "$(median "$work/dense.jsonl")"
printf "%-22s %-44s %10s %12s %14s %8s\n" dense "$(vals "$work/dense.jsonl")" "" "$ms" "" 1
venv=${DTRAIN_VENV:-$here/../.venv-baselines}
torch_dense=""
if [ -x "$venv/bin/python" ]; then
    init=(--layers 4 --channels 128 --heads 4 --vocab 256 --max-seq 64 --seq 64 --data "$work/train.bin" --steps 1 --lr 1e-30 --quiet)
    "$build/dtrain" train "${init[@]}" --save "$work/init.bin"
    pt() { "$venv/bin/python" "$here/torch_compress_accuracy.py" --weights "$work/init.bin" --train "$work/train.bin" --val "$work/val.bin" \
        --steps "$steps" --lr "${LR:-4e-3}" --lr-min "${LR_MIN:-4e-4}" "$@" 2> /dev/null | grep -o '"val_loss": [0-9.]*' | cut -d' ' -f2; }
    torch_dense=$(pt)
    echo "# PyTorch DDP (gloo) from dtrain's initial weights, dense: val loss $torch_dense"
fi
for s in $settings; do
    IFS=: read -r codec level start exch <<< "$s"
    case $codec in
        topk) flags=(--compress-density "$level" --compress-start "$start" --compress-exchange "${exch:-auto}")
              name="topk $level from $start${exch:+ $exch}" ;;
        onebit) flags=(--compress-start "$start") name="onebit from $start" ;;
        zeroone) flags=(--compress-start "$start" --compress-local-clip "$level" --compress-local-scaler "${ZO_SCALER:-100}"
                        --compress-var-scaler "${ZO_KAPPA:-16}")
                 name="zeroone H $level to $start" ;;
        *) flags=(--compress-rank "$level" --compress-start "$start") name="$codec rank $level from $start" ;;
    esac
    "$build/dtrain" train "${recipe[@]}" --compress "$codec" "${flags[@]}" --metrics "$work/$s.jsonl"
    read -r ms b r mb <<< "$(median "$work/$s.jsonl")"
    [ "$codec" = zeroone ] && b=$mb r=-
    printf "%-22s %-44s %+9.2f%% %12s %14s %8s\n" "$name" "$(vals "$work/$s.jsonl")" \
        "$(awk "BEGIN{print 100 * ($(last "$work/$s.jsonl") - $dense) / $dense}")" "$ms" "$b" "$r"
    if [ -n "$torch_dense" ] && [ "$codec" = powersgd ]; then
        v=$(pt --powersgd "$level" --start "$start")
        echo "#   PyTorch's powerSGD_hook, rank $level from $start: val loss $v, $(awk "BEGIN{printf \"%+.2f%%\", 100 * ($v - $torch_dense) / $torch_dense}") against its dense"
    fi
done
