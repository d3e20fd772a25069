#!/bin/bash
# Context parallelism's long context, trained: the largest T at which d6
# (B = 1, its 50257-token vocabulary, AdamW, f32) trains 2 steps under a hard
# memory limit, on one process against CP 2 and CP 4.
# - The bound is the kernel's, not the plan's: each rank runs in a memory
#   cgroup (v1, with swap counted: memory.memsw) and a rank over it is killed
#   by the kernel's OOM killer. Two settings per layout:
#   "N machines": every rank its own cgroup of BUDGET (as if on N machines
#   of BUDGET each; what context parallelism is for), and "one machine": the
#   N ranks in one cgroup of BUDGET (BUDGET / N each, on average).
# - BUDGET is 2 GiB by default, 1/12 of this box's 24 GiB: at 24 GiB one d6
#   step at the largest T takes over an hour here (attention grows with T^2),
#   at 2 GiB minutes. The plan's bisection at 24 GiB is bench/cp_long_context.sh.
# - Search: the plan's largest T within the budget first (dtrain plan's
#   figure for the machine, to the byte), then real runs, up by
#   about 4% while they pass and down while they fail; the table gives the
#   largest T that trained and the smallest that the OOM killer stopped, both
#   run here, and the cgroup's peak (memory.max_usage_in_bytes, the largest
#   rank's; it includes the page cache, which the kernel reclaims at the limit).
# Ranks run under mpirun (one machine, shared memory between them), so that
# each can enter its cgroup before it starts. Needs root.
# usage: bench/cp_long_context_trained.sh [BUDGET_MIB (2048)] [DTRAIN (build/dtrain)]
set -euo pipefail
BUDGET=${1:-2048}
DTRAIN=$(realpath "${2:-$(dirname "$0")/../build/dtrain}")
CG=/sys/fs/cgroup/memory
[ "$(id -u)" = 0 ] && [ -w "$CG" ] || { echo "bench/cp_long_context_trained.sh: needs root and the cgroup v1 memory controller at $CG" >&2; exit 2; }
command -v mpirun > /dev/null || { echo "bench/cp_long_context_trained.sh: needs mpirun (Open MPI)" >&2; exit 2; }
dir=$(mktemp -d)
cleanup() {
    rmdir "$CG"/dtrain-cp-$$-* 2> /dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
head -c 400000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null 2>&1
budget=$((BUDGET * 1024 * 1024))
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; d6, B 1, AdamW, f32, 2 steps;" \
    "memory cgroups of $BUDGET MiB"
args() { # N T
    echo --model d6 --max-seq "$2" --seq "$2" --batch 1 --steps 2 --threads 1 --data "$dir/train.bin" --quiet \
        $([ "$1" -gt 1 ] && echo --cp "$1")
}
plan_per_rank() { # N T -> the plan's bytes a rank: the machine's figure of `dtrain plan --json` (to the byte) / N
    "$DTRAIN" plan $(args "$1" "$2") --nproc "$1" --json 2> /dev/null |
        python3 -c "import json,sys; print('%.0f' % (json.load(sys.stdin)['breakdown']['memory']['per_machine'] / $1))" 2> /dev/null || true
}
plan_largest() { # N SHARE -> the largest multiple of 2N x 64 whose plan fits a rank's SHARE of bytes
    local n=$1 share=$2 step=$((2 * $1 * 64)) lo hi mid need
    lo=$step hi=262144
    while [ $((hi - lo)) -gt "$step" ]; do
        mid=$(((lo + hi) / 2 / step * step))
        need=$(plan_per_rank "$n" "$mid")
        if [ -n "$need" ] && [ "$need" -le "$share" ]; then lo=$mid; else hi=$mid; fi
    done
    echo "$lo"
}
# run N T SEPARATE: 2 steps under the cgroups; prints "ok PEAK_MIB" or "oom PEAK_MIB" or "failed: ..."
run() {
    local n=$1 T=$2 sep=$3 g k i
    local ngroups=$([ "$sep" = 1 ] && echo "$n" || echo 1)
    # rank r enters group r (or all group 0), then becomes dtrain; the plan's refusal is lifted: the kernel decides
    for ((k = 0; k < ngroups; k++)); do
        g=$CG/dtrain-cp-$$-$k
        mkdir "$g" # new for each run: its peak and OOM count start at 0
        echo "$budget" > "$g/memory.limit_in_bytes"
        echo "$budget" > "$g/memory.memsw.limit_in_bytes" 2> /dev/null || true
    done
    local rc=0
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DTRAIN_MEMORY_AVAILABLE=1T SEP=$sep \
        timeout 3600 mpirun -np "$n" --oversubscribe --bind-to none -x DTRAIN_MEMORY_AVAILABLE -x SEP \
        sh -c 'r=${OMPI_COMM_WORLD_RANK:-0}; [ "$SEP" = 1 ] || r=0; echo $$ > '"$CG/dtrain-cp-$$"'-$r/cgroup.procs && exec "$@"' \
        sh "$DTRAIN" train $(args "$n" "$T") > "$dir/out" 2>&1 || rc=$?
    local peak=0 oom=0
    for ((k = 0; k < ngroups; k++)); do
        g=$CG/dtrain-cp-$$-$k
        peak=$(awk -v a="$peak" -v b="$(cat "$g/memory.max_usage_in_bytes")" 'BEGIN { print (b / 1048576 > a) ? int(b / 1048576) : a }')
        grep -q "^oom_kill [1-9]" "$g/memory.oom_control" 2> /dev/null && oom=1
        [ "$(cat "$g/memory.failcnt")" -gt 0 ] && [ "$rc" != 0 ] && oom=1
        for ((i = 0; i < 50; i++)); do rmdir "$g" 2> /dev/null && break; sleep 0.1; done # a rank may still be exiting
    done
    if [ "$rc" = 0 ]; then echo "ok $peak"
    elif [ "$oom" = 1 ]; then echo "oom $peak"
    else echo "failed: $(grep -v '^ *$' "$dir/out" | tail -2 | tr '\n' ' ')"; fi
}
# largest N SEPARATE: from the plan's T, real runs up while they pass and down while they fail
largest() {
    local n=$1 sep=$2 unit=$((2 * $1 * 64)) share T step r passT=0 passPeak=0 failT=0 failPeak=0 secs
    share=$([ "$sep" = 1 ] && echo "$budget" || echo $((budget / n)))
    T=$(plan_largest "$n" "$share")
    local planT=$T
    step=$(((T / 25 + unit - 1) / unit * unit)) # about 4% of T, whole chunks
    while :; do
        local t0=$SECONDS
        r=$(run "$n" "$T" "$sep")
        secs=$((SECONDS - t0))
        echo "#   T $T: $r ($secs s)" >&2
        case $r in
            ok*) passT=$T passPeak=${r#ok }; [ "$failT" != 0 ] && break; T=$((T + step)) ;;
            oom*) failT=$T failPeak=${r#oom }; [ "$passT" != 0 ] && break; T=$((T - step)); [ "$T" -le 0 ] && break ;;
            *) echo "$r" >&2; return 1 ;;
        esac
    done
    [ "$n" = 1 ] && one=$passT
    printf "%-12s %-14s %9d %11s %9s %11d %11d %13d\n" "$([ "$n" = 1 ] && echo "one process" || echo "CP $n")" \
        "$([ "$sep" = 1 ] && echo "$n x $BUDGET MiB" || echo "1 x $BUDGET MiB")" "$planT" "$([ "$passT" = 0 ] && echo none || echo "$passT")" \
        "$(awk -v a="$passT" -v b="${one:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }')" "$passPeak" "$failT" "$failPeak"
}
printf "%-12s %-14s %9s %11s %9s %11s %11s %13s\n" layout cgroups "plan's T" "trained T" "x one" "peak MiB" "OOM at T" "peak MiB"
largest 1 1
largest 2 1
largest 4 1
largest 2 0
largest 4 0
