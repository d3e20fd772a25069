#!/bin/bash
# DPO (--data FILE.jsonl of preference pairs) gives the losses of one process with the global batch over 20 AdamW
# steps, each within 1e-6 relative plus the metrics' last printed digit (1e-6 absolute: 1.7e-6 of a loss near 0.6; a
# pair's loss is a small difference of two sums of log-probabilities, which other orders of addition move), in every layout that runs the head: accumulation, DDP 2, ZeRO-2 and 3, TP 2, SP 2,
# PP 2 (1F1B and interleaved), DP 2 x TP 2, and with LoRA (the base the reference) alone, under DDP 2 and PP 2. A
# LoRA run saved at step 10 resumes with the same losses (its reference: the base again). Step 1's loss is log 2 (the
# policy is the reference); bf16 keeps within 1e-3 of f32; --val-data of pairs evaluates the same on 1 and 2 ranks,
# with its reward accuracy. What cannot be is refused: CP (a rank holds part of each sequence), resuming a run of every weight (the
# reference is gone), an odd --batch, --dpo-beta or --dpo-loss without pairs, a pairs file beside an examples file,
# smoothing out of a loss's range, weights that do not match, an f-divergence a
# loss has no form under. --dpo-loss ipo on DDP 2, and MPO's mix (sigmoid, bco_pair, sft) on DDP 2 against 2
# micro-batches (sft's mean is over a micro-batch's tokens, as TRL's per device), aot's sorts likewise; LD-DPO's
# --dpo-ld-alpha with WPO's --dpo-wpo (each position's log sum p^2 from the head) on TP 2 and PP 2 as one process, in
# bf16 near f32; WPO with aot, an ld_alpha above 1 and --dpo-wpo without pairs refused; a resumed run keeps its loss.
# usage: dpo_equivalence.sh DTRAIN FIXTURES
set -u
DTRAIN=$1
FIX=$2
. "$(dirname "$0")/finetune_checks.sh"
cp "$FIX/sft/tokenizer.json" "$FIX/sft/tokenizer_config.json" "$dir/"
# pairs from the license's lines: the prompt a line's start, chosen its end, rejected half of it shouted or with " no"
awk 'length($0) > 20 { n++; h = int(length($0) / 2); u = substr($0, 1, h); a = substr($0, h + 1);
     gsub(/\\/, "", u); gsub(/"/, "", u); gsub(/\\/, "", a); gsub(/"/, "", a); b = substr(a, 1, int(length(a) / 2));
     printf "{\"prompt\": \"%s\", \"chosen\": \"%s\", \"rejected\": \"%s\"}\n", u, a, (n % 2 ? toupper(b) : b " no") }' \
    /usr/share/common-licenses/GPL-3 > "$dir/all.jsonl"
head -n 300 "$dir/all.jsonl" > "$dir/train.jsonl"
tail -n 40 "$dir/all.jsonl" > "$dir/val.jsonl"
shape=(--model llama-tiny --vocab 2048 --layers 2 --channels 48 --heads 4 --kv-heads 2 --ffn 96 --max-seq 128 --seq 64
       --data "$dir/train.jsonl" --steps 20 --lr 1e-3 --threads 1 --tokenizer "$dir/tokenizer.json")
