#!/bin/bash
# Pipeline parallelism's bubble and activation memory, measured against
# theory on a model whose 2 stages are balanced (8 blocks of C 256, a
# 256-token vocabulary: stage 0 the embedding and 4 blocks, stage 1 four
# blocks and a head of ~9% of a block), 2 ranks on 2 cores, 1 thread each.
# - bubble: each step's "bubble" (the share of the schedule's span a stage
#   did not compute, the mean over stages), the median of steps 3..8,
#   against (p-1)/(m+p-1), for GPipe and 1F1B at m = 1, 2, 4, 8, and for
#   zb1 against ZB-H1's (p-1)(TF+TB-TW) / (m(TF+TB+TW) + (p-1)(TF+TB-TW))
#   (m >= p; for m = 1 the chain's 1 - (TF+TB+TW)/(p(TF+TB)+TW)) with TF,
#   TB, TW the measured forward, B and W times per micro-batch (stage 0's);
#   interleaved (2 chunks a stage) against (p-1)/(vm+p-1), m = 2, 4, 8;
# - memory: activations per stage (the run's own report: every slot's
#   arena), GPipe (m micro-batches alive) against 1F1B (at most p - s) and
#   zb1 (at most p, each with its Linears' output gradients for W) and
#   interleaved (each chunk's kept activations apart, held from its forward to
#   its backward: as many of a chunk as the schedule has in flight).
# More stages than cores cannot be measured here: an idle stage's core goes
# to another stage and the compute times stretch (p = 3, 4 are checked in
# the simulator against theory: tests/test_pipeline_schedule.c).
# model: each step's "bubble_model", the step replayed in the schedule's
# simulator with every action's measured duration and free transfers, i.e.
# theory for the stages as fast as they ran: this VM's two cores drift
# apart in speed (up to 25% within a minute, one rank pinned to each in
# turn), and a slower stage idles the other however good the schedule;
# bubble against model is what waiting and transfers added.
# Each cell is the median over ROUNDS runs (the rounds alternate over
# every schedule and m, so a slow spell of the VM falls on all of them).
# usage: bench/pp_bubble.sh [DTRAIN (build/dtrain)] [ROUNDS (1)]
set -euo pipefail
DTRAIN=${1:-$(dirname "$0")/../build/dtrain}
ROUNDS=${2:-1}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
head -c 300000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/train.bin" > /dev/null
median() { sort -n | awk '{a[NR]=$1} END{print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
field() { grep -o "\"$1\":[0-9.]*" "$2" | tail -6 | cut -d: -f2 | median; }
act() { grep "  rank $1:" "$2" | sed 's/.*: [0-9.]*, [0-9.]*, [0-9.]*, [0-9.]*, \([0-9.]*\);.*/\1/'; }
cases() { for m in 1 2 4 8; do for s in gpipe 1f1b zb1 interleaved; do [ $s = interleaved ] && [ $m = 1 ] || echo "$s $m"; done; done; }
for r in $(seq "$ROUNDS"); do
    cases | while read -r s m; do
        "$DTRAIN" train --data "$dir/train.bin" --layers 8 --channels 256 --heads 4 --vocab 256 --max-seq 128 --seq 128 --batch 4 \
            --grad-accum $m --threads 1 --nproc 2 --pp 2 --pp-schedule $s --steps 8 --metrics "$dir/m.jsonl" > "$dir/out" 2>&1
        b=$(field bubble "$dir/m.jsonl") bm=$(field bubble_model "$dir/m.jsonl") ms=$(field ms "$dir/m.jsonl")
        th=$(awk -v m=$m -v s=$s 'BEGIN{print s == "interleaved" ? 1/(2*m+1) : 1/(m+1)}')
        if [ $s = zb1 ]; then
            f=$(field forward_ms "$dir/m.jsonl") bw=$(field backward_ms "$dir/m.jsonl") w=$(field weight_grad_ms "$dir/m.jsonl")
            th=$(awk -v m=$m -v f="$f" -v bw="$bw" -v w="$w" 'BEGIN{F=f/m; W=w/m; B=bw/m-W; p=2;
                if (m == 1) print 1-(F+B+W)/(p*(F+B)+W); else print (p-1)*(F+B-W)/(m*(F+B+W)+(p-1)*(F+B-W))}')
        fi
        echo "$b $th $ms $(act 0 "$dir/out") $(act 1 "$dir/out") $bm" >> "$dir/$s.$m"
    done
done
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; 8 x C 256, T 128, micro-batch 4; median of $ROUNDS round(s)"
printf "%-11s %3s | %8s %8s %7s | %8s %7s | %9s | %14s %14s | %s\n" schedule m bubble theory "rel" model "rel" "step ms" "stage 0 acts" \
    "stage 1 acts" "each round's rel to theory"
cases | while read -r s m; do
    col() { cut -d' ' -f"$1" "$dir/$s.$m" | median; }
    b=$(col 1) th=$(col 2) bm=$(col 6)
    printf "%-11s %3d | %8.4f %8.4f %6.1f%% | %8.4f %6.1f%% | %9.1f | %10s MiB %10s MiB | %s\n" $s $m "$b" "$th" \
        "$(awk -v b="$b" -v t="$th" 'BEGIN{print 100*(b-t)/t}')" "$bm" "$(awk -v b="$b" -v t="$bm" 'BEGIN{print 100*(b-t)/t}')" \
        "$(col 3)" "$(col 4)" "$(col 5)" "$(awk '{printf "%s%.1f%%", (NR > 1 ? " " : ""), 100 * ($1 - $2) / $2}' "$dir/$s.$m")"
done
