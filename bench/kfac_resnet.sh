#!/bin/bash
# K-FAC against SGD on images, to the same test accuracy: the README's resnet:small recipe on Fashion-MNIST (momentum
# 0.9, weight decay 5e-4, cosine with 100 warm-up steps, 64 images a rank a step, 2 ranks of one thread) with SGD at
# each learning rate given, then K-FAC over the same SGD (KAISA's ResNet settings: factors every 10 steps,
# decompositions every 100, damping 0.003, KL clip 0.001), every run from the same seed and order. The test accuracy is
# taken 4 times an epoch (--eval-every); a run reaches the target at its first such point at or above it, after that
# many epochs and seconds of training (evaluations left out). K-FAC's epochs and seconds over the best SGD run's (the
# one reaching the target first in epochs), and every run's curve (epochs, seconds, accuracy) in $OUT/curves.tsv.
# KFAC_ARGS (environment): flags that replace K-FAC's settings ("--kfac-factor-every 5 --kfac-inv-every 20").
# usage: bench/kfac_resnet.sh [EPOCHS (5)] [SGD_LRS ("0.05 0.1 0.2")] [KFAC_LR (0.1)] [TARGET (0.90)]
set -euo pipefail
epochs=${1:-5}
lrs=${2:-0.05 0.1 0.2}
kfac_lr=${3:-0.1}
target=${4:-0.90}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
out=${OUT:-$(mktemp -d)}
ranks=2 batch=64
every=$((60000 / (ranks * batch) / 4))
recipe=(--model resnet:small --nproc "$ranks" --threads 1 --epochs "$epochs" --batch "$batch" --momentum 0.9 --weight-decay 5e-4
        --schedule cosine --warmup 100 --shuffle 1 --eval-every "$every" --quiet)
kfac=(--optimizer kfac --kfac-factor-every 10 --kfac-inv-every 100 --kfac-damping 0.003 --kfac-kl-clip 0.001 ${KFAC_ARGS:-})
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; resnet:small on Fashion-MNIST, $epochs epochs, $ranks ranks, target $target"
run() { # NAME FLAGS...
    local name=$1
    shift
    "$build/dtrain" train "${recipe[@]}" "$@" --metrics "$out/$name.jsonl" > "$out/$name.out" 2>&1 || { cat "$out/$name.out"; exit 1; }
}
# each run's "epochs seconds accuracy" points, in order
points() { python3 -c "
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    if 'test_accuracy' in r: print(r['epochs'], r['train_s'], r['test_accuracy'])" "$1"; }
reach() { points "$1" | awk -v t="$target" '$3 >= t { print $1, $2; found = 1; exit } END { if (!found) print "-", "-" }'; }
printf "%-16s %10s %14s %14s\n" run "final acc %" "epochs to $target" "seconds to it"
: > "$out/curves.tsv"
best="" best_ep=""
for lr in $lrs; do
    run "sgd_$lr" --optimizer sgd --lr "$lr"
    read -r ep secs <<< "$(reach "$out/sgd_$lr.jsonl")"
    final=$(points "$out/sgd_$lr.jsonl" | tail -1 | awk '{printf "%.2f", 100 * $3}')
    printf "%-16s %10s %14s %14s\n" "sgd lr $lr" "$final" "$ep" "$secs"
    points "$out/sgd_$lr.jsonl" | sed "s/^/sgd_$lr\t/" | tr ' ' '\t' >> "$out/curves.tsv"
    if [ "$ep" != "-" ] && { [ -z "$best_ep" ] || awk -v a="$ep" -v b="$best_ep" 'BEGIN { exit !(a < b) }'; }; then best=$lr best_ep=$ep best_s=$secs; fi
done
run kfac --lr "$kfac_lr" "${kfac[@]}"
read -r kep ksecs <<< "$(reach "$out/kfac.jsonl")"
final=$(points "$out/kfac.jsonl" | tail -1 | awk '{printf "%.2f", 100 * $3}')
printf "%-16s %10s %14s %14s\n" "kfac lr $kfac_lr" "$final" "$kep" "$ksecs"
points "$out/kfac.jsonl" | sed "s/^/kfac_$kfac_lr\t/" | tr ' ' '\t' >> "$out/curves.tsv"
if [ -n "$best" ] && [ "$kep" != "-" ]; then
    awk -v a="$kep" -v b="$best_ep" -v s="$ksecs" -v t="$best_s" -v lr="$best" \
        'BEGIN { printf "K-FAC over the best SGD (lr %s): %.2fx the epochs (goal at most 0.6), %.2fx the seconds (goal at most 0.85)\n", lr, a / b, s / t }'
else
    echo "K-FAC or every SGD run did not reach $target: no ratio"
fi
echo "# curves: $out/curves.tsv (run, epochs, seconds trained, test accuracy)"
