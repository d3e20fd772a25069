#!/bin/bash
# The fault checks on a busy machine: each run RUNS times with BUSY busy loops beside it, the failures counted
# (a check must hold under load: what it asserts is the job's promise, not the machine's speed). The checks: a rank
# killed during TP's, PP's (1F1B) and CP's (ring) exchanges (the suite's killed_rank1), the comm layer's faults
# (tests/faults.sh: killed, stopped, mismatched, the launcher killed) and, as root, the two-machine rig's (a rank
# killed, stopped, the cable pulled: tests/cluster/cluster.sh).
# usage: [CHECKS="tp_kill pp_kill cp_kill comm_faults cluster"] bench/faults_under_load.sh [BUILD_DIR] [RUNS] [BUSY]
set -u
build=$(cd "${1:-build}" && pwd)
runs=${2:-50}
busy=${3:-2}
here=$(cd "$(dirname "$0")/.." && pwd)
DTRAIN=$build/dtrain
. "$here/tests/checks.sh"
head -c 200000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null || { echo "FAIL: tokenize"; exit 1; }
loops=()
for ((i = 0; i < busy; i++)); do (while :; do :; done) & loops+=($!); done
trap 'kill "${loops[@]}" 2> /dev/null; rm -rf "$dir"' EXIT
tp=(--data "$dir/train.bin" --layers 2 --channels 48 --heads 6 --vocab 256 --max-seq 64 --seq 64 --lr 1e-3 --threads 1 --quiet)
pp=(--data "$dir/train.bin" --layers 4 --channels 192 --heads 6 --vocab 256 --max-seq 32 --seq 32 --lr 1e-3 --threads 1 --quiet)
cp=(--data "$dir/train.bin" --layers 2 --channels 96 --heads 12 --vocab 256 --max-seq 2048 --lr 1e-3 --threads 1 --quiet)
declare -A bad
count() { # NAME COMMAND...: one run; a non-zero exit or a FAIL line counts against NAME, said with its first FAIL
    local name=$1 rc
    shift
    "$@" > "$dir/one.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ] || grep -q "^FAIL" "$dir/one.out"; then
        bad[$name]=$((${bad[$name]:-0} + 1))
        echo "FAIL $name (exit $rc): $(grep -m1 FAIL "$dir/one.out" | cut -c1-400)"
    fi
}
tp_kill() { killed_rank1 "TP" 1.5 "\(in\|after\) allreduce #" "${tp[@]}" --batch 4 --nproc 2 --tp 2 --steps 1000000; }
pp_kill() { killed_rank1 "PP" 1.5 "pipeline stage [02], \(sending\|receiving\) micro-batch\|stopping \(in\|after\) a \(send\|receive\)\|\(in\|after\) \(allreduce\|allgather\) #" \
                         "${pp[@]}" --batch 4 --grad-accum 6 --nproc 3 --pp 3 --pp-schedule 1f1b --steps 1000000; }
cp_kill() { killed_rank1 "CP" 2 . "${cp[@]}" --seq 2048 --batch 1 --nproc 2 --cp 2 --cp-impl ring --steps 1000000; }
checks=(tp_kill pp_kill cp_kill comm_faults)
comm_faults() { "$here/tests/faults.sh" "$DTRAIN" "$build/tests/test_faults"; }
cluster() { RIG_DELAYLINE=$build/tests/delayline "$here/tests/cluster/cluster.sh" "$DTRAIN" "$build/tests/test_collectives" \
    "$build/tests/test_faults"; }
[ "$(id -u)" = 0 ] && checks+=(cluster)
[ -n "${CHECKS:-}" ] && read -r -a checks <<< "$CHECKS" # CHECKS="tp_kill cluster": those alone
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; $busy busy loops beside; $runs runs of each check"
t0=$(date +%s)
for ((r = 1; r <= runs; r++)); do
    for c in "${checks[@]}"; do count "$c" "$c"; done
done
for c in "${checks[@]}"; do echo "$c: ${bad[$c]:-0} of $runs failed"; done
echo "$(( $(date +%s) - t0 )) s"
