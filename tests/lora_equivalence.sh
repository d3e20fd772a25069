#!/bin/bash
# LoRA (rank 4 on a Llama's q_proj, v_proj and down_proj, the base frozen) gives the losses of one process with the
# global batch over 20 AdamW steps, within 1e-6 relative, under DDP 2, ZeRO 1/2/3, PP 2 with GPipe, 1F1B and ZB-H1,
# recomputation, TP 2 and 3 (each adapter split as its Linear), sequence parallelism, DP 2 x TP 2 with ZeRO-2, and a
# clipped GPT-2 under TP 2 (its norms too); with dropout 0.2 under DDP 2, ZeRO-3, TP 2 + SP, PP 2, CP 2 and
# recomputation, and saved and resumed across layouts (evaluation drops nothing); the checkpoint holds the adapters alone (their bytes), one saved under PP 2 at step 10 goes on
# under ZeRO-2 on 2 ranks as the uninterrupted run does, and --resume DIR alone goes on with its adapters. The
# checkpoint directory holds PEFT's adapter folder: eval --lora on the base = ckpt merge's folder (not the base alone)
# and the same under TP 2 (each rank its slices of the folder's adapters),
# and generate --lora decodes the merged model's tokens. What cannot be is refused naming why: a checkpoint of
# adapters loaded as a model, resumed with other adapters, merged into a base of another shape; tensor parallelism;
# targets that match no Linear.
# usage: lora_equivalence.sh DTRAIN
set -u
DTRAIN=$1
. "$(dirname "$0")/finetune_checks.sh"
gpl_tokens
lora=(--lora-rank 4 --lora-alpha 16 --lora-targets q_proj,v_proj,down_proj)
common=(--model llama-tiny --data "$dir/train.bin" --vocab 256 --layers 4 --channels 48 --heads 12 --kv-heads 6 --ffn 96 --max-seq 64
        --seq 64 --steps 20 --lr 1e-2 --threads 1 "${lora[@]}")
run ref --batch 4
run ref2 --batch 2 --grad-accum 2
run ddp --batch 2 --nproc 2 && close "DDP 2" "$dir/ref.jsonl" "$dir/ddp.jsonl"
for z in 1 2 3; do run zero$z --batch 2 --nproc 2 --zero $z && close "ZeRO-$z on 2 ranks" "$dir/ref.jsonl" "$dir/zero$z.jsonl"; done
for s in gpipe 1f1b zb1; do
    run pp_$s --batch 2 --grad-accum 2 --nproc 2 --pp 2 --pp-schedule $s && close "PP 2, $s, 2 micro-batches" "$dir/ref2.jsonl" "$dir/pp_$s.jsonl"
done
run rc --batch 4 --recompute && close "recomputing" "$dir/ref.jsonl" "$dir/rc.jsonl"
run tp2 --batch 4 --nproc 2 --tp 2 && close "TP 2 (q's B split by heads, o_proj's and down_proj's A by input columns)" "$dir/ref.jsonl" "$dir/tp2.jsonl"
run sp --batch 4 --nproc 2 --tp 2 --sp && close "TP 2 with sequence parallelism" "$dir/ref.jsonl" "$dir/sp.jsonl"
run tp3 --batch 4 --nproc 3 --tp 3 && close "TP 3" "$dir/ref.jsonl" "$dir/tp3.jsonl"
run dptp --batch 2 --nproc 4 --tp 2 --zero 2 && close "DP 2 x TP 2, ZeRO-2" "$dir/ref.jsonl" "$dir/dptp.jsonl"
# GPT-2 (fused q/k/v: B split in three pieces a rank), clipped: the norm counts a replicated adapter once
g=(--model d6 --data "$dir/train.bin" --vocab 256 --layers 4 --channels 64 --heads 4 --max-seq 64 --seq 64 --steps 20 --lr 3e-3 --threads 1
   --quiet --lora-rank 4 --lora-targets c_attn,c_proj,c_fc --grad-clip 0.05 --batch 4)
