#!/bin/bash
# Ok-TopK's bytes against the allgather's, on real gradients: the demo's model and text (4 layers, 128 wide,
# byte-level, the King James Bible) trained with top-k at DENSITY by 2, 4 and 8 data-parallel ranks, each exchange
# forced, STEPS steps (refreshed every 32: the first, 33rd, 65th). Per rank and step (the median over the steps, and
# the mean, which carries the refresh steps' gathering of every sum): the bytes of the other ranks' pairs received, as
# words (index and value: two a pair) over k, the pairs a rank chooses. The allgather receives 2 k (P - 1) words; the
# Ok-TopK paper's bound is 6 k (P - 1) / P. The final training loss of each, beside. Bytes, not time: on one machine the
# ranks share its cores.
# usage: bench/oktopk_bytes.sh [STEPS (96)] [DENSITY (0.01)] [RANKS ("2 4 8")]
set -euo pipefail
steps=${1:-96}
density=${2:-0.01}
ranks=${3:-2 4 8}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bible -f Gen1:1-Rev22:21 | sed 's/^[A-Za-z0-9]*:[0-9]* //' > "$work/kjv.txt"
"$build/dtrain" tokenize --bytes "$work/kjv.txt" "$work/train.bin" > /dev/null
recipe=(--threads 1 --data "$work/train.bin" --layers 4 --channels 128 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 8
        --steps "$steps" --lr 4e-3 --shuffle 1 --quiet --compress topk --compress-density "$density")
summary() { python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '\"loss\"' in l]
k = float(sys.argv[2])
recv = [r.get('grad_recv_bytes', 0) for r in rows]
sent = [r.get('grad_sent_bytes', 0) for r in rows]
print('%10.2f %10.2f %12.0f %12.0f %10.4f' % (statistics.median(recv) / 4 / k, sum(recv) / len(recv) / 4 / k, statistics.median(recv),
      statistics.median(sent), rows[-1]['loss']))" "$1" "$2"; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; the demo's model, density $density, $steps steps"
echo "# k: the pairs a rank chooses a step (density x the bucket); words/k: received, median over the steps (mean beside)"
printf "%-6s %-10s %10s %10s %10s %12s %12s %10s\n" ranks exchange "words/k" "(mean)" "bound" "recv B/step" "sent B/step" loss
for p in $ranks; do
    for x in allgather oktopk; do
        "$build/dtrain" train "${recipe[@]}" --nproc "$p" --compress-exchange $x --metrics "$work/$x$p.jsonl" 2> /dev/null
        # k, the pairs a rank chooses a step: the allgather sends each once (8 bytes a pair)
        [ $x = allgather ] && k=$(python3 -c "
import json, sys
print(max(json.loads(l).get('grad_sent_bytes', 0) for l in open(sys.argv[1]) if '\"loss\"' in l) / 8)" "$work/$x$p.jsonl")
        read -r w wm rb sb loss <<< "$(summary "$work/$x$p.jsonl" "$k")"
        bound=$([ $x = oktopk ] && python3 -c "print('%.2f' % (6 * ($p - 1) / $p))" || python3 -c "print('%.2f' % (2 * ($p - 1)))")
        printf "%-6s %-10s %10s %10s %10s %12s %12s %10s\n" "$p" $x "$w" "$wm" "$bound" "$rb" "$sb" "$loss"
    done
done
