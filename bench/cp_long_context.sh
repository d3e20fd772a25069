#!/bin/bash
# Context parallelism's long context: the largest T that trains d6 (B = 1,
# its 50257-token vocabulary, AdamW, f32) on one process against CP 2 and
# CP 4 on this machine, and each rank's activation memory against T / N.
# - The bound: dtrain's memory plan (dt_plan_check_memory) refuses a job
#   whose ranks on this machine need more than it has; N ranks on one
#   machine each get (what the machine has) / N. The budget is fixed at
#   24 GiB whatever is free right now; the largest T is found by bisection
#   over multiples of 2N x 64 on the plan's figures (its refusal, forced to
#   print them with DTRAIN_MEMORY_AVAILABLE=1: nothing runs). Two bounds:
#   the N ranks on this one machine (24 GiB / N each), and N such machines
#   (24 GiB each: the plan's per-rank figure within 24 GiB), which is what
#   context parallelism is for and which this box cannot run.
# - The plan against the truth: 1-step runs at T = 1024 .. 8192 (CP 2 and 4)
#   and .. 4096 (one process), each rank's peak resident memory and its
#   activations (the run's own report: every arena the model sized) against
#   the plan's per-rank figure.
# usage: bench/cp_long_context.sh [DTRAIN (build/dtrain)] [MAX_T_RUN (8192)]
set -euo pipefail
DTRAIN=${1:-$(dirname "$0")/../build/dtrain}
MAXRUN=${2:-8192}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 400000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null 2>&1
BUDGET=$((24 * 1024 * 1024 * 1024))
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; d6, B 1, AdamW, f32; budget 24 GiB a machine"
args() { # N T
    local n=$1 T=$2
    echo --model d6 --max-seq "$T" --seq "$T" --batch 1 --steps 1 --threads 1 --data "$dir/train.bin" --quiet \
        $([ "$n" -gt 1 ] && echo --nproc "$n" --cp "$n")
}
plan() { # N T -> the plan's bytes per machine (the refusal's first figure, forced)
    local out
    out=$(DTRAIN_MEMORY_AVAILABLE=1 "$DTRAIN" train $(args "$1" "$2") 2>&1 || true)
    echo "$out" | grep -o "needs [0-9.]* [GM]B on this machine" | head -1 |
        awk '{v=$2; if ($3 == "GB") v *= 1e9; else v *= 1e6; printf "%.0f\n", v}'
}
per_rank() { # N T -> the plan's figure per rank, MiB
    echo "$(plan "$1" "$2") $1" | awk '{printf "%.0f", $1 / $2 / 1048576}'
}
largest() { # N MACHINES: the largest T (a multiple of 2N x 64) the plan fits in the budget, the N ranks on MACHINES machines
    local n=$1 per=$(($1 / $2)) step=$((2 * $1 * 64)) lo hi mid
    lo=$step hi=983040 # below --seq's limit (1e6), a multiple of 2 x 4 x 64
    while [ $((hi - lo)) -gt "$step" ]; do
        mid=$(((lo + hi) / 2 / step * step))
        local need
        need=$(plan "$n" "$mid")
        if [ -n "$need" ] && [ "$((need / n * per))" -le "$BUDGET" ]; then lo=$mid; else hi=$mid; fi
    done
    echo "$lo"
}
printf "%-12s %26s %16s %30s %16s\n" "layout" "largest T, one machine" "plan per rank" "largest T, N machines" "plan per rank"
for n in 1 2 4; do
    T1=$(largest "$n" 1) TN=$(largest "$n" "$n")
    printf "%-12s %26d %12s MiB %30d %12s MiB\n" "$([ "$n" = 1 ] && echo "one process" || echo "CP $n")" "$T1" "$(per_rank "$n" "$T1")" \
        "$TN" "$(per_rank "$n" "$TN")"
done
echo
echo "measured, 1 step: rank 0's activations (the model's arenas) and peak resident memory against the plan"
printf "%-12s %7s %7s %16s %18s %14s %12s\n" "layout" "T" "T / N" "activations MiB" "MiB a position" "peak MiB" "plan MiB"
for n in 1 2 4; do
    for T in 1024 2048 4096 8192; do
        [ "$T" -gt "$MAXRUN" ] && continue
        [ "$n" = 1 ] && [ "$T" -gt 4096 ] && continue
        "$DTRAIN" train $(args "$n" "$T" | sed 's/--quiet//') > "$dir/out" 2>&1 || { echo "run failed: $(tail -2 "$dir/out")"; continue; }
        line=$(grep "  rank 0:" "$dir/out")
        a=$(echo "$line" | sed 's/.*: [0-9.]*, [0-9.]*, [0-9.]*, [0-9.]*, \([0-9.]*\);.*/\1/')
        p=$(echo "$line" | sed 's/.*peak \([0-9.]*\).*/\1/')
        printf "%-12s %7d %7d %16s %18.3f %14s %12s\n" "$([ "$n" = 1 ] && echo "one process" || echo "CP $n")" "$T" $((T / n)) "$a" \
            "$(awk "BEGIN{print $a / ($T / $n)}")" "$p" "$(per_rank "$n" "$T")"
    done
done
