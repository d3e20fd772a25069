#!/bin/bash
# K-FAC's distribution changes nothing (KAISA's COMM-OPT, HYBRID, MEM-OPT): the layouts of one rank count give the
# same weights bit for bit after 100 steps; against one process with the global batch of 8 (2 ranks x 4, 4 ranks x 2,
# 2 micro-batches of 4), where the gradients' and the factors' sums over ranks and rows come in another order, the
# losses within 1e-5 and the weights within 1e-6 after 40 steps (after 100 the difference is said, not held: K-FAC
# multiplies a rounding difference by up to 1 / damping, as Adam by 1 / sqrt(v), and at damping 0.001 these grow to
# percents, where DDP under AdamW alone reaches 3e-4 of the weights); AdamW underneath with the inverse method and
# intervals, and under mpirun; 2 pipeline stages, DP 2 x PP 2, 2 tensor-parallel ranks, DP 2 x TP 2 and TP 2 x PP 2
# against one process likewise, and one step of GPT-2's fused q/k/v and Llama's K/V head on 2 tensor-parallel ranks and
# of an unevenly split vocabulary on 3; ZeRO-1 against DDP,
# bit for bit; a mixture's DDP 2 and EP 2 against one process (K-FAC leaves the experts as they are); MEM-OPT's factors and decompositions on the rank holding most against COMM-OPT's, and
# the planner's prediction of both; fp16 with a loss scale against f32, and its overflowing steps skipped; PowerSGD's
# averages (checks.sh's codec_precond); the refusals.
# usage: kfac_equivalence.sh DTRAIN [MPIEXEC]
set -u
DTRAIN=$1
MPIEXEC=${2:-}
. "$(dirname "$0")/checks.sh"
gpl_tokens
common=(--data "$dir/train.bin" --layers 2 --channels 64 --heads 4 --vocab 256 --max-seq 64 --seq 32 --steps 100 --threads 1
        --quiet --optimizer kfac --lr 0.05 --momentum 0.9)
# ||a - b|| / ||b|| and the largest difference of two checkpoints' weights
weights() { # NAME REF [STEP]
    python3 - "$dir/$1/step-00000${3:-100}/params.f32" "$dir/$2/step-00000${3:-100}/params.f32" <<'PY'
import array, math, sys
a, b = (array.array('f', open(p, 'rb').read()) for p in sys.argv[1:3])
print("%.3g %.3g" % (math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b))) / math.sqrt(sum(y * y for y in b)),
                     max(abs(x - y) for x, y in zip(a, b))) if len(a) == len(b) else "missing")
PY
}
# NAME ARGS: a run saved as $dir/NAME, its metrics in $dir/NAME.jsonl
run() { local name=$1; shift; run_metrics "$name" "$@" --save "$dir/$name" --save-every 40 --keep-last 3; }
# WHAT NAME REF: NAME's losses and weights against REF's
against() {
    local what=$1 name=$2 ref=$3 l w
    l=$(worst loss <(head -40 "$dir/$ref.jsonl") <(head -40 "$dir/$name.jsonl") 40)
    w=$(weights "$name" "$ref" 040)
    if [ "$l" != missing ] && [ "$w" != missing ] && awk -v l="$l" -v w="${w%% *}" 'BEGIN{exit !(l <= 1e-5 && w <= 1e-6)}'; then
        ok "$what: losses within $l over 40 steps, weights within $w (relative, largest); after 100: $(weights "$name" "$ref")"
    else fail "$what: losses $l, weights $w"; fi
}
same() { # WHAT NAME REF: bit for bit
    if cmp -s "$dir/$2/step-00000100/params.f32" "$dir/$3/step-00000100/params.f32"; then ok "$1: the same weights, bit for bit"
    else fail "$1: the weights differ ($(weights "$2" "$3"))"; fi
}

