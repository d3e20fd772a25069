#!/bin/bash
# Pipeline parallelism gives the losses (and gradient norms) of one process
# with the global batch over 20 AdamW steps: GPipe, 1F1B and ZB-H1 (zb1) on
# p = 2, 3 and 4 stages with m = 1, p and 2p micro-batches, identical to the
# printed digits (a pipeline adds every gradient in one process's order; only
# the tied embedding's two parts are summed in another, which m = 1 keeps
# exact); interleaved (v = 2, and 3) on p = 2, 3, 4 with m = p and 2p; DP 2 x
# PP 2 with DDP, ZeRO-1 and ZeRO-2, TP 2 x PP 2 (and sequence parallel), DP 2 x TP 2 x PP 2 (8 ranks),
# each also under zb1 and interleaved, clipping and recomputation, within 1e-6 relative; bf16 and fp16 (m = 1 to
# the digit, m = 4 within 1e-4); the 16-bit gradient store; weights files from the stages; evaluation through the stages; checkpoints
# resharded across layouts; generate through the stages; under mpirun on
# 2 pseudo-nodes with the placement printed. The bubble is in the metrics. DDP leaves the last stage's copy of the
# tied table out of its allreduces (its trace shows what it sends).
# Bad layouts are refused before any work; a killed stage is named by the
# others within a second, with the send or receive they were in.
# usage: pp_equivalence.sh DTRAIN [MPIEXEC]
set -u
DTRAIN=$1
MPIEXEC=${2:-}
. "$(dirname "$0")/checks.sh"
gpl_tokens
common=(--data "$dir/train.bin" --layers 4 --channels 48 --heads 6 --vocab 256 --max-seq 32 --seq 32 --steps 20 --lr 1e-3 --threads 1
        --quiet)
same() { # WHAT REF FILE [REF'S NAME]: every loss and norm the same digits
    if [ "$(field loss "$2" | wc -l)" = 20 ] && [ "$(field loss "$2")" = "$(field loss "$3")" ] &&
        [ "$(field grad_norm "$2")" = "$(field grad_norm "$3")" ]; then
        ok "$1: the 20 losses and gradient norms of ${4:-one process}, digit for digit (last loss $(field loss "$3" | tail -1))"
    else fail "$1: $(field loss "$3" | tail -1) vs $(field loss "$2" | tail -1)"; fi
}
close() { # WHAT REF FILE: within 1e-6 (loss) and 1e-5 (norm)
    local l n
    l=$(worst loss "$2" "$3") n=$(worst grad_norm "$2" "$3")
    if [ "$l" != missing ] && [ "$n" != missing ] && awk "BEGIN{exit !($l <= 1e-6 && $n <= 1e-5)}"; then
        ok "$1: worst relative difference over 20 steps: loss $l, gradient norm $n"
    else fail "$1: loss $l, norm $n"; fi
}

for m in 1 2 3 4 6 8; do run_metrics ref$m --batch 2 --grad-accum $m; done
for p in 2 3 4; do
    for m in 1 $p $((2 * p)); do
        for s in gpipe 1f1b zb1; do
            run_metrics pp --batch 2 --grad-accum $m --nproc $p --pp $p --pp-schedule $s &&
                if [ $m = 1 ]; then same "$s p=$p m=$m" "$dir/ref$m.jsonl" "$dir/pp.jsonl"
                else close "$s p=$p m=$m" "$dir/ref$m.jsonl" "$dir/pp.jsonl"; fi
        done
    done
done
# interleaved (Megatron's): 6 blocks (8 units) so that 4 stages hold 2 chunks each; m = p and 2p (a multiple of p)
for m in 2 3 4 6 8; do run_metrics iref$m --batch 2 --grad-accum $m --layers 6; done
for p in 2 3 4; do
    for m in $p $((2 * p)); do
        run_metrics il --batch 2 --grad-accum $m --layers 6 --nproc $p --pp $p --pp-schedule interleaved --virtual-stages 2 &&
            close "interleaved p=$p v=2 m=$m" "$dir/iref$m.jsonl" "$dir/il.jsonl"
    done
done
run_metrics il --batch 2 --grad-accum 4 --layers 6 --nproc 2 --pp 2 --pp-schedule interleaved --virtual-stages 3 &&
    close "interleaved p=2 v=3 m=4" "$dir/iref4.jsonl" "$dir/il.jsonl"
