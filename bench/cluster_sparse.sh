#!/bin/bash
# Top-k's three exchanges across the cluster rig (tests/cluster/rig.sh): GPT-2 MODEL data-parallel over 2 machines of
# PER ranks each (1 thread a rank), dense DDP and top-k at DENSITY by the allgather, Ok-TopK and the hierarchical
# exchange, at each link rate given; ms a step (median of the steps after 2), the exposed communication, the bytes a
# rank sends and receives a step (the pairs' payload between ranks: hier's between machines only), the loss at the last
# step; ROUNDS rounds, the settings in turn. Needs root. The ranks of a machine share this box's cores: compute is
# oversubscribed where PER x 2 passes the cores, so the times say what the link costs, not the cluster's speed.
# usage: bench/cluster_sparse.sh [MODEL (d6)] [STEPS (10)] [ROUNDS (2)] [LINKS (1gbit:100 100mbit:100)] [DENSITY (0.01)] [PER (2)]
set -euo pipefail
model=${1:-d6}
steps=${2:-10}
rounds=${3:-2}
rates=${4:-1gbit:100 100mbit:100}
density=${5:-0.01}
per=${6:-2}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
export RIG_DELAYLINE=${RIG_DELAYLINE:-$build/tests/delayline}
. "$here/../tests/cluster/rig.sh"
why=$(rig_unavailable)
[ -z "$why" ] || { echo "bench/cluster_sparse.sh: $why" >&2; exit 2; }
work=$(mktemp -d)
head -c 2000000 /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/Apache-2.0 > "$work/text" 2> /dev/null || true
"$build/dtrain" tokenize --bytes "$work/text" "$work/train.bin" > /dev/null
args=(--model "$model" --vocab 256 --data "$work/train.bin" --batch 4 --seq 64 --threads 1 --steps "$steps" --quiet)
settings=("dense" "allgather" "oktopk" "hier")
med() { python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '\"loss\"' in l][2:]
m = lambda k: statistics.median(r.get(k, 0) for r in rows)
print('%.1f %.1f %.0f %.0f %.4f' % (m('ms'), m('comm_exposed_ms'), m('grad_sent_bytes'), m('grad_recv_bytes'), rows[-1]['loss']))" "$1"; }
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, 2 machines x $per ranks, batch 4 x 64 a rank, AdamW, 1 thread a rank; top-k density $density; medians of steps 3-$steps, $rounds rounds"
printf "%9s %10s %9s %9s %12s %12s %9s\n" link setting "ms/step" exposed "sent B" "recv B" loss
for rate in $rates; do
    rig_up 2 "$rate"
    declare -A ms=() ex=() sb=() rb=() lo=()
    for ((r = 1; r <= rounds; r++)); do
        for s in "${settings[@]}"; do
            comp=()
            [ "$s" = dense ] || comp=(--compress topk --compress-density "$density" --compress-exchange "$s")
            rig_mpirun -np $((2 * per)) --map-by "ppr:$per:node" "$build/dtrain" train "${args[@]}" ${comp[@]+"${comp[@]}"} \
                --metrics "$work/$s.jsonl" > "$work/$s.out" 2>&1 || { echo "# $rate $s failed: $(tail -1 "$work/$s.out")"; continue; }
            read -r a e b c l <<< "$(med "$work/$s.jsonl")"
            ms[$s]+="$a " ex[$s]+="$e " sb[$s]+="$b " rb[$s]+="$c " lo[$s]=$l
        done
    done
    rig_down
    for s in "${settings[@]}"; do
        [ -n "${ms[$s]:-}" ] || continue
        python3 -c "
import statistics, sys
f = lambda s: statistics.median(map(float, s.split()))
print('%9s %10s %9.1f %9.1f %12.0f %12.0f %9s' % (sys.argv[1], sys.argv[2], f(sys.argv[3]), f(sys.argv[4]), f(sys.argv[5]), f(sys.argv[6]), sys.argv[7]))" \
            "$rate" "$s" "${ms[$s]}" "${ex[$s]}" "${sb[$s]}" "${rb[$s]}" "${lo[$s]}"
    done
    unset ms ex sb rb lo
done
rm -rf "$work"