run one --batch 8 || fail "one process"
run one_accum --batch 4 --grad-accum 2 && against "1 process, 4 x 2 micro-batches" one_accum one || fail "accumulation run"
for w in 1 0.5; do
    run two_$w --nproc 2 --batch 4 --kfac-workers $w && against "2 ranks, --kfac-workers $w" two_$w one || fail "2 ranks, workers $w"
done
same "2 ranks: MEM-OPT against COMM-OPT" two_0.5 two_1
for w in 1 0.5 0.25; do
    run four_$w --nproc 4 --batch 2 --kfac-workers $w && against "4 ranks, --kfac-workers $w" four_$w one || fail "4 ranks, workers $w"
done
same "4 ranks: HYBRID against COMM-OPT" four_0.5 four_1
same "4 ranks: MEM-OPT against COMM-OPT" four_0.25 four_1
# pipeline stages: each stage's K-FAC over its own Linears, KL clipping summed over the stages (1F1B, 4 micro-batches)
run pp2 --nproc 2 --pp 2 --batch 2 --grad-accum 4 && against "2 pipeline stages" pp2 one || fail "2 pipeline stages"
run dp2pp2 --nproc 4 --pp 2 --batch 2 --grad-accum 2 && against "2 data-parallel x 2 pipeline stages, MEM-OPT" dp2pp2 one ||
    fail "DP 2 x PP 2"
# tensor parallelism: each rank's K-FAC over the whole Linears (a row-parallel one's inputs and a column-parallel one's
# output gradients gathered over its group, its gradients made whole and its slices taken back)
run tp2 --nproc 2 --tp 2 --batch 8 && against "2 tensor-parallel ranks" tp2 one || fail "TP 2"
run dp2tp2 --nproc 4 --tp 2 --sp --batch 4 --kfac-workers 0.5 &&
    against "2 data-parallel x 2 tensor-parallel ranks (sequence parallel), MEM-OPT" dp2tp2 one || fail "DP 2 x TP 2"
# and with pipeline stages: each stage's ranks make its tensors whole, the KL sum over the stages of one tensor-parallel place
run tp2pp2 --nproc 4 --tp 2 --pp 2 --batch 2 --grad-accum 4 && against "2 tensor-parallel ranks x 2 pipeline stages" tp2pp2 one ||
    fail "TP 2 x PP 2"
# One step on the step's factors alone (decay 0: a wrong factor is not hidden under the identity the averages start at,
# which outweighs the output gradients' G for many steps), 2 tensor-parallel ranks against one process: the weights'
# largest difference against the step's largest change. GPT-2's fused q, k, v (a rank's rows are three pieces of the
# whole's: put rank after rank, 2.3e-5) and Llama's K/V head both ranks keep (each rank's output gradient of it is its
# own query heads' part, summed as one process has it whole: a rank's part in place of the sum, 1.0e-4); within 5e-6
# (7e-7 and 1.2e-6 on a Zen 3).
one_step() { # WHAT TP ARGS...
    local what=$1 tp=$2 r
    shift 2
    local a=("$@" --data "$dir/train.bin" --vocab 256 --max-seq 64 --seq 32 --threads 1 --quiet --batch 8 --steps 1 --save-every 1)
    local k=(--optimizer kfac --lr 0.02 --momentum 0.9 --kfac-damping 0.03 --kfac-decay 0)
    rm -rf "$dir"/step{0,1,2}
    if "$DTRAIN" train "${a[@]}" "${k[@]}" --save "$dir/step1" > /dev/null 2>&1 &&
        "$DTRAIN" train "${a[@]}" "${k[@]}" --nproc "$tp" --tp "$tp" --save "$dir/step2" > "$dir/step2.out" 2>&1 &&
        "$DTRAIN" train "${a[@]}" --optimizer sgd --lr 1e-30 --save "$dir/step0" > /dev/null 2>&1; then
        r=$(python3 - "$dir"/step{1,2,0}/step-00000001/params.f32 <<'PY'
import array, sys
one, tp, init = (array.array('f', open(p, 'rb').read()) for p in sys.argv[1:4])
print("%.3g" % (max(abs(a - b) for a, b in zip(tp, one)) / max(abs(a - b) for a, b in zip(one, init))))
PY
)
        if awk -v r="$r" 'BEGIN{exit !(r <= 5e-6)}'; then ok "$what on $tp tensor-parallel ranks: one step within $r of one process's (of the step)"
        else fail "$what on $tp tensor-parallel ranks: one step differs by $r of the step from one process's"; fi
    else fail "$what, TP runs: $(tail -2 "$dir/step2.out")"; fi
}
one_step "GPT-2 (fused q, k, v)" 2 --layers 2 --channels 64 --heads 4
one_step "Llama, 1 K/V head" 2 --model llama-tiny --layers 2 --channels 48 --heads 4 --kv-heads 1 --ffn 96
# 3 ranks split the vocabulary of 256 unevenly (86, 86, 84 rows): the slices gathered by their own counts
one_step "GPT-2, a vocabulary split unevenly," 3 --layers 2 --channels 96 --heads 6
# ZeRO-1 allreduces the gradients as DDP does: K-FAC preconditions them whole, then each rank updates its shard
run four_zero1 --nproc 4 --batch 2 --kfac-workers 0.25 --zero 1 || fail "4 ranks, ZeRO-1"
same "4 ranks: ZeRO-1 (MEM-OPT) against DDP" four_zero1 four_0.25