# the split and the printed lists (without --quiet)
out=$("$DTRAIN" train "${common[@]:0:${#common[@]}-1}" --steps 1 --batch 2 --grad-accum 4 --layers 6 --nproc 2 --pp 2 --pp-schedule interleaved \
      --virtual-stages 3 --pp-schedule-print 2>&1)
echo "$out" | grep -q "stage 0 \[0, 2)+\[3, 4)+\[5, 6)" && echo "$out" | grep -q "theory (p-1)/(vm+p-1) = 0.077" &&
    ok "interleaved split and lists: $(echo "$out" | grep -o 'stage 0 \[.*')" || fail "interleaved split: $(echo "$out" | grep -m1 'units by cost')"

run_metrics mb --batch 2 --micro-batches 2 --nproc 2 --pp 2 && close "--micro-batches 2 (DeepSpeed's count, --grad-accum's alias)" "$dir/ref2.jsonl" "$dir/mb.jsonl"
# the bubble: in every step's metrics, between 0 and 1, and the schedule's for the stages' measured speeds (the
# simulator's value for given speeds is test_pipeline_schedule's)
b=$(field bubble "$dir/pp.jsonl" | tail -1) bm=$(field bubble_model "$dir/pp.jsonl" | tail -1)
awk "BEGIN{exit !(\"$b\" + 0 > 0 && \"$b\" + 0 < 1 && \"$bm\" + 0 > 0 && \"$bm\" + 0 < 1)}" &&
    [ "$(field bubble "$dir/pp.jsonl" | wc -l)" = 20 ] && [ "$(field bubble_model "$dir/pp.jsonl" | wc -l)" = 20 ] &&
    ok "the bubble in each step's metrics (1f1b p=4 m=8, last step: $b; for the stages' speeds $bm)" || fail "bubble: '$b', model '$bm'"

run_metrics ref --batch 4 --grad-accum 2
for s in ddp zero1 zero2 zero3; do
    run_metrics dp2pp2 --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy $s && close "DP 2 x PP 2, $s" "$dir/ref.jsonl" "$dir/dp2pp2.jsonl"
