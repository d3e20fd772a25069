#!/bin/bash
# DDP across two machines of the cluster rig (tests/cluster/rig.sh) at each
# link rate given: GPT-2 MODEL, 1 rank per machine, 1 thread, against one
# process alone on the box, alternating; ms per step (median of the steps
# after 2 warm-up), the exposed communication per step, and the scaling
# (2 x one process's time / the 2-machine step's time); PyTorch DDP over
# gloo across the same machines from the same weights where the baselines'
# virtual environment is (dtrain/PT: PyTorch's step time over dtrain's).
# COMPRESS=powersgd:R adds 2-machine runs with PowerSGD at rank R (from step
# 2) and gives PyTorch DDP its powerSGD_hook at the same rank and start;
# COMPRESS=topk:D the same with top-k at density D, dgc:D with DGC (its run
# with SGD and momentum 0.9: DGC corrects SGD's momentum), onebit:N with 1-bit
# Adam frozen after N steps (give N below the 2 warm-up steps to time its
# compressed steps), zeroone:H with 0/1 Adam's local steps from step 2, its
# interval H steps from step 4 on (its figures the means of steps 3-STEPS,
# syncs and local steps together, not medians); PyTorch has no such hooks:
# its DDP stays dense there.
# Needs root.
# usage: bench/cluster_ddp.sh [MODEL (d6)] [STEPS (10)] [ROUNDS (3)] [LINKS (10gbit:50 1gbit:100)]
# (a link is RATE or RATE:US, US its one-way delay in microseconds)
set -euo pipefail
model=${1:-d6}
steps=${2:-10}
rounds=${3:-3}
rates=${4:-10gbit:50 1gbit:100}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
export RIG_DELAYLINE=${RIG_DELAYLINE:-$build/tests/delayline}
. "$here/../tests/cluster/rig.sh"
why=$(rig_unavailable)
[ -z "$why" ] || { echo "bench/cluster_ddp.sh: $why" >&2; exit 2; }
work=$(mktemp -d)
head -c 2000000 /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/Apache-2.0 > "$work/text" 2> /dev/null || true
"$build/dtrain" tokenize --bytes "$work/text" "$work/train.bin" > /dev/null
args=(--model "$model" --vocab 256 --data "$work/train.bin" --batch 4 --seq 64 --threads 1 --steps "$steps" --quiet)
med() { python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
f = statistics.mean if sys.argv[2:] == ['mean'] else statistics.median
print('%.1f %.1f' % (f(r['ms'] for r in rows), f(r['comm_exposed_ms'] for r in rows)))" "$@"; }
venv=${DTRAIN_VENV:-$here/../.venv-baselines}
torch=""
if [ -x "$venv/bin/python" ]; then # PyTorch DDP over gloo across the same machines, from the same weights
    torch=$venv/bin/python
    "$build/dtrain" train --model "$model" --vocab 256 --data "$work/train.bin" --steps 1 --lr 1e-30 --save "$work/w.bin" --quiet
else
    echo "# (no PyTorch baseline: scripts/make-baselines-venv.sh makes it)"
fi
comp=() hook=()
if [ -n "${COMPRESS:-}" ]; then
    IFS=: read -r codec crank <<< "$COMPRESS"
    case $codec in
        topk) comp=(--compress topk --compress-density "$crank" --compress-start 2) ;;
        dgc) comp=(--compress dgc --compress-density "$crank" --optimizer sgd --momentum 0.9) ;;
        # a timing run: frozen after 1 or 2 steps at d6's default lr its variance overflows the update by step 8 (NaN);
        # what a step does does not depend on the lr
        onebit) comp=(--compress onebit --compress-start "$crank" --lr 1e-6) ;;
        zeroone) comp=(--compress zeroone --compress-start 1 --compress-var-scaler 1 --compress-local-scaler 1 --compress-local-clip "$crank"
                       --lr 1e-6) ;;
        *) comp=(--compress "$codec" --compress-rank "$crank" --compress-start 2) hook=(--powersgd "$crank") ;;
    esac
