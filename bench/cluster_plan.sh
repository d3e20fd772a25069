#!/bin/bash
# The planner across machines against a measured run: on the cluster rig
# (tests/cluster/rig.sh) at each link rate, `dtrain bench comm --calibrate`
# measures the link's alpha and beta between the 2 machines into a
# calibration file; `dtrain plan --nodes 2` prices DDP of GPT-2 MODEL (1 rank
# a machine, 1 thread) from that file; the same job then runs across the
# rig, ROUNDS times. Printed: the calibrated link, the plan's step and its
# data-parallel part, the measured step (median of the steps after 2) and
# its exposed communication, and the errors. One process alone is planned
# and run beside it, so the compute part is checked apart from the link.
# COMPRESS=powersgd:R or topk:D: the 2-machine job plans and runs with that
# codec (--compress-start 2); its plan's compression time is shown beside.
# Needs root.
# usage: bench/cluster_plan.sh [MODEL (d6)] [LINKS (10gbit:50 1gbit:100: RATE or RATE:US, US a one-way delay)] [ROUNDS (3)] [STEPS (10)]
set -euo pipefail
model=${1:-d6}
rates=${2:-10gbit:50 1gbit:100}
rounds=${3:-3}
steps=${4:-10}
here=$(cd "$(dirname "$0")" && pwd)
build=${BUILD:-$here/../build}
export RIG_DELAYLINE=${RIG_DELAYLINE:-$build/tests/delayline}
. "$here/../tests/cluster/rig.sh"
why=$(rig_unavailable)
[ -z "$why" ] || { echo "bench/cluster_plan.sh: $why" >&2; exit 2; }
work=$(mktemp -d)
trap 'rig_down > /dev/null 2>&1 || true; rm -rf "$work"' EXIT
head -c 2000000 /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/GPL-2 /usr/share/common-licenses/Apache-2.0 > "$work/text" 2> /dev/null || true
"$build/dtrain" tokenize --bytes "$work/text" "$work/train.bin" > /dev/null
args=(--model "$model" --vocab 256 --data "$work/train.bin" --batch 4 --seq 64 --threads 1)
med() { # METRICS: "median ms, median exposed ms" of the steps after 2
    python3 -c "
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print('%.1f %.1f' % (statistics.median(r['ms'] for r in rows), statistics.median(r['comm_exposed_ms'] for r in rows)))" "$1"
}
plan() { # FLAGS...: "step_ms dp_exposed_ms codec_ms link_compute_ms"
    "$build/dtrain" plan "${args[@]}" "$@" --json | python3 -c "
import json, sys
o = json.load(sys.stdin); t = o['breakdown']['time_ms']
print('%.1f %.1f %.1f %.1f' % (o['step_ms'], t['dp_exposed'], t.get('codec', 0), t.get('link_compute', 0)))"
}
comp=()
if [ -n "${COMPRESS:-}" ]; then
    IFS=: read -r codec level <<< "$COMPRESS"
    [ "$codec" = topk ] && comp=(--compress topk --compress-density "$level" --compress-start 2) ||
        comp=(--compress "$codec" --compress-rank "$level" --compress-start 2)
    echo "# the 2-machine job: ${comp[*]}"
fi
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; GPT-2 $model (vocabulary 256), batch 4 x 64" \
    "a rank, AdamW, 1 thread a rank; DDP, 1 rank on each of 2 machines; medians of steps 3-$steps over $rounds rounds"
printf "%8s %16s %13s %11s %11s %11s %13s %11s\n" link "alpha, beta" "plan ms" "measured" error "plan comm" "measured comm" error
for rate in $rates; do
    rig_up 2 "$rate"
    [ -z "${RIG_DELAY_US:-}" ] || echo "# $rate: one-way delay measured $RIG_DELAY_US us"
    cal=$work/cal.$rate
    DTRAIN_CALIBRATION=$cal rig_mpirun -np 2 --map-by node -x DTRAIN_CALIBRATION "$build/dtrain" bench comm --calibrate > "$work/cal.out" 2>&1 ||
        { echo "calibration failed: $(tail -3 "$work/cal.out")" >&2; exit 1; }
    read -r p1 _ <<< "$(DTRAIN_CALIBRATION=$cal plan)"
    read -r p2 pc pk pl <<< "$(DTRAIN_CALIBRATION=$cal plan --nproc 2 --nodes 2 ${comp[@]+"${comp[@]}"})"
    echo "# $rate: compute beside the link $(awk '$1 == "mpi_slowdown" {printf "%.0f%%", 100 * $2}' "$cal") slower (calibrated): the plan's" \
        "link_compute $pl ms a step"
    [ -z "${COMPRESS:-}" ] || echo "# the plan's compression: $pk ms a step on the rank"
    one=() two=() exp=()
    for ((r = 1; r <= rounds; r++)); do
        "$build/dtrain" train "${args[@]}" --steps "$steps" --quiet --metrics "$work/one.jsonl" > /dev/null 2>&1
        rig_mpirun -np 2 --map-by node "$build/dtrain" train "${args[@]}" ${comp[@]+"${comp[@]}"} --steps "$steps" --quiet --metrics "$work/two.jsonl" > /dev/null 2>&1
        read -r a _ <<< "$(med "$work/one.jsonl")"
        read -r b e <<< "$(med "$work/two.jsonl")"
        one+=("$a") two+=("$b") exp+=("$e")
    done
    rig_down
    python3 - "$rate" "$cal" "$p1" "$p2" "$pc" "${one[*]}" "${two[*]}" "${exp[*]}" << 'PY'
import statistics, sys
rate, cal, p1, p2, pc = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6])
one, two, exp = (statistics.median(map(float, s.split())) for s in sys.argv[6:9])
c = dict(l.split() for l in open(cal))
link = "%.0f us, %.0f MB/s" % (float(c["mpi_alpha"]) * 1e6, 1e-6 / float(c["mpi_beta"]))
print(f"{rate:>8} {link:>16} {p2:>13.1f} {two:>11.1f} {(p2 - two) / two:>+10.1%} {pc:>11.1f} {exp:>13.1f} {(pc - exp) / exp:>+10.1%}")
print(f"{'':>8} {'one process':>16} {p1:>13.1f} {one:>11.1f} {(p1 - one) / one:>+10.1%}")
PY
done