done
# the last stage's copy of the tied table: its gradient went to the first stage, and DDP's buckets leave it out (they
# averaged a table of zeros each step before); the last stage's ranks (2, 3) allreduce the rest of what they hold (the
# final norm at this vocabulary's split) and the step's scalars
run_metrics dp2pp2 --batch 2 --grad-accum 2 --nproc 4 --pp 2 --vocab 4096 --steps 3 --trace "$dir/tied.json" --trace-steps 2:3 &&
    b=$(python3 -c 'import json, sys
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
print(sum(e["args"]["bytes"] for e in ev if e.get("name") == "allreduce" and e.get("ph") in ("B", "X") and e["pid"] in (2, 3)) // 4)' "$dir/tied.json") &&
    [ "$b" -lt $((4096 * 48 * 4)) ] && ok "DP 2 x PP 2, ddp: a last stage's rank allreduces $b bytes a step, less than the tied table's copy ($((4096 * 48 * 4)) bytes) it leaves out" ||
    fail "DP 2 x PP 2, ddp: a last stage's rank allreduces ${b:-?} bytes a step: the tied table's copy ($((4096 * 48 * 4)) bytes) with them"
# ZeRO leaves that copy out of its shards too: a last stage's rank holds no optimizer state for it (with the copy in the
# shards, half of its Adam state, 4 bytes a value, lay on each of ranks 2 and 3 and was discarded each step); ZeRO-3
# holds the copy whole (3p: with each rank's own parameters, gathered unit by unit)
for z in 1 2 3 3p; do
    [ $z = 3p ] && export DTRAIN_ZERO_PRIVATE_PARAMS=1
    run_metrics zt$z --batch 2 --grad-accum 2 --nproc 4 --pp 2 --vocab 4096 --steps 2 --zero ${z%p} --report "$dir/zt$z" &&
        o=$(python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["memory_per_rank"]
print(max(r[2]["optimizer"], r[3]["optimizer"]), min(r[0]["optimizer"], r[1]["optimizer"]))' "$dir/zt$z/run.json") &&
        [ "${o% *}" -lt $((4096 * 48 * 4)) ] && [ "${o% *}" -gt 0 ] &&
        ok "DP 2 x PP 2, ZeRO-$z: a last stage's rank holds ${o% *} bytes of optimizer state (the first stage's ${o#* }), less than the tied copy's share ($((4096 * 48 * 4)) bytes)" ||
        fail "DP 2 x PP 2, ZeRO-$z: a last stage's rank holds ${o% *} bytes of optimizer state: the tied copy's share ($((4096 * 48 * 4)) bytes) with it"
    unset DTRAIN_ZERO_PRIVATE_PARAMS
done
# ZeRO-3 with a copy of the parameters per rank (between steps each holds its shard; the tied wte is gathered to be sent)
DTRAIN_ZERO_PRIVATE_PARAMS=1 run_metrics z3p --batch 2 --grad-accum 2 --nproc 8 --pp 2 --tp 2 --strategy zero3 &&
    close "DP 2 x TP 2 x PP 2, ZeRO-3 with private parameters" "$dir/ref.jsonl" "$dir/z3p.jsonl"
run_metrics tp2pp2 --batch 4 --grad-accum 2 --nproc 4 --pp 2 --tp 2 && close "TP 2 x PP 2" "$dir/ref.jsonl" "$dir/tp2pp2.jsonl"
run_metrics dp2tp2pp2 --batch 2 --grad-accum 2 --nproc 8 --pp 2 --tp 2 --strategy zero1 &&
    close "DP 2 x TP 2 x PP 2 (8 ranks), ZeRO-1" "$dir/ref.jsonl" "$dir/dp2tp2pp2.jsonl"
# sequence parallelism inside the stages: a stage's residual stream, sent on, is its TP rank's rows
for ps in 1f1b zb1 interleaved; do
    run_metrics sppp --batch 4 --grad-accum 2 --nproc 4 --pp 2 --tp 2 --sp --pp-schedule $ps &&
        close "TP 2 x PP 2, sequence parallel, $ps" "$dir/ref.jsonl" "$dir/sppp.jsonl"
done
run_metrics sp3d --batch 2 --grad-accum 2 --nproc 8 --pp 2 --tp 2 --sp --strategy zero1 &&
    close "DP 2 x TP 2 x PP 2, sequence parallel, ZeRO-1" "$dir/ref.jsonl" "$dir/sp3d.jsonl"
# zb1 (W apart from B: the gradients announced after W) and interleaved (every chunk's gradients announced after the
# stage's last backward) on the data-parallel axis and with TP
for ps in zb1 interleaved; do
    for s in ddp zero1 zero2; do
        run_metrics psdp --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy $s --pp-schedule $ps && close "$ps, DP 2 x PP 2, $s" "$dir/ref.jsonl" "$dir/psdp.jsonl"
    done
    run_metrics pstp --batch 4 --grad-accum 2 --nproc 4 --pp 2 --tp 2 --pp-schedule $ps && close "$ps, TP 2 x PP 2" "$dir/ref.jsonl" "$dir/pstp.jsonl"
    run_metrics ps3d --batch 2 --grad-accum 2 --nproc 8 --pp 2 --tp 2 --strategy zero1 --pp-schedule $ps &&
        close "$ps, DP 2 x TP 2 x PP 2 (8 ranks), ZeRO-1" "$dir/ref.jsonl" "$dir/ps3d.jsonl"
done
# zb1 recomputing: B runs each block's forward again from its kept input, and W again (B's values were one block's)
run_metrics zbrc --batch 2 --grad-accum 4 --nproc 2 --pp 2 --pp-schedule zb1 --recompute && close "zb1 p=2 m=4, recomputing" "$dir/ref4.jsonl" "$dir/zbrc.jsonl"
run_metrics zbrc --batch 4 --grad-accum 2 --nproc 4 --pp 2 --tp 2 --sp --pp-schedule zb1 --recompute &&
    close "zb1, TP 2 x PP 2 with SP, recomputing" "$dir/ref.jsonl" "$dir/zbrc.jsonl"
run_metrics zbrc --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy zero1 --pp-schedule zb1 --recompute &&
    close "zb1, DP 2 x PP 2 with ZeRO-1, recomputing" "$dir/ref.jsonl" "$dir/zbrc.jsonl"
# under ZeRO-3 W asks for a block's weights again (gathered for its forward and B, let go since), on the one shared
# copy and with each rank's own parameters
run_metrics zbrc --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy zero3 --pp-schedule zb1 --recompute &&
    close "zb1, DP 2 x PP 2 with ZeRO-3, recomputing" "$dir/ref.jsonl" "$dir/zbrc.jsonl"
DTRAIN_ZERO_PRIVATE_PARAMS=1 run_metrics zbrc --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy zero3 --pp-schedule zb1 --recompute &&
    close "zb1, DP 2 x PP 2 with ZeRO-3 and private parameters, recomputing" "$dir/ref.jsonl" "$dir/zbrc.jsonl"
# zb1 and interleaved under ZeRO-3, the one shared copy and each rank's own parameters (gathered unit by unit; W
# reads activations and output gradients, never the weights)
for ps in zb1 interleaved; do
    run_metrics z3s --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy zero3 --pp-schedule $ps &&
        close "$ps, DP 2 x PP 2, ZeRO-3" "$dir/ref.jsonl" "$dir/z3s.jsonl"
    for n in 4 8; do
        DTRAIN_ZERO_PRIVATE_PARAMS=1 run_metrics z3s --batch 2 --grad-accum 2 --nproc $n --pp 2 --tp $((n / 4)) --strategy zero3 \
            --pp-schedule $ps && close "$ps, DP 2 x TP $((n / 4)) x PP 2, ZeRO-3 with private parameters" "$dir/ref.jsonl" "$dir/z3s.jsonl"
    done
done
run_metrics clip1 --batch 4 --grad-accum 2 --grad-clip 0.5
run_metrics clip2 --batch 4 --grad-accum 2 --grad-clip 0.5 --nproc 3 --pp 3 --recompute &&
    close "PP 3, clipped at 0.5, recomputing" "$dir/clip1.jsonl" "$dir/clip2.jsonl"

# mixed precision: one micro-batch gives one process's digits; with 4, the tied embedding's two parts, summed in
# another order in f32, round differently into bf16/fp16 weights later: within 1e-4 (loss) and 1e-3 (norm)
close_lp() { # WHAT REF FILE
    local l n
    l=$(worst loss "$2" "$3") n=$(worst grad_norm "$2" "$3")
    if [ "$l" != missing ] && [ "$n" != missing ] && awk "BEGIN{exit !($l <= 1e-4 && $n <= 1e-3)}"; then
        ok "$1: worst relative difference over 20 steps: loss $l, gradient norm $n"
    else fail "$1: loss $l, norm $n"; fi
}
for prec in bf16 fp16; do
    run_metrics lpref1 --batch 2 --precision $prec && run_metrics lppp1 --batch 2 --precision $prec --nproc 2 --pp 2 &&
        same "$prec, 1f1b p=2 m=1" "$dir/lpref1.jsonl" "$dir/lppp1.jsonl"
    run_metrics lpref4 --batch 2 --grad-accum 4 --precision $prec && run_metrics lppp4 --batch 2 --grad-accum 4 --precision $prec --nproc 3 --pp 3 &&
        close_lp "$prec, 1f1b p=3 m=4" "$dir/lpref4.jsonl" "$dir/lppp4.jsonl"
    run_metrics lpil --batch 2 --grad-accum 4 --precision $prec --nproc 2 --pp 2 --pp-schedule interleaved &&
        close_lp "$prec, interleaved p=2 v=2 m=4" "$dir/lpref4.jsonl" "$dir/lpil.jsonl"
    # zb1's W in 16 bits: the packed activations widened again, the head's loss gradient computed again
    run_metrics lpzb1 --batch 2 --precision $prec --nproc 2 --pp 2 --pp-schedule zb1 &&
        same "$prec, zb1 p=2 m=1" "$dir/lpref1.jsonl" "$dir/lpzb1.jsonl"
    run_metrics lpzb4 --batch 2 --grad-accum 4 --precision $prec --nproc 3 --pp 3 --pp-schedule zb1 &&
        close_lp "$prec, zb1 p=3 m=4" "$dir/lpref4.jsonl" "$dir/lpzb4.jsonl"
done
run_metrics lpref --batch 4 --grad-accum 2 --precision bf16 && run_metrics lpdp --batch 2 --grad-accum 2 --precision bf16 --nproc 4 --pp 2 --strategy zero1 &&
    close_lp "bf16, DP 2 x PP 2, ZeRO-1 (DP 2 alone differs from one process by ~5e-5 as well)" "$dir/lpref.jsonl" "$dir/lpdp.jsonl"
run_metrics lptp --batch 4 --grad-accum 2 --precision bf16 --nproc 4 --pp 2 --tp 2 &&
    close_lp "bf16, TP 2 x PP 2" "$dir/lpref.jsonl" "$dir/lptp.jsonl"
run_metrics lptpzb --batch 4 --grad-accum 2 --precision bf16 --nproc 4 --pp 2 --tp 2 --pp-schedule zb1 &&
    close_lp "bf16, TP 2 x PP 2 under zb1" "$dir/lpref.jsonl" "$dir/lptpzb.jsonl"
# the 16-bit gradient store (--grad-store bf16) on the DP axis of a pipeline (clipped: the norm over the stages reads
# the 16-bit store). With one micro-batch a step every gradient is summed in DP 2's order: its losses and norms to the
# digit, under every schedule that takes m = 1 and ZeRO 1 and 2. With two, the tied embedding's head part arrives
# summed over both (as in f32): an f32 sum in another order now and then rounds to another bf16 value (the widened
# sgemm path flips one wte value at step 5, 2.4e-5 on the loss and 3.5e-4 on the norm by step 20; the bf16 GEMM path
# none): within 1e-4 and 1e-3, under every schedule
gsc=(--precision bf16 --grad-clip 1.0 --batch 2)
run_metrics gs0 "${gsc[@]}" --nproc 2 --grad-store bf16
run_metrics gs02 "${gsc[@]}" --grad-accum 2 --nproc 2 --grad-store bf16
for v in gpipe 1f1b zb1 "1f1b --zero 1" "1f1b --zero 2"; do
    # shellcheck disable=SC2086
    run_metrics gs "${gsc[@]}" --nproc 4 --pp 2 --pp-schedule $v --grad-store bf16 &&
        same "--grad-store bf16, DP 2 x PP 2 $v, m = 1" "$dir/gs0.jsonl" "$dir/gs.jsonl" "DP 2"
done
for v in gpipe 1f1b zb1 interleaved "1f1b --zero 1" "1f1b --zero 2"; do
    # shellcheck disable=SC2086
    run_metrics gs "${gsc[@]}" --grad-accum 2 --nproc 4 --pp 2 --pp-schedule $v --grad-store bf16 &&
        close_lp "--grad-store bf16, DP 2 x PP 2 $v, m = 2, against DP 2" "$dir/gs02.jsonl" "$dir/gs.jsonl"
done
gsc+=(--grad-accum 2)
run_metrics gst0 "${gsc[@]}" --nproc 8 --pp 2 --tp 2 --grad-comm bf16 &&
    run_metrics gst "${gsc[@]}" --nproc 8 --pp 2 --tp 2 --grad-store bf16 &&
    same "--grad-store bf16, DP 2 x TP 2 x PP 2" "$dir/gst0.jsonl" "$dir/gst.jsonl" "its f32 store with --grad-comm bf16"
# and it holds half the gradient bytes: each stage's gradients in the run's memory report, f32 store against bf16
gsm() { "$DTRAIN" train "${common[@]:0:${#common[@]}-1}" --channels 192 --steps 2 --batch 2 --nproc 4 --pp 2 --precision bf16 "$@" 2>&1 |
    awk '/^  rank [0-3]:/ {gsub(/,/, ""); printf "%s ", $4}'; }
g32=$(gsm) g16=$(gsm --grad-store bf16)
awk -v a="$g32" -v b="$g16" 'BEGIN{n = split(a, x); split(b, y); if (n != 4) exit 1; for (i = 1; i <= 4; i++) if (y[i] > 0.55 * x[i]) exit 1}' &&
    ok "--grad-store bf16 under PP 2: gradients per rank $g16 MiB against $g32 MiB" || fail "--grad-store bf16 under PP 2: '$g16' against '$g32' MiB"

# evaluation through the stages: the validation losses of one process (steps 10 and 20)
run_metrics vref --batch 2 --grad-accum 2 --val-data "$dir/train.bin" --eval-every 10 --eval-batches 3
for how in "3 stages:--nproc 3 --pp 3" "2 interleaved stages:--nproc 2 --pp 2 --pp-schedule interleaved"; do
    run_metrics vpp --batch 2 --grad-accum 2 --val-data "$dir/train.bin" --eval-every 10 --eval-batches 3 ${how#*:}
    v1=$(field val_loss "$dir/vref.jsonl" | tr '\n' ' ') v2=$(field val_loss "$dir/vpp.jsonl" | tr '\n' ' ')
    [ -n "$v1" ] && [ "$(echo $v1 | wc -w)" = 2 ] && awk -v a="$v1" -v b="$v2" 'BEGIN{split(a,x," "); split(b,y," ");
        for(i=1;i<=2;i++){d=(x[i]-y[i])/x[i]; if(d<0)d=-d; if(!(d<=1e-6)) exit 1}}' &&
        ok "evaluation through ${how%%:*}: validation losses $v2(one process: $v1)" || fail "evaluation (${how%%:*}): '$v2' against '$v1'"
done

# checkpoints: each stage writes its units into the whole model's files, and any layout goes on from any other's:
# PP 2 -> DP 2 -> one process -> PP 4, 5 steps each (--resume keeps the saved --grad-accum unless told), give one
# process's 20 losses; a 3D layout (DP 2 x TP 2 x PP 2,
# ZeRO-1) saved at step 10 goes on as TP 2 x PP 2
ck="$dir/ck"
mkdir -p "$ck"
run_metrics c1 --batch 2 --grad-accum 2 --nproc 2 --pp 2 --steps 5 --save "$ck/a" &&
run_metrics c2 --batch 2 --grad-accum 1 --nproc 2 --steps 10 --resume "$ck/a" --save "$ck/b" &&
run_metrics c3 --batch 4 --grad-accum 1 --steps 15 --resume "$ck/b" --save "$ck/c" &&
run_metrics c4 --batch 2 --grad-accum 2 --nproc 4 --pp 4 --steps 20 --resume "$ck/c" --save "$ck/d"
cat "$dir"/c[1-4].jsonl > "$dir/chain.jsonl"
close "resharded PP 2 -> DP 2 -> 1 process -> PP 4 (global batch 4 each)" "$dir/ref2.jsonl" "$dir/chain.jsonl"
info=$("$DTRAIN" ckpt info "$ck/a" 2>&1 | head -1)
echo "$info" | grep -q "with 2 pipeline stages" && ok "ckpt info: $info" || fail "ckpt info: $info"
run_metrics z1 --batch 2 --grad-accum 2 --nproc 8 --pp 2 --tp 2 --strategy zero1 --steps 10 --save "$ck/e" &&
run_metrics z2 --batch 4 --grad-accum 2 --nproc 4 --pp 2 --tp 2 --steps 20 --resume "$ck/e"
cat "$dir/z1.jsonl" "$dir/z2.jsonl" > "$dir/chain2.jsonl"
close "DP 2 x TP 2 x PP 2 ZeRO-1 saved, TP 2 x PP 2 resumed" "$dir/ref.jsonl" "$dir/chain2.jsonl"
run_metrics z3a --batch 2 --grad-accum 2 --nproc 4 --pp 2 --strategy zero3 --steps 10 --save "$ck/g" &&
run_metrics z3b --batch 4 --grad-accum 2 --steps 20 --resume "$ck/g" --save "$ck/h"
cat "$dir/z3a.jsonl" "$dir/z3b.jsonl" > "$dir/chain3.jsonl"
close "DP 2 x PP 2 ZeRO-3 saved, one process resumed" "$dir/ref.jsonl" "$dir/chain3.jsonl"
run_metrics ila --batch 4 --grad-accum 2 --nproc 2 --pp 2 --pp-schedule interleaved --steps 10 --save "$ck/i" &&
run_metrics ilb --batch 4 --grad-accum 2 --steps 20 --resume "$ck/i"
cat "$dir/ila.jsonl" "$dir/ilb.jsonl" > "$dir/chain4.jsonl"
close "interleaved PP 2 (chunks [0, 2)+[3, 5) and [2, 3)+[5, 6)) saved, one process resumed" "$dir/ref.jsonl" "$dir/chain4.jsonl"

# weights files from a model in parts: rank 0 writes the whole model, gathered from the stages (and TP slices).
# PP 2 with one micro-batch writes one process's bytes; DP 2 x TP 2 x PP 2 (whose TP sums differ from one process's)
# the bytes that the same run's checkpoint directory exports
run_metrics w1 --batch 2 --steps 5 --save "$dir/w1.bin" &&
    run_metrics w2 --batch 2 --steps 5 --nproc 2 --pp 2 --save "$dir/w2.bin" &&
    cmp -s "$dir/w1.bin" "$dir/w2.bin" && ok "PP 2 --save FILE.bin: one process's file, byte for byte ($(stat -c %s "$dir/w2.bin") bytes)" ||
    fail "PP 2 --save FILE.bin: $(cmp "$dir/w1.bin" "$dir/w2.bin" 2>&1 | head -1)"
run_metrics w3 --batch 2 --grad-accum 2 --steps 5 --nproc 8 --pp 2 --tp 2 --save "$dir/w3" &&
    "$DTRAIN" ckpt export "$dir/w3" "$dir/w3.safetensors" > /dev/null &&
    run_metrics w4 --batch 2 --grad-accum 2 --steps 5 --nproc 8 --pp 2 --tp 2 --save "$dir/w4.safetensors" &&
    cmp -s "$dir/w3.safetensors" "$dir/w4.safetensors" &&
    ok "DP 2 x TP 2 x PP 2 --save FILE.safetensors: its checkpoint's export, byte for byte ($(stat -c %s "$dir/w4.safetensors") bytes)" ||
    fail "DP 2 x TP 2 x PP 2 --save FILE.safetensors: $(cmp "$dir/w3.safetensors" "$dir/w4.safetensors" 2>&1 | head -1)"

# generate through the stages: the text one process samples (the same logits, the same draws), token for token (PP 4's checkpoint, 2 and 3 stages); the stages run without the cache, so the one process too
g1=$("$DTRAIN" generate --model "$ck/d" --prompt "The " --tokens 40 --temperature 1 --seed 7 --no-cache 2> "$dir/gen.err")
for n in 2 3; do
    gn=$("$DTRAIN" generate --model "$ck/d" --prompt "The " --tokens 40 --temperature 1 --seed 7 --nproc $n --pp $n 2>> "$dir/gen.err")
    [ ${#g1} -ge 44 ] && [ "$gn" = "$g1" ] && ok "generate through $n stages: the text one process samples ('$(echo "$gn" | tr -d '\n' | cut -c1-30)...')" ||
        fail "generate through $n stages: '$gn' against '$g1' $(tail -2 "$dir/gen.err")"
done
if [ -n "$MPIEXEC" ]; then
    # 3D under mpirun on 2 pseudo-nodes: the TP pairs stay on a node
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 DTRAIN_FAKE_NODES=2 \
        "$MPIEXEC" --oversubscribe -np 8 "$DTRAIN" train "${common[@]:0:${#common[@]}-1}" --batch 2 --grad-accum 2 --pp 2 --tp 2 \
        --strategy ddp --metrics "$dir/mpi.jsonl" > "$dir/mpi.out" 2>&1
    close "mpirun, 2 pseudo-nodes, DP 2 x TP 2 x PP 2" "$dir/ref.jsonl" "$dir/mpi.jsonl"
    place=$(grep -o "mesh pp 2 x dp 2 x tp 2.*" "$dir/mpi.out")
    [ -n "$place" ] && ! grep -q "spans machines" "$dir/mpi.out" && ok "placement: $place" || fail "placement: '$place' $(grep spans "$dir/mpi.out")"
    # ranks started with different schedules or micro-batch counts (MPMD): refused at start-up, naming both
    mpmd() { OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 timeout 60 \
             "$MPIEXEC" --oversubscribe -np 1 "$DTRAIN" train "${common[@]}" --batch 2 --pp 2 $1 : -np 1 "$DTRAIN" train "${common[@]}" \
             --batch 2 --pp 2 $2 2>&1; }
    out=$(mpmd "--pp-schedule gpipe" "--pp-schedule 1f1b")
    echo "$out" | grep -q "rank 0 runs the gpipe pipeline schedule, rank 1 1f1b" && ! echo "$out" | grep -q '"loss"' &&
        ok "different schedules refused: $(echo "$out" | grep -m1 'ranks differ')" || fail "different schedules: $(echo "$out" | tail -2)"
    out=$(mpmd "--grad-accum 2" "--grad-accum 4")
    echo "$out" | grep -q "rank 0 has batch 2 x 32 x 2, rank 1 has 2 x 32 x 4" &&
        ok "different micro-batch counts refused: $(echo "$out" | grep -m1 'ranks differ')" || fail "different micro-batch counts: $(echo "$out" | tail -2)"
    # the memory check counts a stage's share: with one rank per (pseudo-)machine, 2 stages fit in what lies between
    # their need and 2 data-parallel ranks' (the whole model each), read from the refusals themselves (the process's
    # own memory, part of the need, differs between builds)
    big=(--data "$dir/train.bin" --layers 4 --channels 256 --heads 4 --vocab 256 --max-seq 64 --seq 64 --batch 2 --threads 1 --steps 2 --quiet)
    mem() { local avail=$1; shift; OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader ASAN_OPTIONS=detect_leaks=0 \
            DTRAIN_FAKE_NODES=2 DTRAIN_MEMORY_AVAILABLE=$avail "$MPIEXEC" --oversubscribe -np 2 "$DTRAIN" train "${big[@]}" "$@" 2>&1; }
    # (MiB with a decimal, as the runs report memory: rounded up to whole MiB for DTRAIN_MEMORY_AVAILABLE)
    whole_mib() { grep -o '[0-9.]* MiB' | head -1 | awk '{ printf "%d", $1 + 0.999 }'; }
    need_dp=$(mem 1M --pp 1 | grep -o 'ddp needs [0-9.]* MiB' | whole_mib)
    need_pp=$(mem 1M --pp 2 | grep -o 'this run needs [0-9.]* MiB' | whole_mib)
    if [ -n "$need_dp" ] && [ -n "$need_pp" ] && [ "$need_pp" -lt "$need_dp" ]; then
        mid=$(((need_dp + need_pp) / 2))
        dpout=$(mem ${mid}M --pp 1) ppout=$(mem ${mid}M --pp 2)
        echo "$dpout" | grep -q "ddp needs .* MiB on this machine" && ! echo "$ppout" | grep -q "needs .* MiB on this machine" &&
            ok "memory check per stage: 2 stages need $need_pp MiB a machine, 2 data-parallel ranks $need_dp MiB; with $mid MiB the stages run" ||
            fail "memory check with --pp at $mid MB: DP: $(echo "$dpout" | grep -m1 error | cut -c1-120); PP: $(echo "$ppout" | grep -m1 error | cut -c1-120)"
    else
        fail "memory check with --pp: the needs read were '$need_dp' (DP 2) and '$need_pp' (PP 2)"
    fi
fi

# bad layouts: refused before any work, naming the numbers
refused "--pp 7 over 6 units" "--pp 7: more stages than the model's 6 units" --nproc 7 --pp 7
# said once, by the launcher, before any rank starts (each of the 7 ranks said it before)
out=$("$DTRAIN" train "${common[@]}" --batch 2 --nproc 7 --pp 7 2>&1)
[ "$(echo "$out" | grep -c "more stages than")" = 1 ] && ! echo "$out" | grep -q "rank [0-9]\]" &&
    ok "more stages than units: said once, before any rank starts" || fail "more stages than units said: $out"
refused "--pp 3 on 4 ranks" "--tp 1 x --pp 3 = 3 does not divide the job's 4 ranks" --nproc 4 --pp 3
refused "an unknown schedule" "--pp-schedule" --nproc 2 --pp 2 --pp-schedule zigzag
refused "--virtual-stages without interleaved" "--virtual-stages 2: chunks per stage are the interleaved schedule" --nproc 2 --pp 2 --virtual-stages 2
refused "interleaved with 3 micro-batches on 2 stages" "must be a multiple of --pp" --nproc 2 --pp 2 --pp-schedule interleaved --grad-accum 3
refused "interleaved over more chunks than units" "--pp 3 x --virtual-stages 2 = 6 chunks: more than the model's 5 units" --nproc 3 --pp 3 --pp-schedule interleaved --grad-accum 3 --layers 3

# a stage killed mid-schedule: the others name it, and the send or receive they were in (or the step's collective, its
# allreduce or the bubble's allgather, if that is where the death found them, or the last one finished: under TSan, often), within a second
# (wide enough that the stages spend their time in the schedule, not in the step's small allreduces)
for ks in 1f1b zb1 interleaved; do
    killed_rank1 "$ks, a stage killed" 1.5 \
        "pipeline stage [02], \(sending\|receiving\) micro-batch\|stopping \(in\|after\) a \(send\|receive\)\|\(in\|after\) \(allreduce\|allgather\) #" \
        "${common[@]}" --channels 192 --batch 4 --grad-accum 6 --nproc 3 --pp 3 --pp-schedule $ks --steps 1000000
done
echo "pp: $passed passed, $failed failed"
[ $failed -eq 0 ]