common=("${shape[@]}")
# in place of finetune_checks.sh's worst and close: a pair's loss, a small difference of two sums, within 1e-6 relative
# plus the metrics' last printed digit
worst() { # REF FILE: "w bad"
    paste <(field loss "$1") <(field loss "$2") |
        awk 'BEGIN{w=0; n=0; bad=0} {d=$1-$2; if(d<0)d=-d; if(d>1e-6+1e-6*$1)bad=1; if(d/$1>w)w=d/$1; n++}
             END{if(n!=20) print "missing"; else print w, bad}'
}
close() {
    local w
    w=$(worst "$2" "$3")
    [ "${w#* }" = 0 ] && ok=1 || ok=0
    verdict $ok "$1: worst relative loss difference over 20 steps ${w% *}"
}
run ref --batch 8 --tensorboard "$dir/tb"
first=$(field loss "$dir/ref.jsonl" | head -1)
last=$(field loss "$dir/ref.jsonl" | tail -1)
awk "BEGIN{d=$first-log(2); if(d<0)d=-d; exit !(d <= 1e-6 && $last < 0.65)}" && ok=1 || ok=0
verdict $ok "one process: step 1's loss is log 2 ($first), step 20's below it ($last)"
tags=$(cat "$dir"/tb/events.out.tfevents.* | grep -a -o "train/rewards_accuracies" | wc -l)
[ "$tags" = 20 ] && ok=1 || ok=0
verdict $ok "--tensorboard: train/rewards_accuracies a step (TRL's name): $tags events"
lpc=($(field logps_chosen "$dir/ref.jsonl")) lpr=($(field logps_rejected "$dir/ref.jsonl")) rc=($(field reward_chosen "$dir/ref.jsonl"))
[ "${#lpc[@]}" = 20 ] && [ "${#lpr[@]}" = 20 ] && [ "${rc[0]}" = 0.000000 ] && awk "BEGIN{exit !(${lpc[0]} < 0 && ${lpr[19]} < 0)}" &&
    [ "$(cat "$dir"/tb/events.out.tfevents.* | grep -a -o "train/logps_chosen" | wc -l)" = 20 ] && ok=1 || ok=0
verdict $ok "the metrics' logps_chosen, logps_rejected (TRL's logps/*) and reward_chosen a step: ${lpc[0]:-none}, ${lpr[0]:-none}, ${rc[0]:-none} at step 1"
acc=($(field reward_accuracy "$dir/ref.jsonl"))
[ "${#acc[@]}" = 20 ] && [ "${acc[0]}" = 0.0000 ] && awk "BEGIN{exit !(${acc[19]} > 0.5)}" && ok=1 || ok=0
verdict $ok "the metrics' reward accuracy a step: ${acc[0]:-none} at step 1 (the reference), ${acc[19]:-none} at step 20"
"$DTRAIN" train "${shape[@]}" --batch 8 --steps 1 > "$dir/line.out" 2>&1
grep -q "preference pairs: 300 from .*train.jsonl, DPO with beta 0.1 (sigmoid); the reference (the starting model) scored 600 rows" "$dir/line.out" && ok=1 || ok=0
verdict $ok "the start line says what trains ($(grep -m1 "preference" "$dir/line.out" | cut -c1-110))"
run acc --batch 4 --grad-accum 2 && close "2 micro-batches of 2 pairs" "$dir/ref.jsonl" "$dir/acc.jsonl"
run ddp --batch 4 --nproc 2 && close "DDP 2" "$dir/ref.jsonl" "$dir/ddp.jsonl"
run z2 --batch 4 --nproc 2 --zero 2 && close "ZeRO-2 on 2 ranks" "$dir/ref.jsonl" "$dir/z2.jsonl"
run z3 --batch 2 --grad-accum 2 --nproc 2 --zero 3 && close "ZeRO-3 on 2 ranks, 2 micro-batches of one pair" "$dir/ref.jsonl" "$dir/z3.jsonl"
run tp --batch 8 --nproc 2 --tp 2 && close "TP 2" "$dir/ref.jsonl" "$dir/tp.jsonl"
run sp --batch 8 --nproc 2 --tp 2 --sp && close "TP 2 with sequence parallelism" "$dir/ref.jsonl" "$dir/sp.jsonl"
run pp --batch 2 --grad-accum 4 --nproc 2 --pp 2 && close "PP 2, 1F1B, 4 micro-batches" "$dir/ref.jsonl" "$dir/pp.jsonl"
deep=(--layers 6) # an interleaved pipeline's 2 chunks a stage, LoRA under PP 2: a block or more in every part (the head costs 3 blocks)
run ref6 --batch 8 "${deep[@]}"
run ppi --batch 2 --grad-accum 4 --nproc 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 "${deep[@]}" &&
    close "PP 2, interleaved (2 chunks a stage), 4 micro-batches" "$dir/ref6.jsonl" "$dir/ppi.jsonl"
