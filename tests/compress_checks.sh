#!/bin/bash
# Gradient compression in training (--compress): before its start step PowerSGD's runs are dense DDP's bit for bit; top-k
# at density 1 is dense DDP's average, DGC's at density 1 momentum-free SGD's, 1-bit Adam's warm-up dense AdamW's (the embedding's rows summed in another order: held close, not equal)
# (GPT-2 with its tied embedding, whose rows DDP defers, and Llama); from it on the update inside backward and the one
# after it give the same weights; ZeRO 1, 2 and 3 with a codec give DDP's weights; compressed runs train and report
# their bytes and ratio; the planner's communication buffers (a codec's state and buffers) are the run's; a checkpoint resumes with the codec's state bit for bit (under ZeRO-3 saved, under DDP resumed); bad settings are refused naming why; a rank killed mid-exchange ends the job naming it.
# Under mpirun on 2 pseudo-nodes of 2 ranks, top-k's hierarchical exchange (dense inside a machine, sparse between) at
# density 1 is dense DDP's run (within 1e-6), and at 0.01 trains sending half the allgather's bytes between machines.
# usage: compress_checks.sh DTRAIN [MPIEXEC]
set -u
DTRAIN=$1
MPIEXEC=${2:-}
. "$(dirname "$0")/finetune_checks.sh"
gpl_tokens
common=(--data "$dir/train.bin" --vocab 256 --layers 2 --channels 64 --heads 4 --max-seq 32 --seq 32 --batch 4 --steps 20
        --lr 3e-3 --threads 1 --nproc 2)
identical() { # WHAT A B [EXT]: the same losses as printed, and the same weights file byte for byte
    local a=$2 b=$3 ext=${4:-bin}
    [ "$(field loss "$dir/$a.jsonl" | wc -l)" = 20 ] && [ "$(field loss "$dir/$a.jsonl")" = "$(field loss "$dir/$b.jsonl")" ] &&
        cmp -s "$dir/$a.$ext" "$dir/$b.$ext" && ok=1 || ok=0
    verdict $ok "$1: the losses and the weights file identical ($(field loss "$dir/$a.jsonl" | tail -1) / $(field loss "$dir/$b.jsonl" | tail -1))"
}
run dense --save "$dir/dense.bin"
run late --compress powersgd --compress-start 20 --save "$dir/late.bin" && identical "GPT-2, PowerSGD before its start step = dense DDP" dense late
run ldense --model llama-tiny --save "$dir/ldense.safetensors"
run llate --model llama-tiny --compress powersgd --compress-rank 2 --compress-start 20 --save "$dir/llate.safetensors" &&
    identical "Llama, PowerSGD before its start step = dense DDP" ldense llate safetensors
run psgd --compress powersgd --compress-rank 2 --compress-start 5 --save "$dir/psgd.bin"
run psgd_end --compress powersgd --compress-rank 2 --compress-start 5 --step-at-end --save "$dir/psgd_end.bin" &&
    identical "PowerSGD: the update inside backward = the update after it" psgd psgd_end
DTRAIN_DDP_WAIT_IN_BACKWARD=1 run psgd_wait --compress powersgd --compress-rank 2 --compress-start 5 --save "$dir/psgd_wait.bin" &&
    identical "PowerSGD: every bucket updated inside backward = as timing had it" psgd psgd_wait
