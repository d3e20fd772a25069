#!/bin/bash
# A mixture of experts (a Llama whose MLP is 4 SwiGLU experts, top 2, dropless) gives the losses of one process with
# the global batch over 20 AdamW steps, within 1e-6 relative, under DDP 2, ZeRO 1/2/3, PP 2 (GPipe, 1F1B), CP 2,
# DP 2 x PP 2 and recomputation (the routing is each token's own, so any split of the tokens or the layers computes
# the same sums), and with every expert chosen (no choice a rounding could flip) under micro-batches of one row;
# the balancing loss changes the losses and, recomputed, gives the same ones, and under DDP 2, ZeRO-2/3, EP 2, PP 2
# (every schedule) and CP 2 one process's; the router z-loss (under DDP 2, CP 2 and PP 2) and DeepSeek's shared
# experts under DDP 2 (and EP 2) give one process's; the sequence-wise balancing loss on both routers under DDP 2,
# ZeRO-2, EP 2, PP 2, CP 2 and TP 2 with SP gives one process's, and the global-batch loss (counted over the
# data-parallel ranks) under DDP 2, ZeRO-2, EP 2, CP 2 and TP 2 with SP one process's with the global batch; a
# checkpoint saved by ZeRO-2 at step
# 10 goes on under PP 2 as the uninterrupted run does; the HF folder it exports reads back with the
# same loss and decodes as the training forward does; the experts' load is in the metrics (a step's; an evaluation's,
# alike on every layout, leaving the steps' figures alone); bf16 under DDP 2 gives one
# process's; TP 2 with and without SP (the mixture whole on each rank) give one process's. What this build does not
# do is refused naming why.
# Qwen 2 MoE's folder from the fixtures (its balancing loss at its router_aux_loss_coef, 0.02) trains alike under DDP 2
# and PP 2, and exports; Qwen 3 MoE's under DDP 2, EP 2, PP 2 and TP 2 with SP, and exports and decodes. GPT-2 with GELU experts
# (gpt2_moe) under DDP 2, ZeRO-3, PP 2, TP 2 with SP, EP 2 and DP 2 x EP 2, and its decoder.
# usage: moe_equivalence.sh DTRAIN FIXTURES
set -u
DTRAIN=$1
. "$(dirname "$0")/finetune_checks.sh"
gpl_tokens
common=(--model llama-tiny --experts 4 --experts-top-k 2 --data "$dir/train.bin" --vocab 256 --layers 4 --channels 48 --heads 12
        --kv-heads 6 --ffn 32 --max-seq 64 --seq 64 --steps 20 --lr 1e-2 --threads 1)
run ref --batch 4
run ref2 --batch 2 --grad-accum 2
# A routing is a choice: where a token's k-th and (k+1)-th experts tie within rounding, arithmetic that rounds otherwise
# (micro-batches of another size; sums in another order) may choose the other expert and move the loss ~1e-5 (measured:
# 6.7e-6 against a micro-batch of 4 rows where DDP's are of 2, in a build with other flags). So each layout is held to
# the one process whose arithmetic it repeats: DDP 2 and ZeRO (rows of 2 a rank, the two gradients' mean: exactly one
# process's 2 micro-batches of 2, halved) against --batch 2 --grad-accum 2; where a layout's sums differ (CP's attention,
# 4 ranks' reductions) every expert is chosen (top-4 of 4) and there is no choice to flip.
run ddp --batch 2 --nproc 2 && close "DDP 2" "$dir/ref2.jsonl" "$dir/ddp.jsonl"
for z in 1 2 3; do run zero$z --batch 2 --nproc 2 --zero $z && close "ZeRO-$z on 2 ranks" "$dir/ref2.jsonl" "$dir/zero$z.jsonl"; done
for s in gpipe 1f1b; do
    run pp_$s --batch 2 --grad-accum 2 --nproc 2 --pp 2 --pp-schedule $s && close "PP 2, $s, 2 micro-batches" "$dir/ref2.jsonl" "$dir/pp_$s.jsonl"
done
run dense4 --batch 4 --experts-top-k 4
run dense_cp --batch 4 --nproc 2 --cp 2 --experts-top-k 4 &&
    close "top-4 of 4: CP 2 (each rank its chunks of every sequence, routed alone)" "$dir/dense4.jsonl" "$dir/dense_cp.jsonl"
run dense --batch 2 --grad-accum 2 --experts-top-k 4
run dense_dppp --batch 1 --grad-accum 2 --nproc 4 --pp 2 --experts-top-k 4 &&
    close "top-4 of 4: DP 2 x PP 2, micro-batches of 1 row" "$dir/dense.jsonl" "$dir/dense_dppp.jsonl"
run rc --batch 4 --recompute && close "recomputing (the routing made again)" "$dir/ref.jsonl" "$dir/rc.jsonl"
w=$(paste <(field loss "$dir/ref.jsonl") | awk 'NR==1{a=$1} {b=$1} END{print (b < a) ? 1 : 0}')
verdict "$w" "the loss falls over 20 steps ($(field loss "$dir/ref.jsonl" | head -1) -> $(field loss "$dir/ref.jsonl" | tail -1))"
n=$(field expert_load_max_mean "$dir/ddp.jsonl" | wc -l)
a=$(field expert_load_max_mean "$dir/ref2.jsonl" | tail -1) b=$(field expert_load_max_mean "$dir/ddp.jsonl" | tail -1)
[ "$n" = 20 ] && [ -n "$a" ] && [ "$a" = "$b" ] && ok=1 || ok=0
verdict $ok "the experts' load in every step's metrics, every rank's tokens counted (max/mean $a, DDP 2 $b)"
# the load over an evaluation's batches (the held-out text's, not one step's): a checkpoint near its start evaluated
# (--steps 0) on one process, DDP 2, PP 2, TP 2 and EP 2 gives the same figures to the last digit (each rank's rows
# counted, each stage its layers), and half the batches another; evaluating leaves the steps' load and losses alone
gm=(--model d6 --experts 4 --ffn 64 --data "$dir/train.bin" --vocab 256 --layers 4 --channels 48 --heads 4 --max-seq 64 --seq 64
    --threads 1 --batch 2)