# AdamW underneath, the inverse method, factors every 2 steps and decompositions every 3
adam=(--kfac-base adamw --lr 0.002 --kfac-method inverse --kfac-factor-every 2 --kfac-inv-every 3)
run adam1 --batch 8 "${adam[@]}" && run adam4 --nproc 4 --batch 2 --kfac-workers 0.5 "${adam[@]}" &&
    against "AdamW, inverse, intervals: 4 ranks HYBRID" adam4 adam1 || fail "AdamW runs"
if [ -n "$MPIEXEC" ]; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 DTRAIN_FAKE_NODES=2 \
        timeout 120 "$MPIEXEC" --oversubscribe -np 2 "$DTRAIN" train "${common[@]}" --batch 4 --kfac-workers 0.5 --metrics "$dir/mpi.jsonl" \
        --save "$dir/mpi" --save-every 40 --keep-last 3 > "$dir/mpi.out" 2>&1 && against "mpirun, 2 ranks, MEM-OPT" mpi one || fail "mpirun: $(tail -2 "$dir/mpi.out")"
fi

# a mixture: K-FAC preconditions the attention's Linears and leaves the experts as they are, so expert parallelism (a
# rank's own experts) changes nothing of it: on mixtral-tiny with every expert chosen (no routing choice a rounding can
# flip), DDP 2, EP 2 and EP 2 x TP 2 against one process with the global batch, and EP 2 on 4 ranks (each expert on 2) MEM-OPT
# against COMM-OPT bit for bit; the planner's K-FAC memory with EP, the run's
moe=(--model mixtral-tiny --experts-top-k 8 --data "$dir/train.bin" --vocab 256 --seq 32 --steps 20 --threads 1 --quiet
     --optimizer kfac --lr 0.01 --kfac-inv-every 3 --kfac-factor-every 2)