run dptp --batch 4 --nproc 4 --tp 2 --zero 2 && close "DP 2 x TP 2, ZeRO-2" "$dir/ref.jsonl" "$dir/dptp.jsonl"
# TRL's other loss kinds (each against TRL in test_dpo): a pair's own (ipo: over its completions' tokens) gives one
# process's losses on DDP 2; MPO's mix with sft (the chosen tokens' mean over each micro-batch, as TRL's per device)
# gives two micro-batches' on DDP 2
run ipo --batch 8 --dpo-loss ipo && run ipoddp --batch 4 --nproc 2 --dpo-loss ipo && close "--dpo-loss ipo, DDP 2" "$dir/ipo.jsonl" "$dir/ipoddp.jsonl"
mpo=(--dpo-loss sigmoid,bco_pair,sft --dpo-loss-weights 0.8,0.2,1)
run mpo --batch 4 --grad-accum 2 "${mpo[@]}" && run mpoddp --batch 4 --nproc 2 "${mpo[@]}" &&
    close "--dpo-loss sigmoid,bco_pair,sft (MPO), DDP 2 against 2 micro-batches" "$dir/mpo.jsonl" "$dir/mpoddp.jsonl"
# aot sorts the log-ratios across a micro-batch's pairs (TRL's per device): DDP 2 as two micro-batches
run aot --batch 4 --grad-accum 2 --dpo-loss aot_unpaired,aot && run aotddp --batch 4 --nproc 2 --dpo-loss aot_unpaired,aot &&
    close "--dpo-loss aot_unpaired,aot, DDP 2 against 2 micro-batches" "$dir/aot.jsonl" "$dir/aotddp.jsonl"
differ=$(paste <(field loss "$dir/ref.jsonl") <(field loss "$dir/ipo.jsonl") <(field loss "$dir/mpo.jsonl") | awk '$1 != $2 && $1 != $3 && $2 != $3 { n++ } END { print n + 0 }')
[ "$differ" = 20 ] && ok=1 || ok=0
verdict $ok "sigmoid, ipo and the MPO mix train differently ($differ of 20 steps' losses apart)"
lora=(--lora-rank 4 --lora-targets q_proj,v_proj,down_proj "${deep[@]}")
run lref --batch 8 "${lora[@]}"
run lddp --batch 4 --nproc 2 "${lora[@]}" && close "LoRA, DDP 2" "$dir/lref.jsonl" "$dir/lddp.jsonl"
run lpp --batch 2 --grad-accum 4 --nproc 2 --pp 2 "${lora[@]}" && close "LoRA, PP 2" "$dir/lref.jsonl" "$dir/lpp.jsonl"
# LD-DPO's tails and WPO's weights (each position's log sum p^2, summed over TP's vocabulary split): a pair's own, so
# every layout gives one process's losses; bf16's 16-bit logits near f32's
wl=(--dpo-wpo --dpo-ld-alpha 0.5)
run wl --batch 8 "${wl[@]}"
w1=$(field loss "$dir/wl.jsonl" | head -1)
awk "BEGIN{exit !($w1 > 0 && $w1 < 0.69)}" && ok=1 || ok=0
verdict $ok "--dpo-wpo: step 1's loss is log 2 times the pairs' mean weight, below log 2 ($w1)"
run wltp --batch 8 --nproc 2 --tp 2 "${wl[@]}" && close "--dpo-wpo --dpo-ld-alpha 0.5, TP 2" "$dir/wl.jsonl" "$dir/wltp.jsonl"
run wlpp --batch 2 --grad-accum 4 --nproc 2 --pp 2 "${wl[@]}" && close "--dpo-wpo --dpo-ld-alpha 0.5, PP 2, 4 micro-batches" "$dir/wl.jsonl" "$dir/wlpp.jsonl"
run wlb16 --batch 4 --nproc 2 --precision bf16 "${wl[@]}"
# a LoRA run saved at step 10 under DDP 2, resumed on one process: the base is the reference again
if "$DTRAIN" train "${shape[@]}" "${lora[@]}" --quiet --batch 4 --nproc 2 --steps 10 --save "$dir/ck" --metrics "$dir/a.jsonl" > "$dir/a.out" 2>&1 &&
   "$DTRAIN" train "${shape[@]}" "${lora[@]}" --quiet --batch 8 --resume "$dir/ck" --metrics "$dir/b.jsonl" > "$dir/b.out" 2>&1; then
    w=$(worst <(cat "$dir/a.jsonl" "$dir/b.jsonl") "$dir/lref.jsonl")
    [ "${w#* }" = 0 ] && ok=1 || ok=0
    verdict $ok "LoRA saved by DDP 2 at step 10, resumed on one process: worst relative loss difference ${w% *}"