"$DTRAIN" train "${gm[@]}" --quiet --steps 1 --lr 1e-4 --save "$dir/evck" > /dev/null 2>&1
vl=()
for lay in "one:--eval-batches 4" "ddp:--nproc 2 --eval-batches 2" "pp:--nproc 2 --pp 2 --eval-batches 4" "tp:--nproc 2 --tp 2 --eval-batches 4" \
           "ep:--nproc 2 --ep 2 --eval-batches 2" "half:--eval-batches 2"; do
    # shellcheck disable=SC2086
    "$DTRAIN" train --data "$dir/train.bin" --vocab 256 --max-seq 64 --seq 64 --threads 1 --batch 2 --model "$dir/evck" --steps 0 \
        --val-data "$dir/train.bin" ${lay#*:} > "$dir/ev.out" 2>&1
    vl+=("${lay%%:*} $(grep -o "worst layer [0-9.]*, layers' average [0-9.]*" "$dir/ev.out" | sed "s/worst layer //; s/, layers' average /\//")")
done
one=${vl[0]#one } ok=1
for v in "${vl[@]:1:4}"; do [ "${v#* }" = "$one" ] || ok=0; done
[ -n "$one" ] && [ "$one" != "${vl[5]#half }" ] || ok=0
verdict $ok "the experts' load over an evaluation's batches (worst, average): $(printf '%s; ' "${vl[@]}")"
run ev --batch 2 --grad-accum 2 --val-data "$dir/train.bin" --eval-every 5 --eval-batches 2
n=$(field val_expert_load_max_mean "$dir/ev.jsonl" | wc -l)
[ "$n" = 4 ] && [ "$(field loss "$dir/ev.jsonl")" = "$(field loss "$dir/ref2.jsonl")" ] &&
    [ "$(field expert_load_max_mean "$dir/ev.jsonl")" = "$(field expert_load_max_mean "$dir/ref2.jsonl")" ] && ok=1 || ok=0
verdict $ok "4 evaluations in 20 steps: their load in the metrics ($n), the steps' load and losses as without them"
"$DTRAIN" train "${gm[@]}" --nproc 2 --ep 2 --steps 4 --quiet --metrics "$dir/epa.jsonl" > /dev/null 2>&1
"$DTRAIN" train "${gm[@]}" --nproc 2 --ep 2 --steps 4 --quiet --val-data "$dir/train.bin" --eval-every 2 --eval-batches 2 \
    --metrics "$dir/epb.jsonl" > /dev/null 2>&1
a=$(field expert_exchange_bytes "$dir/epa.jsonl" | paste -sd' ') b=$(field expert_exchange_bytes "$dir/epb.jsonl" | paste -sd' ')
[ "$(echo "$a" | wc -w)" = 4 ] && [ "$a" = "$b" ] && ok=1 || ok=0
verdict $ok "EP 2: an evaluation's exchanges are not the next step's bytes (with evaluations at 2 and 4: $b; without: $a)"
# the balancing loss: part of the loss, its gradient through every layer's router; recomputation the same
run aux --batch 4 --moe-aux-loss 0.05
run auxrc --batch 4 --moe-aux-loss 0.05 --recompute && close "balancing loss 0.05, recomputing" "$dir/aux.jsonl" "$dir/auxrc.jsonl"
d=$(paste <(field loss "$dir/ref.jsonl") <(field loss "$dir/aux.jsonl") | awk '$2 > $1' | wc -l)
[ "$d" -ge 15 ] && ok=1 || ok=0
verdict $ok "the balancing loss adds to the loss ($d of 20 steps above the run without it)"
# DeepSeek's ungated shared experts (--shared-experts 2: one MLP of 2 x --ffn every token goes through): DDP 2 and EP 2
# give one process's losses; dtrain's checkpoints keep them (no Hugging Face folder with Llama's attention)
run dsref --batch 2 --grad-accum 2 --shared-experts 2 --experts-top-k 4
run dsddp --batch 2 --nproc 2 --shared-experts 2 --experts-top-k 4 && close "top-4 of 4, 2 shared experts: DDP 2" "$dir/dsref.jsonl" "$dir/dsddp.jsonl"
run dsep --batch 2 --nproc 2 --ep 2 --shared-experts 2 --experts-top-k 4 && close "top-4 of 4, 2 shared experts: EP 2" "$dir/dsref.jsonl" "$dir/dsep.jsonl"
"$DTRAIN" train "${common[@]}" --quiet --batch 2 --steps 2 --shared-experts 2 --save "$dir/dsck" > /dev/null 2>&1
refused "a DeepSeek mixture exported as a Hugging Face folder" "dtrain's checkpoint keeps it" ckpt export "$dir/dsck" "$dir/dshf"
# the router z-loss: each rank's mean over its rows of every layer's squared log-sum-exp, averaged over the ranks as the
# loss is: DDP 2 gives one process's losses; it adds to the loss from the first step
run zref --batch 2 --grad-accum 2 --moe-z-loss 0.01
run zddp --batch 2 --nproc 2 --moe-z-loss 0.01 && close "router z-loss 0.01: DDP 2" "$dir/zref.jsonl" "$dir/zddp.jsonl"
d=$(paste <(field loss "$dir/ref2.jsonl") <(field loss "$dir/zref.jsonl") | head -1 | awk '{print $2 - $1}')
awk -v d="$d" 'BEGIN{exit !(d > 0)}' && ok=1 || ok=0
verdict $ok "the z-loss adds to the first step's loss (+$d)"
refused "the z-loss on the sigmoid router" "a softmax router's" train "${common[@]}" --batch 2 --steps 1 --moe-z-loss 0.01 --router sigmoid-bias
# under CP 2 each rank's mean over its rows, averaged as the loss is (every expert chosen: CP's attention sums in
# another order)
run dense4z --batch 4 --experts-top-k 4 --moe-z-loss 0.01
run dense_cpz --batch 4 --nproc 2 --cp 2 --experts-top-k 4 --moe-z-loss 0.01 &&
    close "top-4 of 4, router z-loss 0.01: CP 2" "$dir/dense4z.jsonl" "$dir/dense_cpz.jsonl"
run zpp --batch 2 --grad-accum 2 --nproc 2 --pp 2 --moe-z-loss 0.01 && close "router z-loss 0.01: PP 2 (the stages' sums added)" "$dir/zref.jsonl" "$dir/zpp.jsonl"
# DeepSeek-V3's router (sigmoid scores, 2 groups of which the best 1; the bias moved by every step's load, counted over
# every rank): the layouts move it alike; saved at step 10 (the bias in the checkpoint) and resumed, as uninterrupted.
# A group is chosen by a sum of scores, where micro-batches of 4 rows and of 2 round differently enough to flip a
# near tie (measured: the loss 2e-5 apart from step 2): the reference is one process with micro-batches of 2 rows.
sg=(--router sigmoid-bias --expert-groups 2 --group-top-k 1 --routed-scale 2 --bias-update 0.01)
run sref2 --batch 2 --grad-accum 2 "${sg[@]}"
run sddp --batch 2 --nproc 2 "${sg[@]}" && close "sigmoid router with its bias: DDP 2" "$dir/sref2.jsonl" "$dir/sddp.jsonl"
run spp --batch 2 --grad-accum 2 --nproc 2 --pp 2 "${sg[@]}" && close "sigmoid router with its bias: PP 2 (each stage its layers' load)" "$dir/sref2.jsonl" "$dir/spp.jsonl"
if "$DTRAIN" train "${common[@]}" "${sg[@]}" --quiet --steps 10 --batch 2 --nproc 2 --save "$dir/sck" --metrics "$dir/sa.jsonl" > "$dir/sa.out" 2>&1 &&
   "$DTRAIN" train "${common[@]}" "${sg[@]}" --quiet --batch 2 --grad-accum 2 --resume "$dir/sck" --metrics "$dir/sb.jsonl" > "$dir/sb.out" 2>&1; then
    w=$(worst <(cat "$dir/sa.jsonl" "$dir/sb.jsonl") "$dir/sref2.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ls "$dir"/sck/step-*/buffers.f32 > /dev/null 2>&1 && ok=1 || ok=0
    verdict $ok "sigmoid router: saved by DDP 2 at step 10 (buffers.f32: the bias), resumed on one process: worst $w"
else
    failed=$((failed + 1)); echo "FAIL sigmoid save or resume"; tail -3 "$dir/sa.out" "$dir/sb.out"
fi
# the bias balances: 40 steps at a gentler rate, the load over the last 10 against the same router with its bias still
load() { field expert_load_max_mean_avg "$1" | tail -10 | awk '{s+=$1} END{printf "%.3f", s/NR}'; }
run bal --batch 4 --steps 40 --lr 2e-3 --router sigmoid-bias --bias-update 0.02 && run still --batch 4 --steps 40 --lr 2e-3 --router sigmoid-bias --bias-update 0
a=$(load "$dir/bal.jsonl") b=$(load "$dir/still.jsonl")
awk -v a="$a" -v b="$b" 'BEGIN{exit !(a + 0.1 < b)}' && ok=1 || ok=0
verdict $ok "the bias balances: load max/mean (the layers' average, last 10 of 40 steps) $a, with the bias still $b"
refused "the sigmoid router's settings without it" "give --router sigmoid-bias" train "${common[@]}" --batch 4 --steps 1 --bias-update 0.01
# a capacity (each expert its even share of a micro-batch's choices on a rank; the rest dropped by weight): the drops in
# every step's metrics, and recomputation drops the same choices again
run cap --batch 4 --capacity-factor 1
run caprc --batch 4 --capacity-factor 1 --recompute && close "capacity 1, recomputing (the same drops)" "$dir/cap.jsonl" "$dir/caprc.jsonl"
dr=$(field expert_choices_dropped "$dir/cap.jsonl" | tail -1)
n=$(field expert_choices_dropped "$dir/cap.jsonl" | wc -l)
[ "$n" = 20 ] && awk -v d="$dr" 'BEGIN{exit !(d > 0 && d < 1)}' && ok=1 || ok=0
verdict $ok "capacity 1: the share of choices dropped in every step's metrics (step 20: $dr)"
refused "a capacity factor of 0" "a number above 0" train "${common[@]}" --batch 4 --steps 1 --capacity-factor 0
refused "a sigmoid router exported as a Hugging Face folder" "has no Mixtral or Qwen 2 MoE folder" ckpt export "$dir/sck" "$dir/shf"
refused "groups that do not divide the experts" "the groups must divide the experts" train "${common[@]}" --batch 4 --steps 1 --router sigmoid-bias --expert-groups 3
# saved by ZeRO-2 at step 10, resumed by PP 2
if "$DTRAIN" train "${common[@]}" --quiet --steps 10 --batch 1 --grad-accum 2 --nproc 2 --zero 2 --experts-top-k 4 --save "$dir/ck" \
       --metrics "$dir/a.jsonl" > "$dir/a.out" 2>&1 &&
   "$DTRAIN" train "${common[@]}" --quiet --batch 2 --grad-accum 2 --nproc 2 --pp 2 --experts-top-k 4 --resume "$dir/ck" --metrics "$dir/b.jsonl" > "$dir/b.out" 2>&1; then
    w=$(worst <(cat "$dir/a.jsonl" "$dir/b.jsonl") "$dir/dense.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ok=1 || ok=0
    verdict $ok "saved by ZeRO-2 at step 10, resumed by PP 2: worst relative loss difference $w"
else
    failed=$((failed + 1)); echo "FAIL save or resume"; tail -3 "$dir/a.out" "$dir/b.out"
fi
# the weights as a Hugging Face folder (MixtralForCausalLM's names and config), read back: the same validation loss
ev() { "$DTRAIN" eval "$@" --data "$dir/train.bin" --val-data "$dir/train.bin" --seq 64 --batch 4 --eval-batches 2 2>&1 | grep -o "validation loss [0-9.]*"; }
if "$DTRAIN" ckpt export "$dir/ck" "$dir/hf" > "$dir/export.out" 2>&1; then
    a=$(ev --model "$dir/ck") b=$(ev --model "$dir/hf")
    grep -q '"model_type":[[:space:]]*"mixtral"' "$dir/hf/config.json" && [ -n "$a" ] && [ "$a" = "$b" ] && ok=1 || ok=0
    verdict $ok "ckpt export writes Mixtral's folder, which reads back: $b (the checkpoint: $a)"
else
    failed=$((failed + 1)); echo "FAIL ckpt export: $(tail -1 "$dir/export.out")"
fi
# Qwen 2 MoE's folder (a shared expert beside the routed ones, q/k/v biases, weights not renormalised), trained on
# digits (its vocabulary is 101): DDP 2 and PP 2 give one process's losses; its checkpoint exports as Qwen 2 MoE's folder
FIX=$2
seq 1 40000 | tr '\n' ' ' > "$dir/digits"
"$DTRAIN" tokenize --bytes "$dir/digits" "$dir/digits.bin" > /dev/null
q=(--model "$FIX/moe/qwen2_moe" --data "$dir/digits.bin" --seq 16 --steps 20 --lr 1e-3 --threads 1 --quiet)
qrun() { local name=$1; shift; "$DTRAIN" train "${q[@]}" "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 ||
    { failed=$((failed + 1)); echo "FAIL $name: $*"; tail -3 "$dir/$name.out"; return 1; }; }
qrun qref --batch 4 && qrun qref2 --batch 2 --grad-accum 2
qrun qddp --batch 2 --nproc 2 && close "Qwen 2 MoE's folder: DDP 2" "$dir/qref2.jsonl" "$dir/qddp.jsonl"
qrun qpp --batch 2 --grad-accum 2 --nproc 2 --pp 2 && close "Qwen 2 MoE's folder: PP 2" "$dir/qref2.jsonl" "$dir/qpp.jsonl"
# TP 2 (with SP): attention and the shared expert split (its gate and up by hidden units, its down by inputs: partial sums
# summed over the group), the routed experts whole on each rank; and the folder with dense layers (mlp_only_layers [0],
# decoder_sparse_step 2), whose dense MLPs split as Llama's
qrun qtp --batch 4 --nproc 2 --tp 2 && close "Qwen 2 MoE's folder: TP 2 (the shared expert split)" "$dir/qref.jsonl" "$dir/qtp.jsonl"
qrun qtpsp --batch 4 --nproc 2 --tp 2 --sp && close "Qwen 2 MoE's folder: TP 2 with SP" "$dir/qref.jsonl" "$dir/qtpsp.jsonl"
qrun qdref --model "$FIX/moe/qwen2_moe_dense" --batch 4
qrun qdtpsp --model "$FIX/moe/qwen2_moe_dense" --batch 4 --nproc 2 --tp 2 --sp &&
    close "Qwen 2 MoE's folder with dense layers 0 and 2: TP 2 with SP" "$dir/qdref.jsonl" "$dir/qdtpsp.jsonl"
if "$DTRAIN" train "${q[@]}" --batch 4 --steps 5 --save "$dir/qck" > /dev/null 2>&1 && "$DTRAIN" ckpt export "$dir/qck" "$dir/qhf" > /dev/null 2>&1; then
    qev() { "$DTRAIN" eval --model "$1" --data "$dir/digits.bin" --val-data "$dir/digits.bin" --seq 16 --batch 4 --eval-batches 2 2>&1 | grep -o "validation loss [0-9.]*"; }
    a=$(qev "$dir/qck") b=$(qev "$dir/qhf")
    grep -q '"model_type":[[:space:]]*"qwen2_moe"' "$dir/qhf/config.json" && [ -n "$a" ] && [ "$a" = "$b" ] && ok=1 || ok=0
    verdict $ok "Qwen 2 MoE: ckpt export writes its folder, which reads back: $b (the checkpoint: $a)"
else
    failed=$((failed + 1)); echo "FAIL Qwen 2 MoE save or export"
fi
# Qwen 3 MoE's folder (each head's queries and keys normed, heads of 16 wider than C / heads, layer 0 dense, weights
# renormalised, no shared expert): DDP 2, EP 2 and PP 2 give one process's losses, TP 2 with SP too (the head norms'
# weights summed over the group); its checkpoint exports as Qwen 3 MoE's folder and decodes as its training forward does
q3=(--model "$FIX/moe/qwen3_moe" --data "$dir/digits.bin" --seq 16 --steps 20 --lr 1e-3 --threads 1 --quiet)
q3run() { local name=$1; shift; "$DTRAIN" train "${q3[@]}" "$@" --metrics "$dir/$name.jsonl" > "$dir/$name.out" 2>&1 ||
    { failed=$((failed + 1)); echo "FAIL $name: $*"; tail -3 "$dir/$name.out"; return 1; }; }
q3run q3ref --batch 4 && q3run q3ref2 --batch 2 --grad-accum 2
for l in "ddp:--batch 2 --nproc 2" "ep:--batch 2 --nproc 2 --ep 2" "pp:--batch 2 --grad-accum 2 --nproc 2 --pp 2"; do
    q3run "q3${l%%:*}" ${l#*:} && close "Qwen 3 MoE's folder: ${l#*:}" "$dir/q3ref2.jsonl" "$dir/q3${l%%:*}.jsonl"
done
q3run q3tpsp --batch 4 --nproc 2 --tp 2 --sp && close "Qwen 3 MoE's folder: TP 2 with SP" "$dir/q3ref.jsonl" "$dir/q3tpsp.jsonl"
if "$DTRAIN" train "${q3[@]}" --batch 4 --steps 5 --save "$dir/q3ck" > /dev/null 2>&1 && "$DTRAIN" ckpt export "$dir/q3ck" "$dir/q3hf" > /dev/null 2>&1; then
    a=$(qev "$dir/q3ck") b=$(qev "$dir/q3hf")
    grep -q '"model_type":[[:space:]]*"qwen3_moe"' "$dir/q3hf/config.json" && [ -n "$a" ] && [ "$a" = "$b" ] && ok=1 || ok=0
    verdict $ok "Qwen 3 MoE: ckpt export writes its folder, which reads back: $b (the checkpoint: $a)"
    a=$("$DTRAIN" generate --model "$dir/q3hf" --ids --prompt 1,2,3 --tokens 12 2>&1) b=$("$DTRAIN" generate --model "$dir/q3hf" --ids --prompt 1,2,3 --tokens 12 --no-cache 2>&1)
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo "$a" | wc -w)" = 13 ] && ok=1 || ok=0
    verdict $ok "generate on Qwen 3 MoE's folder: the cached decoder's 12 greedy tokens are the training forward's ($a)"
else
    failed=$((failed + 1)); echo "FAIL Qwen 3 MoE save or export"
fi
"$DTRAIN" train --model qwen3-tiny --experts 4 --data "$dir/train.bin" --vocab 256 --layers 2 --seq 32 --batch 2 --steps 1 --threads 1 2>&1 |
    grep -q "(qwen3_moe)" && ok=1 || ok=0
verdict $ok "--experts on a Qwen 3 makes the qwen3_moe family"
# TP 2: attention split over the group, the mixture whole on each rank (its input is the whole stream there; its
# gradients, and its balancing loss, the same on each). The row-parallel sums round apart from one process's, so a
# top-2 choice may flip (measured 1.3e-6, and 6.7e-6 under DP 2 x TP 2): every expert is chosen, as for CP
run tp2 --batch 4 --nproc 2 --tp 2 --experts-top-k 4 && close "top-4 of 4: TP 2 (the experts whole on each rank)" "$dir/dense4.jsonl" "$dir/tp2.jsonl"
run aux4 --batch 4 --experts-top-k 4 --moe-aux-loss 0.05
run tp2aux --batch 4 --nproc 2 --tp 2 --experts-top-k 4 --moe-aux-loss 0.05 && close "top-4 of 4: TP 2, balancing loss 0.05" "$dir/aux4.jsonl" "$dir/tp2aux.jsonl"
run dptp --batch 2 --nproc 4 --tp 2 --experts-top-k 4 && close "top-4 of 4: DP 2 x TP 2" "$dir/dense.jsonl" "$dir/dptp.jsonl"
# TP 2's checkpoint at step 10 goes on in one process from --resume alone (the mixture's shape from its manifest)
run tpck --batch 4 --nproc 2 --tp 2 --experts-top-k 4 --save "$dir/tpck" --stop-after 10 &&
    "$DTRAIN" train --resume "$dir/tpck" --quiet --metrics "$dir/tpres.jsonl" > "$dir/tpres.out" 2>&1
w=$(paste <(field loss "$dir/dense4.jsonl" | tail -10) <(field loss "$dir/tpres.jsonl") |
    awk 'BEGIN{w=0; n=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=10) print "missing"; else print w}')
[ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ok=1 || ok=0
verdict $ok "TP 2's checkpoint resumed by one process (--resume alone): steps 11-20 within $w of the uninterrupted run's $(tail -1 "$dir/tpres.out" | cut -c1-80)"
# SP: the stream's rows split over the TP group; the mixture gathers them, runs whole on each rank and keeps its own
# rows (Megatron's way), so its routing, gradients and balancing loss are TP 2's (top-4, as TP 2's: top-2 measured 2.2e-7 here, under the
# 1.3e-6 TP 2 once measured): the balancing loss,
# recomputation, DP 2 x TP 2
run tp2sp --batch 4 --nproc 2 --tp 2 --sp --experts-top-k 4 && close "top-4 of 4: TP 2 with SP (the rows gathered for the mixture)" "$dir/dense4.jsonl" "$dir/tp2sp.jsonl"
run tp2spaux --batch 4 --nproc 2 --tp 2 --sp --experts-top-k 4 --moe-aux-loss 0.05 &&
    close "top-4 of 4: TP 2 with SP, balancing loss 0.05" "$dir/aux4.jsonl" "$dir/tp2spaux.jsonl"
run tp2sprc --batch 4 --nproc 2 --tp 2 --sp --experts-top-k 4 --recompute && close "top-4 of 4: TP 2 with SP, recomputing" "$dir/dense4.jsonl" "$dir/tp2sprc.jsonl"
run dptpsp --batch 2 --nproc 4 --tp 2 --sp --experts-top-k 4 && close "top-4 of 4: DP 2 x TP 2 with SP" "$dir/dense.jsonl" "$dir/dptpsp.jsonl"
run dstpsp --batch 2 --grad-accum 2 --nproc 2 --tp 2 --sp --shared-experts 2 --experts-top-k 4 &&
    close "top-4 of 4, 2 shared experts: TP 2 with SP (the shared experts split)" "$dir/dsref.jsonl" "$dir/dstpsp.jsonl"
# bf16 (autocast's rounding points in the router and the experts, each use's weight gradient rounded): the losses stay
# within 5% of f32's (measured 1.3-1.4%) and are not f32's; DDP 2 near one process's 2 micro-batches, 1e-4 at lr 1e-3 as mixed precision's
# data parallelism is held elsewhere (a dense llama-tiny's bf16 DDP 2 parts from one process by 7e-3 at lr 1e-2 too)
run bf2 --batch 2 --grad-accum 2 --precision bf16
w=$(worst "$dir/ref2.jsonl" "$dir/bf2.jsonl")
[ "$w" != missing ] && awk "BEGIN{exit !($w > 0 && $w <= 5e-2)}" && ok=1 || ok=0
verdict $ok "bf16 against f32 (the same 2 micro-batches): worst relative loss difference over 20 steps $w (rounded, and within 5%)"
run bf2s --batch 2 --grad-accum 2 --precision bf16 --lr 1e-3
run bfddp --batch 2 --nproc 2 --precision bf16 --lr 1e-3
w=$(worst "$dir/bf2s.jsonl" "$dir/bfddp.jsonl")
[ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-4)}" && ok=1 || ok=0
verdict $ok "bf16, DDP 2 against one process (lr 1e-3): worst relative loss difference over 20 steps $w (held to 1e-4)"
run bfpp --batch 2 --grad-accum 2 --nproc 2 --pp 2 --precision bf16 --lr 1e-3 && close "bf16, PP 2 (1F1B)" "$dir/bf2s.jsonl" "$dir/bfpp.jsonl"
# the balancing loss under data parallelism: each rank's over its own micro-batch, as one process's over each of its
# micro-batches (DDP's and Hugging Face's); EP 2 runs the experts' rows in another order (4.4e-7 without the loss,
# 1.5e-6 with it, on a Zen 3)
run auxref --batch 2 --grad-accum 2 --moe-aux-loss 0.05
for l in "ddp:--nproc 2" "zero2:--nproc 2 --zero 2" "zero3:--nproc 2 --zero 3"; do
    run "aux_${l%%:*}" --batch 2 --moe-aux-loss 0.05 ${l#*:} && close "balancing loss 0.05: ${l#*:}" "$dir/auxref.jsonl" "$dir/aux_${l%%:*}.jsonl"
done
if run aux_ep --batch 2 --nproc 2 --ep 2 --moe-aux-loss 0.05; then
    w=$(worst "$dir/auxref.jsonl" "$dir/aux_ep.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-5)}" && ok=1 || ok=0
    verdict $ok "balancing loss 0.05: EP 2 within $w of one process over 20 steps (held to 1e-5)"
fi
# over pipeline stages each stage's layers' sums are added over the stages before the head's loss and the routers'
# backward take them (a nonblocking sum posted after each micro-batch's forward): every schedule gives one process's
for s in 1f1b gpipe interleaved zb1; do
    run "aux_pp_$s" --batch 2 --grad-accum 2 --nproc 2 --pp 2 --pp-schedule $s --moe-aux-loss 0.05 &&
        close "balancing loss 0.05: PP 2, $s" "$dir/auxref.jsonl" "$dir/aux_pp_$s.jsonl"
done
run aux_pp_rc --batch 2 --grad-accum 2 --nproc 2 --pp 2 --moe-aux-loss 0.05 --recompute &&
    close "balancing loss 0.05: PP 2, recomputing" "$dir/auxref.jsonl" "$dir/aux_pp_rc.jsonl"
# over CP 2 the ranks' rows' sums likewise, each rank's gradient over its share of the rows (CP averages them): equal
# to one process until a routing near a tie flips under CP's other attention sums, and at this rate the trajectories
# then part (3.1e-5 by step 20 on a Zen 3; on a Zen 4 3.3e-5 at step 13, 2.3e-4 at step 16, after the loss's spike at
# step 15; 6.7e-6 without the loss); the gradient over all the rows: 2% apart
run auxref4 --batch 4 --moe-aux-loss 0.05
if run aux_cp --batch 4 --nproc 2 --cp 2 --moe-aux-loss 0.05; then
    w=$(worst "$dir/auxref4.jsonl" "$dir/aux_cp.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-3)}" && ok=1 || ok=0
    verdict $ok "balancing loss 0.05: CP 2 within $w of one process over 20 steps (held to 1e-3)"
fi
# the sequence-wise balancing loss (DeepSeek-V3's complementary one, here on its sigmoid router): a sequence's
# statistics are its own, so every split of the sequences gives one process's; PP 2 adds each stage's layers' losses
# (their counts summed over the stages: without, 6% apart), CP 2 each sequence's counts over its ranks' rows (without,
# 1.2%; each rank's gradient not over its share of the rows, 5%), TP 2 and SP run the mixture on every row
sq=(--router sigmoid-bias --moe-seq-aux-loss 0.1)
run sqref --batch 2 --grad-accum 2 "${sq[@]}"
run sqref4 --batch 4 "${sq[@]}" && close "sequence-wise loss 0.1: micro-batches of 4 rows against 2 of 2" "$dir/sqref.jsonl" "$dir/sqref4.jsonl"
for l in "ddp:--batch 2 --nproc 2" "zero2:--batch 2 --nproc 2 --zero 2" "ep:--batch 2 --nproc 2 --ep 2" "pp:--batch 2 --grad-accum 2 --nproc 2 --pp 2"; do
    run "sq_${l%%:*}" "${sq[@]}" ${l#*:} && close "sequence-wise loss 0.1: ${l#*:}" "$dir/sqref.jsonl" "$dir/sq_${l%%:*}.jsonl"
done
# (CP 2 held to 1e-5: on a Zen 4 one step's forward differed by 1.2e-6, a routing near a tie turned by CP's attention
# sums, and the steps after it were one process's again)
run sq_cp --batch 4 "${sq[@]}" --nproc 2 --cp 2 && close "sequence-wise loss 0.1: --batch 4 --nproc 2 --cp 2" "$dir/sqref4.jsonl" "$dir/sq_cp.jsonl" 1e-5
run sq_tpsp --batch 4 "${sq[@]}" --nproc 2 --tp 2 --sp && close "sequence-wise loss 0.1: --batch 4 --nproc 2 --tp 2 --sp" "$dir/sqref4.jsonl" "$dir/sq_tpsp.jsonl"
a=$(field moe_seq_aux_loss "$dir/sqref.jsonl" | head -1) b=$(field moe_seq_aux_loss "$dir/sq_pp.jsonl" | head -1)
c=$(field moe_seq_aux_loss "$dir/sq_cp.jsonl" | head -1) n=$(field moe_seq_aux_loss "$dir/ref2.jsonl" | wc -l)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ "$n" = 0 ] && ok=1 || ok=0
verdict $ok "the sequence-wise loss's value in each step's metrics, the first step's alike on one process, PP 2 and CP 2 ($a, $b, $c; none without the loss)"
run sqsoft --batch 2 --grad-accum 2 --moe-seq-aux-loss 0.1
run sqsoft_pp --batch 2 --grad-accum 2 --nproc 2 --pp 2 --moe-seq-aux-loss 0.1 &&
    close "sequence-wise loss 0.1 on the softmax router: PP 2" "$dir/sqsoft.jsonl" "$dir/sqsoft_pp.jsonl"
d=$(paste <(field loss "$dir/ref2.jsonl") <(field loss "$dir/sqsoft.jsonl") | head -1 | awk '{print $2 - $1}')
awk -v d="$d" 'BEGIN{exit !(d > 0.3 && d < 0.5)}' && ok=1 || ok=0
verdict $ok "the sequence-wise loss adds about 0.1 x 4 layers x 1 to the first step's loss (+$d)"
# the global-batch balancing loss (Megatron's global_aux_loss): each layer's shares counted over every data-parallel
# rank's micro-batch of the same index (a communicator of one tensor-parallel place) and over the step's micro-batches
# so far, the probabilities over the rank's own rows, the ranks' gradients averaged: DDP 2, ZeRO-2, EP 2, CP 2 and TP 2
# with SP give one process with the global batch in one micro-batch; PP 2 one process with the same micro-batches
run glref4 --batch 4 --moe-global-aux-loss 0.1
for l in "ddp:--batch 2 --nproc 2" "zero2:--batch 2 --nproc 2 --zero 2" "ep:--batch 2 --nproc 2 --ep 2" "cp:--batch 4 --nproc 2 --cp 2" \
         "tpsp:--batch 4 --nproc 2 --tp 2 --sp"; do
    run "gl_${l%%:*}" --moe-global-aux-loss 0.1 ${l#*:} && close "global-batch loss 0.1: ${l#*:}" "$dir/glref4.jsonl" "$dir/gl_${l%%:*}.jsonl"
done
run glref --batch 2 --grad-accum 2 --moe-global-aux-loss 0.1
for s in 1f1b interleaved zb1; do
    run "gl_pp_$s" --batch 2 --grad-accum 2 --nproc 2 --pp 2 --pp-schedule $s --moe-global-aux-loss 0.1 &&
        close "global-batch loss 0.1: PP 2, $s, 2 micro-batches" "$dir/glref.jsonl" "$dir/gl_pp_$s.jsonl"
done
refused "the sequence-wise loss without experts" "the model has no experts" train --model llama-tiny --data "$dir/train.bin" --vocab 256 \
    --layers 2 --channels 48 --heads 12 --kv-heads 6 --max-seq 64 --seq 64 --batch 2 --steps 1 --moe-seq-aux-loss 0.1
# GPT-2 with GELU experts (gpt2_moe: --experts on a GPT-2 replaces its MLP by E experts of up and down, no gate): the
# same layouts give one process's losses (lr 3e-3: at 1e-2 its 48 channels amplify a last bit into 1e-5 by step 15,
# measured; here DDP 2 and EP 2 are bit for bit), its checkpoint decodes as its training forward does, and it has no
# Hugging Face folder, weights file or GGUF (each refused by name: the checkpoint keeps it)
gcommon=(--model d6 --experts 4 --experts-top-k 2 --data "$dir/train.bin" --vocab 256 --layers 2 --channels 48 --heads 4 --ffn 32
         --max-seq 64 --seq 64 --steps 20 --lr 3e-3 --threads 1)
keep=("${common[@]}")
common=("${gcommon[@]}")
run g_one --batch 2
run g_ref2 --batch 2 --grad-accum 2 --save "$dir/gck"
run g_ddp --batch 2 --nproc 2 && close "GELU experts (gpt2_moe): DDP 2" "$dir/g_ref2.jsonl" "$dir/g_ddp.jsonl"
run g_z3 --batch 2 --nproc 2 --zero 3 && close "GELU experts: ZeRO-3 on 2 ranks" "$dir/g_ref2.jsonl" "$dir/g_z3.jsonl"
run g_pp --batch 2 --grad-accum 2 --nproc 2 --pp 2 && close "GELU experts: PP 2 (1F1B)" "$dir/g_ref2.jsonl" "$dir/g_pp.jsonl"
run g_tp --batch 2 --nproc 2 --tp 2 --sp && close "GELU experts: TP 2 with SP (the mixture whole on each rank)" "$dir/g_one.jsonl" "$dir/g_tp.jsonl"
run g_d4 --batch 2 --grad-accum 2 --experts-top-k 4
run g_ep --batch 2 --nproc 2 --ep 2 --experts-top-k 4 && close "GELU experts, top-4 of 4: EP 2" "$dir/g_d4.jsonl" "$dir/g_ep.jsonl"
run g_d1 --batch 1 --grad-accum 4 --experts-top-k 4
run g_dpep --batch 1 --nproc 4 --ep 2 --experts-top-k 4 && close "GELU experts, top-4 of 4: DP 2 x EP 2" "$dir/g_d1.jsonl" "$dir/g_dpep.jsonl"
"$DTRAIN" train "${gcommon[@]}" --batch 2 --steps 1 2>&1 | grep -q "(gpt2_moe)" && ok=1 || ok=0
verdict $ok "--experts on a GPT-2 makes the gpt2_moe family"
a=$("$DTRAIN" generate --model "$dir/gck" --ids --prompt 1,2,3 --tokens 12 2>&1) b=$("$DTRAIN" generate --model "$dir/gck" --ids --prompt 1,2,3 --tokens 12 --no-cache 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo "$a" | wc -w)" = 13 ] && ok=1 || ok=0
verdict $ok "generate on the GELU experts' checkpoint: the cached decoder's 12 greedy tokens are the training forward's ($a)"
refused "GPT-2's GELU experts exported as a Hugging Face folder" "has no Hugging Face architecture" ckpt export "$dir/gck" "$dir/ghf"
refused "GPT-2's GELU experts exported as a weights file" "has no weights-file format" ckpt export "$dir/gck" "$dir/g.safetensors"
refused "GPT-2's GELU experts exported as a GGUF" "GGUF export of the gpt2_moe family" ckpt export "$dir/gck" "$dir/g.gguf"
# a weights file that cannot hold the family is refused before the first step, not when the run ends and saves
for w in "g2.safetensors:has no weights-file format" "g2.bin:llm.c's files hold GPT-2, not gpt2_moe"; do
    out=$("$DTRAIN" train "${gcommon[@]}" --batch 2 --save "$dir/${w%%:*}" 2>&1)
    [ $? != 0 ] && echo "$out" | grep -q -- "${w#*:}" && ! echo "$out" | grep -q "^step" && [ ! -e "$dir/${w%%:*}" ] && ok=1 || ok=0
    verdict $ok "train --save ${w%%:*} with GELU experts: refused before the first step ($(echo "$out" | grep -m1 error | cut -c1-110))"
done
common=("${keep[@]}")
refused "top-k above the experts" "top-5 routing among 4 experts" train "${common[@]}" --batch 4 --experts-top-k 5 --steps 1
# served: the decoder's cached steps (each row routed alone) choose the tokens the training forward does (--no-cache)
a=$("$DTRAIN" generate --model "$dir/hf" --ids --prompt 1,2,3 --tokens 12 2>&1) b=$("$DTRAIN" generate --model "$dir/hf" --ids --prompt 1,2,3 --tokens 12 --no-cache 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo "$a" | wc -w)" = 13 ] && ok=1 || ok=0
verdict $ok "generate on Mixtral's folder: the cached decoder's 12 greedy tokens are the training forward's ($a)"
echo "moe equivalence: $passed passed, $failed failed"
[ "$failed" = 0 ]