if "$DTRAIN" train "${g[@]}" --metrics "$dir/g1.jsonl" > "$dir/g1.out" 2>&1 &&
   "$DTRAIN" train "${g[@]}" --nproc 2 --tp 2 --metrics "$dir/g2.jsonl" > "$dir/g2.out" 2>&1; then
    close "GPT-2, TP 2, clipped at 0.05" "$dir/g1.jsonl" "$dir/g2.jsonl"
    n=$(paste <(field grad_norm "$dir/g1.jsonl") <(field grad_norm "$dir/g2.jsonl") | awk 'BEGIN{w=0} {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d} END{print w}')
    awk "BEGIN{exit !($n <= 1e-6)}" && ok=1 || ok=0
    verdict $ok "GPT-2, TP 2: the gradient norm is one process's (worst $n)"
else
    failed=$((failed + 1)); echo "FAIL GPT-2 TP 2"; tail -n 2 "$dir/g1.out" "$dir/g2.out"
fi
# dropout 0.2 on the adapters' inputs: every layout drops the values one process drops (the masks drawn from each
# sequence's place in the data, its positions, the adapter and the column)
run drop --batch 4 --lora-dropout 0.2
run drop2 --batch 2 --grad-accum 2 --lora-dropout 0.2
d=$(paste <(field loss "$dir/ref.jsonl") <(field loss "$dir/drop.jsonl") | awk '$1 != $2' | wc -l)
[ "$d" -ge 15 ] && ok=1 || ok=0
verdict $ok "dropout 0.2 changes the losses ($d of 20 steps differ from no dropout's; the first cannot: B starts at 0)"
run drop_ddp --batch 2 --nproc 2 --lora-dropout 0.2 && close "dropout, DDP 2" "$dir/drop.jsonl" "$dir/drop_ddp.jsonl"
run drop_z3 --batch 2 --nproc 2 --zero 3 --lora-dropout 0.2 && close "dropout, ZeRO-3 on 2 ranks" "$dir/drop.jsonl" "$dir/drop_z3.jsonl"
run drop_sp --batch 4 --nproc 2 --tp 2 --sp --lora-dropout 0.2 &&
    close "dropout, TP 2 with sequence parallelism (o_proj's and down_proj's columns split)" "$dir/drop.jsonl" "$dir/drop_sp.jsonl"
run drop_pp --batch 2 --grad-accum 2 --nproc 2 --pp 2 --pp-schedule 1f1b --lora-dropout 0.2 &&
    close "dropout, PP 2 1F1B, 2 micro-batches" "$dir/drop2.jsonl" "$dir/drop_pp.jsonl"