else
    failed=$((failed + 1)); echo "FAIL save or resume"; tail -n 2 "$dir/a.out" "$dir/b.out"
fi
# --resume DIR alone: the data, its tokenizer, beta and the loss from the checkpoint
"$DTRAIN" train "${shape[@]}" "${lora[@]}" --dpo-beta 0.3 --dpo-loss robust,hinge --dpo-loss-weights 0.5,2 --dpo-label-smoothing 0.2 \
    --dpo-f-divergence js_divergence --dpo-ld-alpha 0 --dpo-wpo --quiet --batch 8 --steps 2 --save "$dir/b3" > /dev/null 2>&1
"$DTRAIN" train --resume "$dir/b3" --steps 3 > "$dir/b3.out" 2>&1 &&
    grep -qF "DPO with beta 0.3 (robust x 0.5 + hinge x 2, js_divergence, label smoothing 0.2, ld_alpha 0, WPO's weights); the reference (the base, adapters off)" "$dir/b3.out" &&
    grep -q "^step 3/3" "$dir/b3.out" && ok=1 || ok=0
verdict $ok "--resume DIR alone goes on with its pairs, tokenizer, beta and loss ($(grep -o 'DPO with beta [^;]*' "$dir/b3.out"))"
# bf16 (the logits' gradient made in the head's 16-bit backward, each row weighed there): near f32's, DDP 2 near it
run b16 --batch 8 --precision bf16
run b16ddp --batch 4 --nproc 2 --precision bf16
near() { paste <(field loss "$2") <(field loss "$3") | awk -v what="$1" 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++}
         END{ok = n == 20 && w <= 1e-3; printf "%s %s: worst relative loss difference over 20 steps %g (bf16: within 1e-3)\n", ok ? "ok  " : "FAIL", what, w; exit !ok}'; }