moe_run() { local name=$1; shift; "$DTRAIN" train "${moe[@]}" "$@" --metrics "$dir/$name.jsonl" --save "$dir/$name" > "$dir/$name.out" 2>&1; }
if moe_run moe1 --batch 2 --grad-accum 2 && moe_run moe_dp --nproc 2 --batch 2 && moe_run moe_ep --nproc 2 --ep 2 --batch 2 &&
    moe_run moe_eptp --nproc 4 --ep 2 --tp 2 --batch 2; then
    d=$(worst loss "$dir/moe1.jsonl" "$dir/moe_dp.jsonl" 20) e=$(worst loss "$dir/moe1.jsonl" "$dir/moe_ep.jsonl" 20)
    t=$(worst loss "$dir/moe1.jsonl" "$dir/moe_eptp.jsonl" 20)
    if [ "$d" != missing ] && [ "$e" != missing ] && [ "$t" != missing ] && awk -v d="$d" -v e="$e" -v t="$t" 'BEGIN{exit !(d <= 1e-5 && e <= 1e-5 && t <= 1e-5)}'; then
        ok "a mixture (top-8 of 8) against one process, 20 steps: DDP 2's losses within $d, EP 2's $e, EP 2 x TP 2's $t"
    else fail "a mixture under K-FAC: DDP 2 $d, EP 2 $e, EP 2 x TP 2 $t"; fi
else fail "a mixture under K-FAC: $(grep -v oversubscribed "$dir/moe_ep.out" | tail -1)"; fi
if moe_run moe_ep4 --nproc 4 --ep 2 --batch 1 && moe_run moe_ep4m --nproc 4 --ep 2 --batch 1 --kfac-workers 0.25 &&
    cmp -s "$dir/moe_ep4/step-00000020/params.f32" "$dir/moe_ep4m/step-00000020/params.f32"; then
    ok "EP 2 on 4 ranks (each expert on 2): MEM-OPT against COMM-OPT, the same weights bit for bit"
else fail "EP 2 on 4 ranks under K-FAC: $(grep -v oversubscribed "$dir/moe_ep4m.out" | tail -1)"; fi
moe_loud=()
for a in "${moe[@]}"; do [ "$a" = --quiet ] || moe_loud+=("$a"); done
er=$(logged_mib decompositions "${moe_loud[@]}" --nproc 2 --ep 2 --batch 2) ep=$(plan_precond_mib "${moe_loud[@]}" --nproc 2 --ep 2 --batch 2)
if within5 "$ep" "$er"; then ok "EP 2: the planner's K-FAC memory $ep MiB on the fullest rank, the run's $er"
else fail "EP 2 K-FAC memory: planner $ep MiB, run $er MiB"; fi

# the factors and decompositions a rank holds: MEM-OPT's most against COMM-OPT's
loud=()
for a in "${common[@]}"; do [ "$a" = --quiet ] || loud+=("$a"); done
held() { logged_mib decompositions "${loud[@]}" --nproc 4 --batch 2 --kfac-workers "$1"; }
comm=$(held 1) mem=$(held 0.25)
if [ -n "$comm" ] && [ -n "$mem" ] && awk -v a="$mem" -v b="$comm" 'BEGIN{exit !(a / b <= 0.55)}'; then
    ok "4 ranks: MEM-OPT holds $mem MiB of factors and decompositions on its fullest rank, COMM-OPT $comm ($(awk -v a="$mem" -v b="$comm" 'BEGIN{printf "%.2f", a / b}')x)"
else fail "factor memory: MEM-OPT $mem MiB, COMM-OPT $comm MiB"; fi
# the planner's prediction of them (from K-FAC's own assignment, nothing allocated) within 5% of what the runs hold
pc=$(plan_precond_mib "${loud[@]}" --nproc 4 --batch 2 --kfac-workers 1) pm=$(plan_precond_mib "${loud[@]}" --nproc 4 --batch 2 --kfac-workers 0.25)
if within5 "$pc" "$comm" "$pm" "$mem"; then
    ok "the planner: COMM-OPT $pc MiB, MEM-OPT $pm MiB on the fullest rank (the runs: $comm, $mem)"
else fail "the planner's K-FAC memory: COMM-OPT $pc MiB (run $comm), MEM-OPT $pm MiB (run $mem)"; fi