run drop_cp --batch 4 --nproc 2 --cp 2 --lora-dropout 0.2 && close "dropout, CP 2 (each rank its chunks of every sequence)" "$dir/drop.jsonl" "$dir/drop_cp.jsonl"
run drop_rc --batch 4 --recompute --lora-dropout 0.2 && close "dropout, recomputing (the masks drawn again)" "$dir/drop.jsonl" "$dir/drop_rc.jsonl"
# saved at step 10 under DDP 2, resumed alone on one process: the dropout and the masks go on as uninterrupted
if "$DTRAIN" train "${common[@]}" --quiet --steps 10 --batch 2 --nproc 2 --lora-dropout 0.2 --save "$dir/dck" --metrics "$dir/da.jsonl" > "$dir/da.out" 2>&1 &&
   "$DTRAIN" train "${common[@]:0:${#common[@]}-6}" --quiet --batch 4 --steps 20 --resume "$dir/dck" --metrics "$dir/db.jsonl" > "$dir/db.out" 2>&1; then
    w=$(worst <(cat "$dir/da.jsonl" "$dir/db.jsonl") "$dir/drop.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ok=1 || ok=0
    verdict $ok "dropout: saved by DDP 2 at step 10, --resume DIR alone on one process: worst relative loss difference $w"
else
    failed=$((failed + 1)); echo "FAIL dropout save or resume"; tail -3 "$dir/da.out" "$dir/db.out"
fi
grep -Eq '"lora_dropout":[[:space:]]*0.2,' "$dir/dck/adapter_config.json" && ok=1 || ok=0
verdict $ok "PEFT's adapter_config.json beside the checkpoint says lora_dropout 0.2"
# the loss falls and the base stays: the losses are not one process's without adapters
w=$(paste <(field loss "$dir/ref.jsonl") | awk 'NR==1{a=$1} {b=$1} END{print (b < a) ? 1 : 0}')
verdict "$w" "the loss falls over 20 steps ($(field loss "$dir/ref.jsonl" | head -1) -> $(field loss "$dir/ref.jsonl" | tail -1))"
# saved by PP 2 at step 10, resumed by ZeRO-2 on 2 ranks
if "$DTRAIN" train "${common[@]}" --quiet --steps 10 --batch 2 --grad-accum 2 --nproc 2 --pp 2 --save "$dir/ck" --metrics "$dir/a.jsonl" > "$dir/a.out" 2>&1 &&
   "$DTRAIN" train "${common[@]}" --quiet --batch 1 --grad-accum 2 --nproc 2 --zero 2 --resume "$dir/ck" --metrics "$dir/b.jsonl" > "$dir/b.out" 2>&1; then
    w=$(worst <(cat "$dir/a.jsonl" "$dir/b.jsonl") "$dir/ref2.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ok=1 || ok=0
    verdict $ok "saved by PP 2 at step 10, resumed by ZeRO-2 on 2 ranks: worst relative loss difference $w"
else
    failed=$((failed + 1)); echo "FAIL save or resume"; tail -3 "$dir/a.out" "$dir/b.out"
fi
# the adapters alone: per layer q (48x48) and v (24x48), down (48x96), each rank 4: 4 x (in + out) floats
want=$(( 4 * 4 * ((48 + 48) + (48 + 24) + (96 + 48)) * 4 ))
got=$(stat -c %s "$dir"/ck/step-*/params.f32 2>/dev/null | tail -1)
[ "$got" = "$want" ] && ok=1 || ok=0
verdict $ok "the checkpoint holds the adapters alone: params.f32 is $got bytes ($want expected)"
"$DTRAIN" train "${common[@]}" --steps 1 --batch 4 > "$dir/line.out" 2>&1
grep -q "LoRA rank 4, alpha 16 on q_proj,v_proj,down_proj: 0.005M adapter parameters train" "$dir/line.out" && ok=1 || ok=0
verdict $ok "the start line says what trains ($(grep -m1 LoRA "$dir/line.out" | cut -c1-90)...)"
refused "a checkpoint of adapters loaded as a model" "holds LoRA adapters, not a model" \
    train --model "$dir/ck" --data "$dir/train.bin" --seq 64 --batch 1 --steps 1
refused "resumed with other adapters" "this run's rank 8" train "${common[@]}" --lora-rank 8 --batch 4 --steps 30 --resume "$dir/ck"
# the model's flags without the adapters': what a resume alone, eval and generate take
plain=("${common[@]}")
plain=("${plain[@]:0:${#plain[@]}-6}")
"$DTRAIN" train "${plain[@]}" --steps 25 --resume "$dir/ck" > "$dir/alone.out" 2>&1 &&
    grep -q "LoRA rank 4, alpha 16 on q_proj,v_proj,down_proj" "$dir/alone.out" && grep -q "^step 25/25" "$dir/alone.out" && ok=1 || ok=0
verdict $ok "--resume DIR alone goes on training its adapters (rank, alpha, targets from the checkpoint)"
# PEFT's folder beside the checkpoint: evaluated with the base, merged into it, both the same loss
[ -f "$dir/ck/adapter_config.json" ] && [ -f "$dir/ck/adapter_model.safetensors" ] && ok=1 || ok=0
verdict $ok "the checkpoint directory holds PEFT's adapter folder (adapter_config.json, adapter_model.safetensors)"
"$DTRAIN" train "${plain[@]}" --steps 1 --lr 1e-30 --save "$dir/base" --quiet > /dev/null 2>&1 # the seed's weights, as a file
ev() { "$DTRAIN" eval "$@" --data "$dir/train.bin" --val-data "$dir/train.bin" --seq 64 --batch 4 --eval-batches 2 2>&1 | grep -o "validation loss [0-9.]*"; }
if "$DTRAIN" ckpt merge "$dir/base" "$dir/ck" "$dir/merged" > "$dir/merge.out" 2>&1; then
    a=$(ev --model "$dir/base" --lora "$dir/ck") b=$(ev --model "$dir/merged") c=$(ev --model "$dir/base")
    [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "$c" ] && ok=1 || ok=0
    verdict $ok "base + adapters ($a) = the merged folder ($b), not the base alone ($c)"
    d=$(ev --model "$dir/base" --lora "$dir/ck" --nproc 2 --tp 2)
    [ -n "$d" ] && awk -v x="${a##* }" -v y="${d##* }" 'BEGIN{e=(x-y)/x; if(e<0)e=-e; exit !(e <= 1e-5)}' && ok=1 || ok=0
    verdict $ok "eval --lora DIR under TP 2 (each rank its slices of PEFT's adapters): $d, one process ${a##* }"
    g1=$("$DTRAIN" generate --model "$dir/base" --lora "$dir/ck" --ids --prompt 84,104,101 --tokens 12 --temperature 0 2>&1 | tail -1)
    g2=$("$DTRAIN" generate --model "$dir/merged" --ids --prompt 84,104,101 --tokens 12 --temperature 0 2>&1 | tail -1)
    [ -n "$g1" ] && [ "$g1" = "$g2" ] && ok=1 || ok=0
    verdict $ok "generate --lora decodes the merged model's greedy tokens ($g1)"
    a=$(ev --model "$dir/base" --lora "$dir/dck") b=$(ev --model "$dir/base" --lora "$dir/dck" --lora-dropout 0)
    [ -n "$a" ] && [ "$a" = "$b" ] && ok=1 || ok=0
    verdict $ok "evaluation drops nothing: eval --lora of the dropout run's folder ($a) = with --lora-dropout 0 ($b)"
else
    failed=$((failed + 1)); echo "FAIL ckpt merge: $(tail -1 "$dir/merge.out")"
fi
"$DTRAIN" train "${plain[@]/#48/96}" --steps 1 --lr 1e-30 --save "$dir/other" --quiet > /dev/null 2>&1
refused "adapters whose base does not match the model (the tensor and its shapes named)" "lora_A.weight" \
    ckpt merge "$dir/other" "$dir/ck" "$dir/merged2"
refused "a K/V Linear whose heads several tensor-parallel ranks keep" "kept by 2 tensor-parallel ranks" \
    train "${common[@]}" --batch 4 --nproc 4 --tp 4 --kv-heads 2
refused "targets that match no Linear" "match no Linear" train "${common[@]}" --batch 4 --lora-targets c_attn
refused "LoRA on an image model" "LoRA is built for the language models" train --model mlp --synthetic --steps 1 --lora-rank 4
refused "--lora-dropout without adapters" "give --lora-rank R or --lora DIR" train "${plain[@]}" --batch 4 --steps 1 --lora-dropout 0.1
refused "--lora-dropout 1" "a probability from 0 to 0.999" train "${common[@]}" --batch 4 --steps 1 --lora-dropout 1
echo "lora equivalence: $passed passed, $failed failed"
[ "$failed" = 0 ]
