#!/bin/bash
# Gradient compression's cost in accuracy on images: the README's resnet:small recipe on Fashion-MNIST (SGD, momentum
# 0.9, lr 0.1, weight decay 5e-4, cosine with 100 warm-up steps, 64 images a rank a step) on 4 ranks of one thread, dense
# and with each codec setting given, from the same seed; the final test accuracy and each against dense in percentage
# points, with the step's median bytes on the wire and ratio. Where the baselines' virtual environment is, PyTorch DDP
# over gloo trains torchvision's same network dense and with powerSGD_hook at each PowerSGD setting
# (bench/torch_compress_resnet.py), each against its own dense (its own initialisation).
# usage: bench/compress_resnet.sh [EPOCHS (5)] [SETTINGS ("powersgd:2:10 dgc:0.001:25 topk:0.01:0"): powersgd:RANK:START,
#        topk:DENSITY:START or dgc:DENSITY:WARMUP (steps at each warm-up density)] [RANKS (4)]
set -euo pipefail
epochs=${1:-5}
settings=${2:-powersgd:2:10 dgc:0.001:25 topk:0.01:0}
ranks=${3:-4}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
recipe=(--model resnet:small --nproc "$ranks" --threads 1 --epochs "$epochs" --batch 64 --optimizer sgd --momentum 0.9 --lr 0.1
        --weight-decay 5e-4 --schedule cosine --warmup 100 --shuffle 1)
acc() { grep -o 'final test accuracy: [0-9.]*' "$1" | grep -o '[0-9.]*$'; }
wire() { python3 -c "
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if 'step' in r and 'loss' in r][5:]
print('%.0f %.2f' % (statistics.median(r.get('grad_sent_bytes', 0) for r in rows), statistics.median(r.get('compress_ratio', 1) for r in rows)))" "$1"; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; resnet:small on Fashion-MNIST, $epochs epochs, $ranks ranks"
printf "%-24s %12s %10s %14s %8s\n" setting "test acc %" "vs dense" "bytes/step" ratio
"$build/dtrain" train "${recipe[@]}" --metrics "$work/dense.jsonl" > "$work/dense.out" 2>&1
dense=$(acc "$work/dense.out")
printf "%-24s %12s %10s %14s %8s\n" dense "$dense" "" "" 1
venv=${DTRAIN_VENV:-$here/../.venv-baselines}
torch_dense=""
pt() { "$venv/bin/python" "$here/torch_compress_resnet.py" --nproc "$ranks" --epochs "$epochs" "$@" 2> /dev/null | grep -o '"test_accuracy": [0-9.]*' | cut -d' ' -f2; }
if [ -x "$venv/bin/python" ]; then
    torch_dense=$(pt)
    echo "# PyTorch DDP (gloo), torchvision's network, dense: test accuracy $(awk "BEGIN{printf \"%.2f\", 100 * $torch_dense}")%"
fi
for s in $settings; do
    IFS=: read -r codec level third <<< "$s"
    case $codec in
        topk) flags=(--compress-density "$level" --compress-start "$third") name="topk $level from $third" ;;
        dgc) flags=(--compress-density "$level" --compress-warmup "$third") name="dgc $level, warm-up $third" ;;
        *) flags=(--compress-rank "$level" --compress-start "$third") name="$codec rank $level from $third" ;;
    esac
    "$build/dtrain" train "${recipe[@]}" --compress "$codec" "${flags[@]}" --metrics "$work/$s.jsonl" > "$work/$s.out" 2>&1
    a=$(acc "$work/$s.out")
    read -r b r <<< "$(wire "$work/$s.jsonl")"
    printf "%-24s %12s %+9.2f %14s %8s\n" "$name" "$a" "$(awk "BEGIN{print $a - $dense}")" "$b" "$r"
    if [ -n "$torch_dense" ] && [ "$codec" = powersgd ]; then
        v=$(pt --powersgd "$level" --start "$third")
        echo "#   PyTorch's powerSGD_hook, rank $level from $third: test accuracy $(awk "BEGIN{printf \"%.2f%%, %+.2f\", 100 * $v, 100 * ($v - $torch_dense)}") points against its dense"
    fi
done