fi
torch_step() { # the median ms/step of PyTorch DDP, 1 rank on each machine
    rig_exec 1 env GLOO_SOCKET_IFNAME=eth0 "$torch" "$here/torch_ddp.py" --weights "$work/w.bin" --nproc 2 --rank 0 \
        --master "$RIG_NET.1:29533" --steps "$steps" --warmup 2 ${hook[@]+"${hook[@]}"} > "$work/torch.jsonl" 2> /dev/null &
    rig_exec 2 env GLOO_SOCKET_IFNAME=eth0 "$torch" "$here/torch_ddp.py" --weights "$work/w.bin" --nproc 2 --rank 1 \
        --master "$RIG_NET.1:29533" --steps "$steps" --warmup 2 ${hook[@]+"${hook[@]}"} > /dev/null 2>&1
    wait
    python3 -c "
import json, statistics, sys
print('%.1f' % statistics.median(json.loads(l)['ms'] for l in open(sys.argv[1])))" "$work/torch.jsonl"
}
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model, batch 4 x 64 per rank, AdamW, 1 thread per rank; medians of steps 3-$steps, $rounds rounds alternating"
[ -z "${COMPRESS:-}" ] || echo "# compressed: ${comp[*]} (PyTorch: $([ ${#hook[@]} -gt 0 ] && echo "powerSGD_hook, rank $crank, start 2" || echo dense)); dtrain/PT: PT over the compressed run"
printf "%8s %12s %14s %18s %9s %16s %10s%s\n" link "1 proc ms" "2 machines ms" "exposed comm ms" scaling "PyTorch DDP ms" "dtrain/PT" \
    "${COMPRESS:+    compressed ms   exposed    scaling}"
for rate in $rates; do
    rig_up 2 "$rate"
    [ -z "${RIG_DELAY_US:-}" ] || echo "# $rate: one-way delay measured $RIG_DELAY_US us (bare link: $RIG_RTT_BARE_US us a round trip)"
    one=() two=() exp=() pt=() ctwo=() cexp=()
    for ((r = 1; r <= rounds; r++)); do
        "$build/dtrain" train "${args[@]}" --metrics "$work/one.jsonl" > /dev/null 2>&1
        rig_mpirun -np 2 --map-by node "$build/dtrain" train "${args[@]}" --metrics "$work/two.jsonl" > /dev/null 2>&1
        read -r a _ <<< "$(med "$work/one.jsonl")"
        read -r b e <<< "$(med "$work/two.jsonl")"
        one+=("$a") two+=("$b") exp+=("$e")
        if [ -n "${COMPRESS:-}" ]; then
            rig_mpirun -np 2 --map-by node "$build/dtrain" train "${args[@]}" "${comp[@]}" --metrics "$work/comp.jsonl" > /dev/null 2>&1
            read -r b e <<< "$(med "$work/comp.jsonl" $([ "$codec" = zeroone ] && echo mean))"
            ctwo+=("$b") cexp+=("$e")
        fi
        [ -n "$torch" ] && pt+=("$(torch_step)")
    done
    rig_down
    python3 - "$rate" "${one[*]}" "${two[*]}" "${exp[*]}" "${pt[*]:-0}" "${ctwo[*]:-0}" "${cexp[*]:-0}" <<'PY'
import statistics, sys
one, two, exp, pt, ctwo, cexp = (statistics.median(map(float, s.split())) for s in sys.argv[2:8])
mine = ctwo if ctwo else two  # PyTorch ran with the hook where dtrain compressed
line = (f"{sys.argv[1]:>8} {one:>12.1f} {two:>14.1f} {exp:>11.1f} ({exp / two:.0%}) {2 * one / two:>8.2f}x {pt:>16.1f} "
        f"{(pt / mine if pt else 0):>9.2f}x")
if ctwo:
    line += f" {ctwo:>16.1f} {cexp:>6.1f} ({cexp / ctwo:.0%}) {2 * one / ctwo:>7.2f}x  (dense / compressed {two / ctwo:.2f}x)"
print(line)
PY
done
rm -rf "$work"