near "bf16 against f32" "$dir/ref.jsonl" "$dir/b16.jsonl" && passed=$((passed + 1)) || failed=$((failed + 1))
near "bf16, DDP 2 against one process" "$dir/b16.jsonl" "$dir/b16ddp.jsonl" && passed=$((passed + 1)) || failed=$((failed + 1))
near "--dpo-wpo --dpo-ld-alpha 0.5, bf16 on DDP 2 against f32" "$dir/wl.jsonl" "$dir/wlb16.jsonl" && passed=$((passed + 1)) || failed=$((failed + 1))
# at the reference (no step yet) every pair's log-ratio is exactly 0: loss log 2, no pair counted accurate
"$DTRAIN" train "${shape[@]}" --batch 8 --steps 0 --val-data "$dir/val.jsonl" --eval-batches 4 > "$dir/v0.out" 2>&1
grep -q "pairs evaluated: 16, reward accuracy 0.0%, margin +0.0000" "$dir/v0.out" && grep -q "validation loss 0.693147" "$dir/v0.out" && ok=1 || ok=0
verdict $ok "--steps 0 at the reference: $(grep -o 'reward accuracy [^(]*' "$dir/v0.out"), $(grep -o 'validation loss [0-9.]*' "$dir/v0.out")"
# validation pairs: the same loss and reward accuracy on 1 and 2 ranks
"$DTRAIN" train "${shape[@]}" --batch 8 --steps 6 --val-data "$dir/val.jsonl" --eval-batches 4 > "$dir/v1.out" 2>&1
"$DTRAIN" train "${shape[@]}" --batch 4 --nproc 2 --steps 6 --val-data "$dir/val.jsonl" --eval-batches 4 > "$dir/v2.out" 2>&1
a=$(grep -o "val loss [0-9.]*" "$dir/v1.out" | tail -1) b=$(grep -o "val loss [0-9.]*" "$dir/v2.out" | tail -1)
ra=$(grep -o "pairs evaluated: 16, reward accuracy [0-9.]*%" "$dir/v1.out" | tail -1)
rb=$(grep -o "pairs evaluated: 16, reward accuracy [0-9.]*%" "$dir/v2.out" | tail -1)
a=${a##* } b=${b##* }
[ -n "$a" ] && [ -n "$b" ] && [ -n "$ra" ] && [ "$ra" = "$rb" ] && awk "BEGIN{d=($a-$b)/$a; if(d<0)d=-d; exit !(d <= 1e-5)}" && ok=1 || ok=0
verdict $ok "--val-data of pairs: one process $a, DDP 2 $b; ${ra:-no accuracy} (DDP 2: ${rb:-none})"
refused "context parallelism" "not with --cp 2" train "${shape[@]}" --batch 8 --nproc 2 --cp 2
"$DTRAIN" train "${shape[@]}" --quiet --batch 8 --steps 2 --save "$dir/full" > /dev/null 2>&1
refused "resuming a run of every weight" "no longer holds" train "${shape[@]}" --batch 8 --steps 4 --resume "$dir/full"
refused "an odd --batch" "even --batch" train "${shape[@]}" --batch 3
head -n 40 "$dir/all.jsonl" | sed 's/"chosen": /"completion": /; s/, "rejected": "[^"]*"//' > "$dir/sft.jsonl"
refused "--dpo-beta without pairs" "holds no preference pairs" train "${shape[@]}" --batch 8 --data "$dir/sft.jsonl" --dpo-beta 0.2
refused "examples beside pairs" "holds examples" train "${shape[@]}" --batch 8 --val-data "$dir/sft.jsonl"
refused "--dpo-loss without pairs" "--dpo-loss: --data" train "${shape[@]}" --batch 8 --data "$dir/sft.jsonl" --dpo-loss ipo
refused "robust's smoothing of 0.5" "robust's flip probability lies in" train "${shape[@]}" --batch 8 --dpo-loss robust --dpo-label-smoothing 0.5
refused "exo_pair without smoothing" "exo_pair's epsilon lies in (0, 1)" train "${shape[@]}" --batch 8 --dpo-loss exo_pair
refused "weights that do not match the losses" "2 weights for 1 losses" train "${shape[@]}" --batch 8 --dpo-loss ipo --dpo-loss-weights 1,2
refused "an f-divergence with a loss it has no form for" "bco_pair has no form under it" train "${shape[@]}" --batch 8 --dpo-loss bco_pair \
    --dpo-f-divergence forward_kl
refused "WPO's weights with aot's sorted pairs" "no loss is a pair's" train "${shape[@]}" --batch 8 --dpo-loss aot --dpo-wpo
refused "an ld_alpha above 1" "--dpo-ld-alpha" train "${shape[@]}" --batch 8 --dpo-ld-alpha 1.5
refused "--dpo-wpo without pairs" "--dpo-wpo: --data" train "${shape[@]}" --batch 8 --data "$dir/sft.jsonl" --dpo-wpo
echo "dpo equivalence: $passed passed, $failed failed"
[ "$failed" = 0 ]