# top-k at density 1 sends every entry: the average of dense DDP, but for the embedding, whose rows DDP defers (sums
# them into the average after it) and a codec sees whole: the same values summed in another order. Measured here: Llama
# 2.5e-7, GPT-2 0 (its tied table, the head's part too: 6.8e-6 on another text), over 20 AdamW steps.
held() { # WHAT REF FILE BOUND
    local w
    w=$(worst "$dir/$2.jsonl" "$dir/$3.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= $4)}" && ok=1 || ok=0
    verdict $ok "$1: worst relative loss difference over 20 steps $w (held to $4)"
}
run ldense_only --model llama-tiny
run ltop1 --model llama-tiny --compress topk --compress-density 1 && held "Llama, top-k at density 1 against dense DDP" ldense_only ltop1 1e-6
run top1 --compress topk --compress-density 1 && held "GPT-2, top-k at density 1 against dense DDP" dense top1 2e-5
run top01 --compress topk --compress-density 0.01
first=$(field loss "$dir/top01.jsonl" | head -1) last=$(field loss "$dir/top01.jsonl" | tail -1) r=$(field compress_ratio "$dir/top01.jsonl" | tail -1)
awk "BEGIN{exit !($last < $first - 1 && $r > 40)}" && ok=1 || ok=0
verdict $ok "top-k at density 0.01 trains (loss $first -> $last), ratio $r (entries held / (index, value) words sent)"
# the planner's bytes for a codec are the run's: PowerSGD's from the same rule over the same table, exactly; top-k's a
# share of each tensor where the run takes it of each bucket (within 1%)
plan_bytes() { "$DTRAIN" plan "${common[@]}" "$@" --json 2> /dev/null | python3 -c "import json, sys; print('%.0f' % json.load(sys.stdin)['breakdown']['grad_sent_bytes'])"; }
pb=$(plan_bytes --compress powersgd --compress-rank 2) tb=$(plan_bytes --compress topk --compress-density 0.01)
rb=$(field grad_sent_bytes "$dir/psgd.jsonl" | tail -1) rt=$(field grad_sent_bytes "$dir/top01.jsonl" | tail -1)
awk "BEGIN{d = ($tb - $rt) / $rt; exit !($pb == $rb && d < 0.01 && d > -0.01)}" && ok=1 || ok=0
verdict $ok "plan's bytes a step: PowerSGD rank 2 $pb (the run's $rb), top-k 0.01 $tb (the run's $rt)"
# the planner's communication buffers are the run's (its memory table's, 2 ranks): each codec's state and its buckets'
# buffers by the codec's own count (dt_codec_work_bytes_for, the model as one bucket), no token-table rows deferred
# where the codec runs from the first step. Top-k, DGC with its warm-up densities, 1-bit Adam and PowerSGD to the byte
# (PowerSGD's had counted a velocity's and a server's blocks it never keeps: 3.1% over the plan)
buffers() { # ARGS: the plan's buffers and a 3-step run's (its fullest rank)
    rm -rf "$dir/mem"
    "$DTRAIN" train "${common[@]}" "$@" --steps 3 --quiet --report "$dir/mem" > /dev/null 2>&1
    echo "$("$DTRAIN" plan "${common[@]}" "$@" --json 2> /dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['buffers'])") $(python3 -c "
import json, sys; r = json.load(open(sys.argv[1])); print(max(x['buffers'] for x in r.get('memory_per_rank') or [r['memory_bytes']]))" "$dir/mem/run.json" 2> /dev/null)"
}
sgd=(--optimizer sgd --momentum 0.9 --lr 0.05)
for c in "topk --compress-density 0.01:0" "dgc --compress-density 0.01 --compress-warmup 2 ${sgd[*]}:0" "onebit --compress-start 2:0" \
         "powersgd --compress-rank 2:0"; do
    read -r pm rm <<< "$(buffers --compress ${c%%:*})"
    tol=${c##*:}
    awk -v p="${pm:-0}" -v r="${rm:-0}" -v t="$tol" 'BEGIN{d = (p - r) / (r > 0 ? r : 1); if (d < 0) d = -d; exit !(r > 0 && d <= t)}' && ok=1 || ok=0
    verdict $ok "plan's communication buffers with --compress ${c%% *}: $pm bytes, the run's $rm"
done
# on 4 ranks auto sends the buckets' pairs by Ok-TopK (a rank's room: its own pairs, not every rank's as the allgather):
# the planner makes the run's buckets and takes auto's pick for each (it gave every bucket the allgather's room: +6.7%)
# (DGC's: +29.5%); at 128 channels the candidates' room grew past the planner's (+13.4%) before it was bounded
for c in "topk --compress-density 0.01 --channels 256" "topk --compress-density 0.01 --channels 128" \
         "dgc --compress-density 0.01 --compress-warmup 2 ${sgd[*]} --channels 128"; do
    read -r pm rm <<< "$(buffers --compress $c --nproc 4)"
    [ "${rm:-0}" -gt 0 ] && [ "$pm" = "$rm" ] && ok=1 || ok=0
    verdict $ok "plan's communication buffers with --compress ${c%% *} on 4 ranks (auto's exchange per bucket): $pm bytes, the run's $rm"
done
# plan --search weighs the command's codec (and none) where it applies: across 2 machines over a 100 Mbit/s link (a
# calibration of 200 us and 80 ns a byte) PowerSGD's layouts come first; without --compress no layout has a codec
printf 'mpi_alpha 0.0002\nmpi_beta 8e-08\n' > "$dir/cal"
search() { DTRAIN_CALIBRATION="$dir/cal" "$DTRAIN" plan --vocab 256 --model d6 --seq 64 --batch 4 --nproc 2 --nodes 2 --threads 1 --search "$@" 2> /dev/null; }
top=$(search --compress powersgd --compress-rank 4 | sed -n 3p) plain=$(search | grep -c -- "--compress")
echo "$top" | grep -q -- "dp 2 x tp 1 .*--compress powersgd --compress-rank 4" && [ "$plain" = 0 ] && ok=1 || ok=0
verdict $ok "plan --search over 100 Mbit/s with --compress powersgd: first $(echo "$top" | sed 's/  */ /g' | cut -c1-150); without it $plain codec rows"
# ZeRO averages as DDP does (its buckets are DDP's; stages 2 and 3 keep their shard of each decoded bucket, their pages
# lent by the pool) and updates its shard: the same weights; saved and resumed too, and across stages
for z in 1 2 3; do
    run z$z --compress powersgd --compress-rank 2 --compress-start 5 --zero $z --save "$dir/z$z.bin" &&
        identical "ZeRO-$z with PowerSGD = DDP with PowerSGD" psgd z$z
done
# in buckets of 10 KB the pool lends many buckets' pages two at a time: each bucket decoded before its pages go on, the
# tied table's (whose head part backward writes first) never lent
run z2small --compress powersgd --compress-rank 2 --compress-start 5 --zero 2 --bucket-mb 0.01 --save "$dir/z2small.bin" &&
    identical "ZeRO-2 with PowerSGD in 10 KB buckets = DDP with PowerSGD" psgd z2small
run z1w --compress powersgd --compress-rank 2 --compress-start 5 --zero 1 --save "$dir/ckz" &&
    run z1p --compress powersgd --compress-rank 2 --compress-start 5 --zero 1 --save "$dir/ckz10" --stop-after 10 &&
    "$DTRAIN" train --resume "$dir/ckz10" --nproc 2 --quiet > "$dir/zres.out" 2>&1 &&
    cmp -s "$dir/ckz/step-00000020/params.f32" "$dir/ckz10/step-00000020/params.f32" &&
    cmp -s "$dir/ckz/step-00000020/optim.f32" "$dir/ckz10/step-00000020/optim.f32" && ok=1 || ok=0
verdict $ok "ZeRO-1 with PowerSGD saved at step 10 and resumed: the uninterrupted run's weights and optimizer state bit for bit"
# it trains, and says what it sent: a step's bytes and ratio, dense before the start
first=$(field loss "$dir/psgd.jsonl" | head -1) last=$(field loss "$dir/psgd.jsonl" | tail -1)
b5=$(field grad_sent_bytes "$dir/psgd.jsonl" | sed -n 5p) b6=$(field grad_sent_bytes "$dir/psgd.jsonl" | sed -n 6p)
r5=$(field compress_ratio "$dir/psgd.jsonl" | sed -n 5p) r6=$(field compress_ratio "$dir/psgd.jsonl" | sed -n 6p)
awk "BEGIN{exit !($last < $first - 1 && $r5 == 1 && $r6 > 2 && $b6 < $b5 / 2)}" && ok=1 || ok=0
verdict $ok "PowerSGD rank 2 trains (loss $first -> $last) and reports its wire: step 5 $b5 bytes (ratio $r5), step 6 $b6 (ratio $r6)"
# a checkpoint keeps every rank's residuals and the Qs (codec.f32): stopped at step 10 (compressing since step 5) or at
# step 3 (before the start: no codec state yet) and resumed, the run ends with the uninterrupted one's weights
psgd=(--compress powersgd --compress-rank 2 --compress-start 5)
run whole "${psgd[@]}" --save "$dir/ckw" && for at in 10 3; do
    run part$at "${psgd[@]}" --save "$dir/ck$at" --stop-after $at && cp -r "$dir/ck$at" "$dir/saved$at" &&
        "$DTRAIN" train --resume "$dir/ck$at" --nproc 2 --quiet --metrics "$dir/resumed$at.jsonl" > "$dir/resumed$at.out" 2>&1
    has=$([ -f "$dir/saved$at/step-$(printf %08d $at)/codec.f32" ] && echo "with" || echo "without")
    cmp -s "$dir/ckw/step-00000020/params.f32" "$dir/ck$at/step-00000020/params.f32" &&
        [ "$(field loss "$dir/whole.jsonl" | tail -$((20 - at)))" = "$(field loss "$dir/resumed$at.jsonl")" ] && ok=1 || ok=0
    verdict $ok "PowerSGD saved at step $at ($has codec.f32) and resumed: the uninterrupted run's losses and weights bit for bit"
done
run z3part "${psgd[@]}" --zero 3 --save "$dir/ckz3" --stop-after 10 &&
    "$DTRAIN" train --resume "$dir/ckz3" --nproc 2 --strategy ddp --quiet > "$dir/z3res.out" 2>&1 &&
    cmp -s "$dir/ckw/step-00000020/params.f32" "$dir/ckz3/step-00000020/params.f32" && ok=1 || ok=0
verdict $ok "PowerSGD under ZeRO-3 saved at step 10 and resumed under DDP: the uninterrupted DDP run's weights bit for bit"
[ -f "$dir/saved10/step-00000010/codec.f32" ] && [ ! -f "$dir/saved3/step-00000003/codec.f32" ] && ok=1 || ok=0
verdict $ok "codec.f32 is saved once a step was compressed (at step 10), not before (step 3)"
run ktop --compress topk --compress-density 0.05 --save "$dir/ckt" &&
    run ktop10 --compress topk --compress-density 0.05 --save "$dir/ckt10" --stop-after 10 &&
    "$DTRAIN" train --resume "$dir/ckt10" --nproc 2 --quiet > "$dir/kres.out" 2>&1 &&
    cmp -s "$dir/ckt/step-00000020/params.f32" "$dir/ckt10/step-00000020/params.f32" && ok=1 || ok=0
verdict $ok "top-k saved at step 10 and resumed (its residuals in codec.f32): the uninterrupted run's weights bit for bit"
run ktopz2 --compress topk --compress-density 0.05 --zero 2 --save "$dir/cktz2" &&
    cmp -s "$dir/ckt/step-00000020/params.f32" "$dir/cktz2/step-00000020/params.f32" && ok=1 || ok=0
verdict $ok "ZeRO-2 with top-k = DDP with top-k: the same weights"
# Ok-TopK (--compress-exchange oktopk), 4 ranks: at density 1 every sum is kept (its threshold 0), the allgather's
# average bit for bit (each entry's values summed in rank order by both); at 0.01 it trains and receives fewer bytes a
# step than the allgather (k (P - 1) pairs); saved at step 10, between its refreshes at 8 and 12, and resumed (its
# regions and global threshold in codec.f32): the uninterrupted run's weights bit for bit
run ag4d1 --nproc 4 --compress topk --compress-density 1 --compress-exchange allgather --save "$dir/ag4d1.bin" &&
    run ok4d1 --nproc 4 --compress topk --compress-density 1 --compress-exchange oktopk --save "$dir/ok4d1.bin" &&
    identical "Ok-TopK at density 1 = the allgather at density 1 (4 ranks)" ag4d1 ok4d1
okt=(--nproc 4 --compress topk --compress-density 0.01 --compress-refresh 4)
mean() { field "$1" "$dir/$2.jsonl" | awk '{s += $1; n++} END{printf "%.0f", n ? s / n : 0}'; }
run ag4 "${okt[@]}" --compress-exchange allgather && run ok4 "${okt[@]}" --compress-exchange oktopk --save "$dir/ckok" &&
    run ok4p "${okt[@]}" --compress-exchange oktopk --save "$dir/ckok10" --stop-after 10 &&
    "$DTRAIN" train --resume "$dir/ckok10" --nproc 4 --quiet > "$dir/okres.out" 2>&1 &&
    cmp -s "$dir/ckok/step-00000020/params.f32" "$dir/ckok10/step-00000020/params.f32" && ok=1 || ok=0
verdict $ok "Ok-TopK saved at step 10 (refreshed every 4) and resumed: the uninterrupted run's weights bit for bit"
first=$(field loss "$dir/ok4.jsonl" | head -1) last=$(field loss "$dir/ok4.jsonl" | tail -1) rok=$(mean grad_recv_bytes ok4) rag=$(mean grad_recv_bytes ag4)
awk "BEGIN{exit !($last < $first - 1 && $rok > 0 && $rok < $rag)}" && ok=1 || ok=0
verdict $ok "Ok-TopK at density 0.01 on 4 ranks trains (loss $first -> $last, the allgather's $(field loss "$dir/ag4.jsonl" | tail -1)), receiving $rok bytes a step a rank (the allgather $rag)"
refused "an unknown sparse exchange" "expected auto, allgather, oktopk or hier" train "${common[@]}" --compress topk --compress-exchange ring --steps 1
refused "a refresh of 0" "--compress-refresh" train "${common[@]}" --compress topk --compress-exchange oktopk --compress-refresh 0 --steps 1
"$DTRAIN" ckpt verify "$dir/saved10" > "$dir/verify.out" 2>&1 && grep -q "codec.f32 match" "$dir/verify.out" && ok=1 || ok=0
verdict $ok "ckpt verify checks codec.f32 ($(tail -1 "$dir/verify.out" | sed 's/.*: whole/whole/' | cut -c1-100))"
cp -r "$dir/saved10" "$dir/other10"
"$DTRAIN" train --resume "$dir/other10" --nproc 2 --compress-rank 3 --steps 12 > "$dir/other.out" 2>&1 &&
    grep -q "starts afresh" "$dir/other.out" && ok=1 || ok=0
verdict $ok "resumed with another rank: the saved state is not forced on it, said ($(grep -m1 -o "the codec's state was saved.*" "$dir/other.out" | cut -c1-100))"
flip "$dir/saved10/step-00000010/codec.f32" 100 2
"$DTRAIN" ckpt verify "$dir/saved10" > "$dir/verify.out" 2>&1
[ $? != 0 ] && grep -q "codec.f32" "$dir/verify.out" && ok=1 || ok=0
verdict $ok "a damaged codec.f32 is named ($(grep -m1 -o "codec.f32.*" "$dir/verify.out" | cut -c1-90))"
# DGC: SGD's momentum accumulates on each rank and is masked where sent, so at density 1 (every entry sent each step,
# the velocity zeroed each step) it is SGD without momentum: dense DDP's average but for the embedding's summation order
# (and the weight decay's term, which DGC adds on each rank before averaging)
sgd=(--optimizer sgd --lr 0.2)
run sgd0 "${sgd[@]}" --weight-decay 0.1 && run dgc1 "${sgd[@]}" --weight-decay 0.1 --momentum 0.9 --compress dgc --compress-density 1 &&
    held "GPT-2, DGC at density 1 (momentum 0.9, masked; weight decay 0.1) against dense DDP with SGD without momentum" sgd0 dgc1 2e-5
run dgc "${sgd[@]}" --momentum 0.9 --nesterov --grad-clip 1 --compress dgc --compress-density 0.01 --compress-warmup 2 --save "$dir/ckd"
first=$(field loss "$dir/dgc.jsonl" | head -1) last=$(field loss "$dir/dgc.jsonl" | tail -1)
r=$(field compress_ratio "$dir/dgc.jsonl" | tr '\n' ' ' | cut -d' ' -f1,3,5,7,9,20)
read -r r1 r3 r5 r7 r9 r20 <<< "$r"
awk "BEGIN{exit !($last < $first - 1 && ${r1:-9} < 3 && ${r3:-0} > 3 && ${r5:-0} > 12 && ${r7:-0} > 40 && ${r9:-0} > 40 && ${r20:-0} > 40)}" && ok=1 || ok=0
verdict $ok "DGC (Nesterov, clipped, density 0.01, warm-up 2 steps a density) trains (loss $first -> $last), ratio at steps 1 3 5 7 9 20: $r"
run dgc10 "${sgd[@]}" --momentum 0.9 --nesterov --grad-clip 1 --compress dgc --compress-density 0.01 --compress-warmup 2 --save "$dir/ckd5" --stop-after 5 &&
    "$DTRAIN" train --resume "$dir/ckd5" --nproc 2 --quiet --metrics "$dir/dres.jsonl" > "$dir/dres.out" 2>&1 &&
    cmp -s "$dir/ckd/step-00000020/params.f32" "$dir/ckd5/step-00000020/params.f32" &&
    [ "$(field loss "$dir/dgc.jsonl" | tail -15)" = "$(field loss "$dir/dres.jsonl")" ] && ok=1 || ok=0
verdict $ok "DGC saved at step 5 (in its warm-up; residuals and velocities in codec.f32) and resumed: the uninterrupted run's losses and weights bit for bit"
run dgcd "${sgd[@]}" --weight-decay 0.1 --momentum 0.9 --compress dgc --compress-density 0.05 --save "$dir/dgcd.bin" &&
    run dgcz "${sgd[@]}" --weight-decay 0.1 --momentum 0.9 --compress dgc --compress-density 0.05 --zero 1 --save "$dir/dgcz.bin" &&
    identical "ZeRO-1 with DGC (the momentum on each rank, each shard's update momentum-free) = DDP with DGC" dgcd dgcz
# stage 3 on one machine keeps one shared copy of the parameters, whole, which DGC's weight decay reads; a copy per rank
# (ranks on several machines) holds the bucket's earlier units only in part by then: refused
run dgcz3 "${sgd[@]}" --weight-decay 0.1 --momentum 0.9 --compress dgc --compress-density 0.05 --zero 3 --save "$dir/dgcz3.bin" &&
    identical "ZeRO-3 with DGC (weight decay 0.1, one shared copy of the parameters) = DDP with DGC" dgcd dgcz3
DTRAIN_ZERO_PRIVATE_PARAMS=1 refused "DGC's weight decay under ZeRO-3 with a copy per rank" "which this rank holds only in part" \
    train "${common[@]}" "${sgd[@]}" --weight-decay 0.1 --momentum 0.9 --compress dgc --zero 3 --steps 1
# 1-bit Adam: its warm-up is Adam's on the whole average (the embedding's rows summed in the codec's order), then the
# momentum travels as signs; ZeRO-1 updates its shard of the same; a checkpoint in either stage resumes bit for bit
# (at lr 2e-3: at 3e-3 this 20-step run's loss jumps about after the freeze, a warm-up of 5 steps being far too short
# for Adam's variance to settle; the demo's 800 steps frozen at 100 end within 0.4% of dense, bench/compress_accuracy.sh)
ob=(--compress onebit --compress-start 5 --lr 2e-3)
run obwarm --compress onebit --compress-start 20 && held "GPT-2, 1-bit Adam in its warm-up against dense DDP (AdamW)" dense obwarm 2e-5
run dense2 --lr 2e-3 && run ob "${ob[@]}" --save "$dir/ob.bin"
first=$(field loss "$dir/ob.jsonl" | head -1) last=$(field loss "$dir/ob.jsonl" | tail -1) d2=$(field loss "$dir/dense2.jsonl" | tail -1)
r5=$(field compress_ratio "$dir/ob.jsonl" | sed -n 5p) r6=$(field compress_ratio "$dir/ob.jsonl" | sed -n 6p)
awk "BEGIN{exit !($last < $first - 1.5 && $last < 1.1 * $d2 && $r5 == 1 && $r6 > 15)}" && ok=1 || ok=0
verdict $ok "1-bit Adam (warm-up 5) trains (loss $first -> $last; dense $d2, held to 10% above), ratio at step 5 $r5, step 6 $r6"
pob=$("$DTRAIN" plan "${common[@]}" "${ob[@]}" --json 2> /dev/null | python3 -c "import json, sys; print('%.0f' % json.load(sys.stdin)['breakdown']['grad_sent_bytes'])")
rob=$(field grad_sent_bytes "$dir/ob.jsonl" | tail -1)
awk "BEGIN{d = ($pob - $rob) / $rob; exit !(d < 0.02 && d > -0.02)}" && ok=1 || ok=0
verdict $ok "plan's bytes a step for 1-bit Adam: $pob (the run's $rob, within 2%)"
run ob_end "${ob[@]}" --step-at-end --save "$dir/ob_end.bin" && identical "1-bit Adam: the update inside backward = the update after it" ob ob_end
run obz "${ob[@]}" --zero 1 --save "$dir/obz.bin" && identical "ZeRO-1 with 1-bit Adam (each shard's frozen variance) = DDP with 1-bit Adam" ob obz
run obz3 "${ob[@]}" --zero 3 --save "$dir/obz3.bin" && identical "ZeRO-3 with 1-bit Adam = DDP with 1-bit Adam" ob obz3
run obw "${ob[@]}" --save "$dir/ckob" && for at in 3 10; do
    run ob$at "${ob[@]}" --save "$dir/ckob$at" --stop-after $at &&
        "$DTRAIN" train --resume "$dir/ckob$at" --nproc 2 --quiet --metrics "$dir/obres$at.jsonl" > "$dir/obres$at.out" 2>&1 &&
        cmp -s "$dir/ckob/step-00000020/params.f32" "$dir/ckob$at/step-00000020/params.f32" &&
        [ "$(field loss "$dir/obw.jsonl" | tail -$((20 - at)))" = "$(field loss "$dir/obres$at.jsonl")" ] && ok=1 || ok=0
    verdict $ok "1-bit Adam saved at step $at ($([ $at -lt 5 ] && echo "in its warm-up" || echo "frozen")) and resumed: the uninterrupted run's losses and weights bit for bit"
done
# 0/1 Adam: with every step a variance step it is AdamW on the whole average (as 1-bit Adam's warm-up: the embedding's
# rows summed in the codec's order); its plan here (start 5, kappa 2, local scaler 2, clip 8): the variance at 1, 2, 4,
# signs at 3 and 5, local steps from 6 whose momenta are averaged at 6, 7, 8 and 16, the run ending in an open interval
# (17-20) that its end closes, so the replicas agree (the run's own check); a checkpoint in either phase resumes bit
# for bit against the run that saved at the same steps (a save in the local phase closes the interval too)
zo=(--compress zeroone --compress-start 5 --compress-var-scaler 2 --compress-local-scaler 2 --compress-local-clip 8 --lr 2e-3)
run zowarm --compress zeroone --compress-start 20 --compress-var-scaler 1000 &&
    held "GPT-2, 0/1 Adam with every step a variance step against dense DDP (AdamW)" dense zowarm 2e-5
run zo "${zo[@]}" --save "$dir/zo.bin"
first=$(field loss "$dir/zo.jsonl" | head -1) last=$(field loss "$dir/zo.jsonl" | tail -1) d2=$(field loss "$dir/dense2.jsonl" | tail -1)
ratios=$(python3 -c "
import json, sys
r = [json.loads(l).get('compress_ratio', 0) for l in open(sys.argv[1])]  # a step that sends nothing writes none
print(' '.join('0' if x == 0 else '1' if x == 1 else 's' for x in r))" "$dir/zo.jsonl")
sz=$(field grad_sent_bytes "$dir/zo.jsonl" | awk '{s += $1} END{print s}') so=$(field grad_sent_bytes "$dir/ob.jsonl" | awk '{s += $1} END{print s}')
[ "$ratios" = "1 1 s 1 s s s s 0 0 0 0 0 0 0 s 0 0 0 0" ] && awk "BEGIN{exit !($last < $first - 1.5 && $last < 1.1 * $d2 && $sz < 0.6 * $so)}" && ok=1 || ok=0
verdict $ok "0/1 Adam trains (loss $first -> $last; dense $d2, held to 10% above), its steps whole (1), signed (s) or silent (0): $ratios; $sz bytes sent in 20 steps (1-bit Adam $so)"
pzo=$("$DTRAIN" plan "${common[@]}" "${zo[@]}" --json 2> /dev/null | python3 -c "import json, sys; print('%.0f' % json.load(sys.stdin)['breakdown']['grad_sent_bytes'])")
rzo=$(awk -v s="$sz" 'BEGIN{printf "%.0f", s / 20}')
awk "BEGIN{d = ($pzo - $rzo) / $rzo; exit !(d < 0.02 && d > -0.02)}" && ok=1 || ok=0
verdict $ok "plan's bytes a step for 0/1 Adam, its plan's mix over the run's 20 steps (3 whole, 2 signed, 4 syncs): $pzo (the run's mean: $rzo, within 2%)"
# the planner's optimizer state (AdamW's two moments, and the local steps' accumulation and kept weights) and buffers
# are a run's that reaches the local phase, to the byte
rm -rf "$dir/zomem"
"$DTRAIN" train "${common[@]}" "${zo[@]}" --steps 8 --quiet --report "$dir/zomem" > /dev/null 2>&1
pmem=$("$DTRAIN" plan "${common[@]}" "${zo[@]}" --json 2> /dev/null | python3 -c "import json, sys; j = json.load(sys.stdin); print(j['optimizer'], j['buffers'])")
rmem=$(python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['memory_per_rank'][0]; print(r['optimizer'], r['buffers'])" "$dir/zomem/run.json" 2> /dev/null)
[ -n "$rmem" ] && [ "$pmem" = "$rmem" ] && ok=1 || ok=0
verdict $ok "plan's optimizer state and buffers for 0/1 Adam: $pmem bytes, the run's (8 steps, local from 6) $rmem"
run zo_end "${zo[@]}" --step-at-end --save "$dir/zo_end.bin" && identical "0/1 Adam: the update inside backward = the update after it" zo zo_end
for at in 3 12; do
    run zow$at "${zo[@]}" --save "$dir/ckzow$at" --save-every $at && run zo$at "${zo[@]}" --save "$dir/ckzo$at" --save-every $at --stop-after $at &&
        "$DTRAIN" train --resume "$dir/ckzo$at" --save-every $at --nproc 2 --quiet --metrics "$dir/zores$at.jsonl" > "$dir/zores$at.out" 2>&1 &&
        cmp -s "$dir/ckzow$at/step-00000020/params.f32" "$dir/ckzo$at/step-00000020/params.f32" &&
        [ "$(field loss "$dir/zow$at.jsonl" | tail -$((20 - at)))" = "$(field loss "$dir/zores$at.jsonl")" ] && ok=1 || ok=0
    verdict $ok "0/1 Adam saved at step $at ($([ $at -lt 5 ] && echo "its variance phase" || echo "a local interval open: closed by the save")) and resumed: the run's losses and weights bit for bit"
done
# the variance's bias correction counts the steps that updated it (a skipped one is not: test_compress), saved beside
# the optimizer's steps; a checkpoint from before the count was saved counts by the codec's plan, as it did
run zoold "${zo[@]}" --save "$dir/ckzoold" --save-every 12 --stop-after 12 &&
    python3 -c "
import json, sys; p = sys.argv[1] + '/step-00000012/manifest.json'; j = json.load(open(p)); v = j['optimizer'].pop('variance_steps')
json.dump(j, open(p, 'w')); print(v)" "$dir/ckzoold" > "$dir/zoold.v" && cp -r "$dir/ckzoold" "$dir/ckzobad" &&
    "$DTRAIN" train --resume "$dir/ckzoold" --save-every 12 --nproc 2 --quiet --metrics "$dir/zoold_res.jsonl" > /dev/null 2>&1 &&
    cmp -s "$dir/ckzow12/step-00000020/params.f32" "$dir/ckzoold/step-00000020/params.f32" && ok=1 || ok=0
verdict $ok "0/1 Adam at step 12 saved $(cat "$dir/zoold.v" 2> /dev/null) variance steps; without them (an older checkpoint) resumed by the plan's count: the run's weights bit for bit"
python3 -c "
import json, sys; p = sys.argv[1] + '/step-00000012/manifest.json'; j = json.load(open(p)); j['optimizer']['variance_steps'] = 13
json.dump(j, open(p, 'w'))" "$dir/ckzobad"
out=$("$DTRAIN" train --resume "$dir/ckzobad" --nproc 2 --quiet 2>&1) && ok=0 || { echo "$out" | grep -q "variance_steps 13 is more than its steps 12" && ok=1 || ok=0; }
verdict $ok "a checkpoint whose variance steps outnumber its steps is refused: $(echo "$out" | grep -m1 variance_steps | cut -c1-160)"
refused "0/1 Adam with SGD" "--compress zeroone is 0/1 Adam" train "${common[@]}" "${zo[@]}" --optimizer sgd --steps 1
refused "0/1 Adam under ZeRO" "ZeRO shards" train "${common[@]}" "${zo[@]}" --zero 1 --steps 1
refused "0/1 Adam under ZeRO, planned" "ZeRO shards" plan "${common[@]}" "${zo[@]}" --zero 2
refused "0/1 Adam with clipping" "no whole gradient to clip" train "${common[@]}" "${zo[@]}" --grad-clip 1 --steps 1
refused "0/1 Adam without a variance step" "var_freeze_step" train "${common[@]}" --compress zeroone --steps 1
refused "1-bit Adam with SGD" "--compress onebit is 1-bit Adam" train "${common[@]}" --compress onebit --compress-start 5 --optimizer sgd --steps 1
refused "1-bit Adam without a warm-up" "1-bit Adam freezes Adam's variance after a warm-up" train "${common[@]}" --compress onebit --steps 1
refused "1-bit Adam with clipping" "nothing whole to clip" train "${common[@]}" "${ob[@]}" --grad-clip 1 --steps 1
refused "DGC with AdamW" "--compress dgc corrects SGD's momentum" train "${common[@]}" --compress dgc --steps 1
refused "DGC with a start step" "DGC compresses from the first step" train "${common[@]}" "${sgd[@]}" --compress dgc --compress-start 5 --steps 1
refused "an unknown codec" "expected none, powersgd, topk, dgc, onebit or zeroone" train "${common[@]}" --compress top9 --steps 1
refused "a density of 0" "--compress-density" train "${common[@]}" --compress topk --compress-density 0 --steps 1
refused "a rank at which no matrix gains" "no matrix of the model gains" train "${common[@]}" --compress powersgd --compress-rank 4096 --steps 1
refused "a rank of 0" "--compress-rank" train "${common[@]}" --compress powersgd --compress-rank 0 --steps 1
refused "a codec with TP" "--compress powersgd with --tp" train "${common[@]}" --compress powersgd --tp 2 --steps 1
# under a pipeline each stage's data-parallel group compresses its own tensors (DP 2 x PP 2, 4 ranks): PowerSGD's Qs are
# seeded by a tensor's place in the whole model, so the stages together are DP 2's run bit for bit (and ZeRO-1's);
# top-k at density 1 and 1-bit Adam's warm-up are the dense pipeline's run; 0/1 Adam's interval ends refresh the last
# stage's tied copy (its replicas ended apart before); the plan's bytes are the
# stage's that sends the most (the run's rank 0, the first stage)
pp=(--nproc 4 --pp 2)
run pppsgd "${pp[@]}" "${psgd[@]}" --save "$dir/pppsgd.bin" && identical "DP 2 x PP 2 with PowerSGD = DP 2 with PowerSGD" psgd pppsgd
run pppsgdz "${pp[@]}" "${psgd[@]}" --zero 1 --save "$dir/pppsgdz.bin" && identical "DP 2 x PP 2 x ZeRO-1 with PowerSGD = DP 2 with PowerSGD" psgd pppsgdz
run ppdense "${pp[@]}"
run pptop1 "${pp[@]}" --compress topk --compress-density 1 && held "DP 2 x PP 2, top-k at density 1 against the dense pipeline" ppdense pptop1 2e-5
run ppobwarm "${pp[@]}" --compress onebit --compress-start 20 && held "DP 2 x PP 2, 1-bit Adam in its warm-up against the dense pipeline" ppdense ppobwarm 2e-5
run ppzowarm "${pp[@]}" --compress zeroone --compress-start 20 --compress-var-scaler 1000 &&
    held "DP 2 x PP 2, 0/1 Adam with every step a variance step against the dense pipeline" ppdense ppzowarm 2e-5
# (the run's end fails where a stage's replicas differ: "the ranks' weights differ after training")
ok=0
run ppzo "${pp[@]}" "${zo[@]}" && first=$(field loss "$dir/ppzo.jsonl" | head -1) last=$(field loss "$dir/ppzo.jsonl" | tail -1) &&
    awk "BEGIN{exit !($last < $first - 1.5)}" && ok=1
verdict $ok "DP 2 x PP 2, 0/1 Adam with local steps trains (loss ${first:-?} -> ${last:-?}) and every stage's replicas end identical"
# a checkpoint holds each stage's codec state (the stage's first rank writes codec-stageSofP.f32): PowerSGD (every
# rank's residuals, the stage's Qs), 1-bit Adam once frozen (momentum, server errors) and Ok-TopK (its shared regions
# and threshold) saved at step 10 and resumed
# give the uninterrupted run's losses and weights bit for bit; ckpt verify checks both stages' files; DP 2 without the
# pipeline resumes the weights and starts the codec's state afresh, said
ppsaved() { # NAME ARGS...: saved whole (ck$NAME) and at step 10 (ck${NAME}10), then resumed; the verdict's text in $why
    why=" (failed: $dir/${1}*.out)"
    run "$1" "${pp[@]}" "${@:2}" --save "$dir/ck$1" && run "${1}10" "${pp[@]}" "${@:2}" --save "$dir/ck${1}10" --stop-after 10 &&
        cp -r "$dir/ck${1}10" "$dir/saved${1}10" &&
        "$DTRAIN" train --resume "$dir/ck${1}10" --nproc 4 --pp 2 --quiet --metrics "$dir/${1}res.jsonl" > "$dir/${1}res.out" 2>&1 &&
        [ -f "$dir/saved${1}10/step-00000010/codec-stage0of2.f32" ] && [ -f "$dir/saved${1}10/step-00000010/codec-stage1of2.f32" ] &&
        ! grep -q "afresh" "$dir/${1}res.out" &&
        cmp -s "$dir/ck$1/step-00000020/params.f32" "$dir/ck${1}10/step-00000020/params.f32" &&
        [ "$(field loss "$dir/$1.jsonl" | tail -10)" = "$(field loss "$dir/${1}res.jsonl")" ] && why="" ok=1 || ok=0
}
ppsaved ppw "${psgd[@]}"
verdict $ok "DP 2 x PP 2 with PowerSGD saved at step 10 (codec-stage0of2.f32, codec-stage1of2.f32) and resumed: the uninterrupted run's losses and weights bit for bit$why"
ppsaved ppob --compress onebit --compress-start 5
verdict $ok "DP 2 x PP 2 with 1-bit Adam saved at step 10 (frozen since 5) and resumed: the uninterrupted run's losses and weights bit for bit$why"
ppsaved ppok --compress topk --compress-density 0.01 --compress-exchange oktopk --compress-refresh 4
verdict $ok "DP 2 x PP 2 with Ok-TopK saved at step 10 (each stage's regions and threshold beside its residuals) and resumed: the uninterrupted run's losses and weights bit for bit$why"
"$DTRAIN" ckpt verify "$dir/savedppw10" > "$dir/ppverify.out" 2>&1 && grep -q "codec-stage0of2.f32, codec-stage1of2.f32" "$dir/ppverify.out" && ok=1 || ok=0
verdict $ok "ckpt verify checks each stage's codec state ($(tail -1 "$dir/ppverify.out" | sed 's/.*: whole/whole/' | cut -c1-110))"
n=$("$DTRAIN" ckpt info "$dir/savedppob10" 2> /dev/null | grep -c "^codec-stage[01]of2.f32: --compress onebit's state, every one of 2 data-parallel ranks'")
[ "$n" = 2 ] && ok=1 || ok=0
verdict $ok "ckpt info names each stage's codec state ($("$DTRAIN" ckpt info "$dir/savedppob10" 2> /dev/null | grep -m1 "^codec-stage" | cut -c1-90))"
# an interleaved pipeline's stages hold two chunks each: resumed with its schedule, bit for bit; with 1F1B (one chunk a
# stage) its state starts afresh, saying which flags keep it
il=("${pp[@]}" --layers 4 --batch 2 --grad-accum 2 --pp-schedule interleaved "${psgd[@]}")
run ppil "${il[@]}" --save "$dir/ckil" && run ppil10 "${il[@]}" --save "$dir/ckil10" --stop-after 10 && cp -r "$dir/ckil10" "$dir/savedil10" &&
    "$DTRAIN" train --resume "$dir/ckil10" --nproc 4 --pp 2 --pp-schedule interleaved --quiet > "$dir/ilres.out" 2>&1 &&
    ! grep -q afresh "$dir/ilres.out" && cmp -s "$dir/ckil/step-00000020/params.f32" "$dir/ckil10/step-00000020/params.f32" && ok=1 || ok=0
verdict $ok "DP 2 x PP 2 interleaved (2 chunks a stage) with PowerSGD saved at step 10 and resumed with its schedule: the uninterrupted run's weights bit for bit"
"$DTRAIN" train --resume "$dir/savedil10" --nproc 4 --pp 2 --steps 11 > "$dir/il1f1b.out" 2>&1 &&
    grep -q "saved by 2 pipeline stages of 2 chunks.*starts afresh (--pp-schedule interleaved --virtual-stages 2 keeps it)" "$dir/il1f1b.out" && ok=1 || ok=0
verdict $ok "the interleaved run's codec state resumed by 1F1B: afresh, said with the flags that keep it ($(grep -m1 -o "starts afresh.*" "$dir/il1f1b.out"))"
cp -r "$dir/savedppw10" "$dir/ppdp10"
"$DTRAIN" train --resume "$dir/ppdp10" --nproc 2 --pp 1 --steps 12 > "$dir/ppdp.out" 2>&1 &&
    grep -q "saved by 2 pipeline stages of 1 chunk; this run has no pipeline: its state starts afresh" "$dir/ppdp.out" && ok=1 || ok=0
verdict $ok "DP 2 resumed from DP 2 x PP 2: the codec's state not forced on another split, said ($(grep -m1 -o "saved by 2 pipeline.*" "$dir/ppdp.out" | cut -c1-90))"
flip "$dir/savedppw10/step-00000010/codec-stage1of2.f32" 100 2
"$DTRAIN" train --resume "$dir/savedppw10" --nproc 4 --pp 2 --quiet > "$dir/ppflip.out" 2>&1
[ $? != 0 ] && grep -q "codec-stage1of2.f32" "$dir/ppflip.out" && ok=1 || ok=0
verdict $ok "a damaged stage's codec file refuses the resume, named ($(grep -m1 -o "codec-stage1of2.f32.*" "$dir/ppflip.out" | cut -c1-90))"
# a stage's buffers, the plan's and the run's: the first and last stages count the tied wte's gradient on its way
# between them (the run had left it out: 64 KiB under); top-k, 1-bit Adam (its chunks' segments counted as the run
# makes them), PowerSGD and dense to the byte
for c in ":0" "--compress topk --compress-density 0.01:0" "--compress onebit --compress-start 2:0" "--compress powersgd --compress-rank 2:0"; do
    read -r pm rm <<< "$(buffers "${pp[@]}" ${c%%:*})"
    awk -v p="${pm:-0}" -v r="${rm:-0}" -v t="${c##*:}" 'BEGIN{d = (p - r) / (r > 0 ? r : 1); if (d < 0) d = -d; exit !(r > 0 && d <= t)}' && ok=1 || ok=0
    verdict $ok "plan's communication buffers under DP 2 x PP 2 ${c%%:*}: $pm bytes, the run's $rm (its fullest stage)"
done
ppb=$(plan_bytes "${pp[@]}" --compress powersgd --compress-rank 2) rpp=$(field grad_sent_bytes "$dir/pppsgd.jsonl" | tail -1)
[ -n "$ppb" ] && [ "$ppb" = "$rpp" ] && ok=1 || ok=0
verdict $ok "plan's bytes a step for PowerSGD under DP 2 x PP 2: $ppb (the first stage's run: $rpp)"
refused "a codec with 16-bit wires" "with --grad-comm" train "${common[@]}" --compress powersgd --grad-comm bf16 --steps 1
refused "DGC's momentum summed inside a machine" "DGC's momentum is each rank's own" train "${common[@]}" "${sgd[@]}" --compress dgc --compress-exchange hier --steps 1
if [ -n "$MPIEXEC" ]; then
    mpi() { # NAME ARGS...: 4 ranks on 2 pseudo-nodes (common's flags less its --nproc)
        local name=$1
        shift
        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader OMPI_MCA_rmaps_base_oversubscribe=1 \
            ASAN_OPTIONS=detect_leaks=0 DTRAIN_FAKE_NODES=2 timeout 300 "$MPIEXEC" -np 4 "$DTRAIN" train "${common[@]:0:${#common[@]}-2}" --quiet \
            --model llama-tiny "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1
    }
    # at density 1 the machine's sums, then the machines': dense DDP's where its allreduce picks its own hier algorithm
    # (the same sums in the same order: bit for bit in the Release build), another algorithm's order elsewhere (the
    # sanitizers' build: 3e-7)
    w=missing
    mpi mdense && mpi mhier1 --compress topk --compress-density 1 --compress-exchange hier && w=$(worst "$dir/mdense.jsonl" "$dir/mhier1.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ok=1 || ok=0
    verdict $ok "mpirun, 2 pseudo-nodes of 2 ranks: top-k hier at density 1 against dense DDP: worst relative loss difference over 20 steps $w"
    mpi mag --compress topk --compress-density 0.01 --compress-exchange allgather && mpi mhier --compress topk --compress-density 0.01 --compress-exchange hier
    first=$(field loss "$dir/mhier.jsonl" | head -1) last=$(field loss "$dir/mhier.jsonl" | tail -1)
    sh=$(mean grad_sent_bytes mhier) sa=$(mean grad_sent_bytes mag)
    awk "BEGIN{exit !($last < $first - 1 && $sh > 0 && $sh < 0.6 * $sa)}" && ok=1 || ok=0
    verdict $ok "mpirun, 2 pseudo-nodes: top-k hier at 0.01 trains (loss $first -> $last; the allgather's $(field loss "$dir/mag.jsonl" | tail -1)), sending $sh bytes a step a rank between machines (the allgather $sa)"
    # the hierarchical exchange's buffers (a copy of each bucket among them) counted alike by the planner and the run
    rm -rf "$dir/mhrep"
    mpi mhmem --compress topk --compress-density 0.01 --compress-exchange hier --steps 3 --report "$dir/mhrep"
    pmem=$("$DTRAIN" plan "${common[@]:0:${#common[@]}-2}" --model llama-tiny --compress topk --compress-density 0.01 --compress-exchange hier \
        --nproc 4 --nodes 2 --json 2> /dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['buffers'])")
    rmem=$(python3 -c "import json, sys; print(max(x['buffers'] for x in json.load(open(sys.argv[1]))['memory_per_rank']))" "$dir/mhrep/run.json" 2> /dev/null)
    [ -n "$rmem" ] && [ "$pmem" = "$rmem" ] && ok=1 || ok=0
    verdict $ok "mpirun, 2 pseudo-nodes: plan's communication buffers with top-k hier: $pmem bytes, the run's $rmem"
fi
# a rank killed mid-run: the compressed exchanges wait on it; the other names it and the job ends
killed_rank "rank 1 killed under PowerSGD" "${common[@]}" --compress powersgd
# (at a tiny lr: frozen after 2 steps at 3e-3 its update overflows within tens of steps, and a job that ended on a NaN
# before the kill leaves no rank to kill)
killed_rank "rank 1 killed under 1-bit Adam (its alltoall and allgather)" "${common[@]}" --compress onebit --compress-start 2 --lr 1e-6
killed_rank "rank 1 killed under 0/1 Adam (its local steps' syncs)" "${common[@]}" --compress zeroone --compress-start 2 --compress-local-clip 1 --lr 1e-6
echo "compress checks: $passed passed, $failed failed"
[ "$failed" = 0 ]