# under tensor parallelism each rank of a group holds the whole Linears' share its data-parallel place gives it
tr=$(logged_mib decompositions "${loud[@]}" --nproc 4 --tp 2 --batch 4 --kfac-workers 0.5)
tp=$(plan_precond_mib "${loud[@]}" --nproc 4 --tp 2 --batch 4 --kfac-workers 0.5)
if within5 "$tp" "$tr"; then ok "DP 2 x TP 2, MEM-OPT: the planner's $tp MiB on the fullest rank, the run's $tr"
else fail "DP 2 x TP 2 K-FAC memory: planner $tp MiB, run $tr MiB"; fi

# a resumed run keeps K-FAC and its base (the settings are saved; the state too: second_order_resume.sh)
"$DTRAIN" train "${common[@]}" --steps 4 --nproc 2 --batch 4 --kfac-base adamw --lr 0.002 --kfac-workers 0.5 --save "$dir/res" &&
out=$("$DTRAIN" train --resume "$dir/res" --steps 6 --threads 1 2>&1)
if echo "$out" | grep -q "K-FAC (COMM-OPT) preconditions .* before adamw" && ! echo "$out" | grep -q "afresh"; then
    ok "resumed on 1 process: K-FAC over AdamW again, its state loaded"
else fail "K-FAC resume: $(echo "$out" | tail -3)"; fi
refused "K-FAC under ZeRO-2" "not with K-FAC, Shampoo or SOAP yet (they precondition whole gradients" --nproc 2 --zero 2

# fp16: the output gradients K-FAC's G is made of carry the loss scale, divided out by its square (left in, a static
# scale of 1024 moves the losses 1.1% by step 10); a step whose gradients overflow is skipped on every rank and its
# factors' shares that are not finite left out (folded in, every decomposition fails from then on)
echo '{"fp16": {"enabled": true, "initial_scale_power": 24}}' > "$dir/fp16_overflow.json"
fp16_scaled K-FAC 1e-3 --nproc 2 --batch 4
run_metrics fp16_over --nproc 2 --batch 4 --steps 30 --kfac-workers 0.5 --config "$dir/fp16_overflow.json" && {
    skips=$(grep -c "OVERFLOW! Rank 0" "$dir/fp16_over.out")
    last=$(field loss "$dir/fp16_over.jsonl" | tail -1) ref=$(field loss "$dir/f32_30.jsonl" | tail -1)
    if [ "$skips" -ge 3 ] && ! grep -q decomposition "$dir/fp16_over.out" && awk -v a="$last" -v b="$ref" 'BEGIN{exit !(a < 1.05 * b)}'; then
        ok "fp16 from a loss scale of 2^24: $skips steps skipped on overflow, no decomposition failed, the last loss $last (f32's $ref)"
    else fail "K-FAC overflowing fp16: $skips skipped, last loss $last (f32's $ref): $(grep -m1 decomposition "$dir/fp16_over.out")"; fi
}
codec_precond K-FAC --nproc 2 --batch 4
refused "K-FAC with DGC" "take the optimizer's momentum" --nproc 2 --compress dgc --compress-density 0.1
refused "K-FAC over LAMB" "sgd or adamw" --kfac-base lamb
refused "--kfac-damping 0" "kfac-damping" --kfac-damping 0
refused "--kfac-inv-every 0" "kfac-inv-every" --kfac-inv-every 0
refused "--kfac-workers 0.3 on 4 ranks" "divides the ranks" --nproc 4 --kfac-workers 0.3
out=$("$DTRAIN" train --data "$dir/train.bin" --vocab 256 --layers 1 --channels 32 --heads 2 --steps 1 --kfac-damping 0.1 2>&1)
[ $? -ne 0 ] && echo "$out" | grep -q "optimizer kfac" && ok "--kfac-* without --optimizer kfac refused: $out" || fail "--kfac-* alone: $out"
echo "kfac checks: $passed passed, $failed failed"
[ "$failed" = 0 ]
