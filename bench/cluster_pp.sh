#!/bin/bash
# A pipeline across two machines of the cluster rig (tests/cluster/rig.sh): GPT-2 MODEL in 2 stages, one on each
# machine, 1 thread, 1F1B over MICRO micro-batches of 4 x 64, at each link rate given, with each --pp-wire (fp32, bf16,
# int8), rounds alternating; ms per step (median of the steps after 2 warm-up), the pipeline's bubble share (waiting
# and transfers included), and each wire's step against fp32's; and the validation loss after STEPS steps from the
# same seed (the wire is the only difference). AXIS=cp: context parallelism instead, 2 ranks of the ring (--cp 2
# --cp-impl ring, one a machine) over sequences of SEQ (256: d6's longest) with each --cp-wire, a micro-batch a step (the bubble
# column then 0). Needs root.
# usage: [AXIS=pp|cp] [SEQ=256] bench/cluster_pp.sh [MODEL (d6)] [STEPS (10)] [ROUNDS (2)] [LINKS (1gbit:100)] [MICRO (4)]
set -euo pipefail
model=${1:-d6}
steps=${2:-10}
rounds=${3:-2}
rates=${4:-1gbit:100}
micro=${5:-4}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
export RIG_DELAYLINE=${RIG_DELAYLINE:-$build/tests/delayline}
. "$here/../tests/cluster/rig.sh"
why=$(rig_unavailable)
[ -z "$why" ] || { echo "bench/cluster_pp.sh: $why" >&2; exit 2; }
work=$(mktemp -d)
head -c 2000000 /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/Apache-2.0 > "$work/text" 2> /dev/null || true
"$build/dtrain" tokenize --bytes "$work/text" "$work/train.bin" --val "$work/val.bin" --val-fraction 0.05 > /dev/null
axis=${AXIS:-pp}
args=(--model "$model" --vocab 256 --data "$work/train.bin" --val-data "$work/val.bin" --eval-every "$steps" --eval-batches 8
      --batch 4 --seq 64 --grad-accum "$micro" --pp 2 --threads 1 --steps "$steps" --quiet)
[ "$axis" = cp ] && args=(--model "$model" --vocab 256 --data "$work/train.bin" --val-data "$work/val.bin" --eval-every "$steps"
                          --eval-batches 8 --batch 4 --seq "${SEQ:-256}" --cp 2 --cp-impl ring --threads 1 --steps "$steps" --quiet)
med() { python3 -c "
import json, statistics, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if 'ms' in r][2:]
val = [r['val_loss'] for r in map(json.loads, open(sys.argv[1])) if 'val_loss' in r]
print('%.1f %.3f %.6f' % (statistics.median(r['ms'] for r in rows), statistics.median(r.get('bubble', 0) for r in rows), val[-1] if val else 0))" "$1"; }
if [ "$axis" = cp ]; then
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, CP 2 (ring) across 2 machines, batch 4 x ${SEQ:-256}, AdamW, 1 thread a rank; medians of steps 3-$steps, $rounds rounds alternating"
else
    echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, PP 2 across 2 machines, 1F1B, $micro micro-batches of 4 x 64, AdamW, 1 thread a stage; medians of steps 3-$steps, $rounds rounds alternating"
fi
printf "%10s %6s %10s %8s %10s %14s\n" link wire "ms/step" bubble "vs fp32" "val loss @$steps"
for rate in $rates; do
    rig_up 2 "$rate"
    [ -z "${RIG_DELAY_US:-}" ] || echo "# $rate: one-way delay measured $RIG_DELAY_US us"
    declare -A ms=() bub=() val=()
    for ((r = 1; r <= rounds; r++)); do
        for w in fp32 bf16 int8; do
            rig_mpirun -np 2 --map-by node "$build/dtrain" train "${args[@]}" --$axis-wire $w --metrics "$work/$w.jsonl" > "$work/$w.out" 2>&1 ||
                { tail -3 "$work/$w.out" >&2; exit 1; }
            read -r a b v <<< "$(med "$work/$w.jsonl")"
            ms[$w]="${ms[$w]:-} $a" bub[$w]="${bub[$w]:-} $b" val[$w]=$v
        done
    done
    rig_down
    for w in fp32 bf16 int8; do
        python3 - "$rate" "$w" "${ms[$w]}" "${bub[$w]}" "${val[$w]}" "${ms[fp32]}" <<'PY'
import statistics, sys
rate, w = sys.argv[1:3]
ms, bub, base = (statistics.median(map(float, s.split())) for s in (sys.argv[3], sys.argv[4], sys.argv[6]))
print(f"{rate:>10} {w:>6} {ms:>10.1f} {bub:>7.0%} {base / ms:>9.2f}x {float(sys.argv[5]):>14.6f}")
PY
    done
done
rm -rf "$work"
