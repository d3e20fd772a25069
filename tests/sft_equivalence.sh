#!/bin/bash
# Supervised fine-tuning (--data FILE.jsonl: chats rendered by ChatML, the loss on the assistant's turns, rows that
# score different numbers of tokens) gives the losses of one process with the global batch over 20 AdamW steps,
# within 1e-6 relative, in every layout: accumulation, DDP 2, ZeRO-2 and 3, TP 2, PP 2 (1F1B), CP 2, DP 2 x TP 2,
# and with LoRA under DDP 2 (every layout takes the mean over the global batch's scored tokens); --pack (the chats
# binned into full rows, attention and positions inside each) under DDP 2, TP 2 with SP, PP 2 (1F1B, interleaved) and
# blockwise attention. A checkpoint saved
# at step 10 resumes with the same losses; --val-data FILE.jsonl evaluates the same on 1 and 2 ranks; what cannot
# be is refused: a token file beside a .jsonl, chats without a tokenizer, a line holding a NUL or two values or not UTF-8.
# usage: sft_equivalence.sh DTRAIN FIXTURES
set -u
DTRAIN=$1
FIX=$2
. "$(dirname "$0")/finetune_checks.sh"
cp "$FIX/sft/tokenizer.json" "$FIX/sft/tokenizer_config.json" "$dir/"
# chats from the license's lines: the user gives a line's start, the assistant its end (uneven lengths, several turns)
awk 'length($0) > 20 { n++; h = int(length($0) / 2); u = substr($0, 1, h); a = substr($0, h + 1);
     gsub(/\\/, "", u); gsub(/"/, "", u); gsub(/\\/, "", a); gsub(/"/, "", a);
     if (n % 3 == 0) printf "{\"messages\": [{\"role\": \"system\", \"content\": \"Finish the line.\"}, {\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", u, a;
     else if (n % 3 == 1) printf "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", u, a;
     else printf "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}, {\"role\": \"user\", \"content\": \"more\"}, {\"role\": \"assistant\", \"content\": \"no\"}]}\n", u, a }' \
    /usr/share/common-licenses/GPL-3 > "$dir/all.jsonl"
head -n 400 "$dir/all.jsonl" > "$dir/train.jsonl"
tail -n 40 "$dir/all.jsonl" > "$dir/val.jsonl"
shape=(--model llama-tiny --vocab 2048 --layers 2 --channels 48 --heads 4 --kv-heads 2 --ffn 96 --max-seq 128 --seq 64
       --data "$dir/train.jsonl" --steps 20 --lr 3e-3 --threads 1)
common=("${shape[@]}" --tokenizer "$dir/tokenizer.json")
run ref --batch 8
"$DTRAIN" train "${common[@]}" --batch 8 --steps 1 > "$dir/line.out" 2>&1
grep -q "supervised fine-tuning: 400 examples from .*train.jsonl (chatml), 8 rows a global batch" "$dir/line.out" && ok=1 || ok=0
verdict $ok "the start line says what trains ($(grep -m1 "supervised" "$dir/line.out" | cut -c1-100))"
run acc --batch 4 --grad-accum 2 && close "2 micro-batches of 4 rows" "$dir/ref.jsonl" "$dir/acc.jsonl"
run ddp --batch 4 --nproc 2 && close "DDP 2" "$dir/ref.jsonl" "$dir/ddp.jsonl"
run z2 --batch 4 --nproc 2 --zero 2 && close "ZeRO-2 on 2 ranks" "$dir/ref.jsonl" "$dir/z2.jsonl"
run z3 --batch 2 --grad-accum 2 --nproc 2 --zero 3 && close "ZeRO-3 on 2 ranks, 2 micro-batches" "$dir/ref.jsonl" "$dir/z3.jsonl"
run tp --batch 8 --nproc 2 --tp 2 && close "TP 2" "$dir/ref.jsonl" "$dir/tp.jsonl"
run pp --batch 2 --grad-accum 4 --nproc 2 --pp 2 && close "PP 2, 1F1B, 4 micro-batches" "$dir/ref.jsonl" "$dir/pp.jsonl"
run cp --batch 8 --nproc 2 --cp 2 && close "CP 2 (each rank half of every row)" "$dir/ref.jsonl" "$dir/cp.jsonl"
run dptp --batch 4 --nproc 4 --tp 2 --zero 2 && close "DP 2 x TP 2, ZeRO-2" "$dir/ref.jsonl" "$dir/dptp.jsonl"
run lref --batch 8 --lora-rank 4 --lora-targets q_proj,v_proj,down_proj
run lddp --batch 4 --nproc 2 --lora-rank 4 --lora-targets q_proj,v_proj,down_proj && close "LoRA, DDP 2" "$dir/lref.jsonl" "$dir/lddp.jsonl"
# --pack: the chats packed into full rows (each attending within itself), one process against the layouts
run pref --batch 8 --pack
"$DTRAIN" train "${common[@]}" --batch 8 --steps 1 --pack > "$dir/pline.out" 2>&1
rows=$(grep -o "400 examples packed into [0-9]* rows of 64 tokens" "$dir/pline.out" | grep -o "into [0-9]*" | cut -d' ' -f2)
[ -n "$rows" ] && [ "$rows" -lt 400 ] && ok=1 || ok=0
verdict $ok "--pack: 400 chats in ${rows:-?} rows of 64 tokens"
run pddp --batch 4 --nproc 2 --pack && close "--pack, DDP 2" "$dir/pref.jsonl" "$dir/pddp.jsonl"
run ptp --batch 8 --nproc 2 --tp 2 --sp --pack && close "--pack, TP 2 with sequence parallelism" "$dir/pref.jsonl" "$dir/ptp.jsonl"
run ppp --batch 2 --grad-accum 4 --nproc 2 --pp 2 --pack && close "--pack, PP 2, 1F1B, 4 micro-batches" "$dir/pref.jsonl" "$dir/ppp.jsonl"
run pblk --batch 8 --pack --attention blockwise && close "--pack, blockwise attention" "$dir/pref.jsonl" "$dir/pblk.jsonl"
run pref6 --batch 8 --pack --layers 6 # an interleaved pipeline's 2 chunks a stage: the positions kept from chunk 0 on
run pil --batch 2 --grad-accum 4 --nproc 2 --pp 2 --pp-schedule interleaved --virtual-stages 2 --pack --layers 6 &&
    close "--pack, PP 2 interleaved (2 chunks a stage)" "$dir/pref6.jsonl" "$dir/pil.jsonl"
# --resume DIR alone: the chats, their tokenizer and --pack from the checkpoint
"$DTRAIN" train "${common[@]}" --batch 8 --steps 2 --pack --quiet --save "$dir/pk" > /dev/null 2>&1
"$DTRAIN" train --resume "$dir/pk" --steps 3 > "$dir/pk.out" 2>&1 && grep -q "400 examples packed into $rows rows" "$dir/pk.out" &&
    grep -q "^step 3/3" "$dir/pk.out" && ok=1 || ok=0
verdict $ok "--resume DIR alone goes on with its chats, tokenizer and --pack"
# saved at step 10 under DDP 2, resumed on one process
if "$DTRAIN" train "${common[@]}" --quiet --batch 4 --nproc 2 --steps 10 --save "$dir/ck" --metrics "$dir/a.jsonl" > "$dir/a.out" 2>&1 &&
   "$DTRAIN" train "${common[@]}" --quiet --batch 8 --resume "$dir/ck" --metrics "$dir/b.jsonl" > "$dir/b.out" 2>&1; then
    w=$(worst <(cat "$dir/a.jsonl" "$dir/b.jsonl") "$dir/ref.jsonl")
    [ "$w" != missing ] && awk "BEGIN{exit !($w <= 1e-6)}" && ok=1 || ok=0
    verdict $ok "saved by DDP 2 at step 10, resumed on one process: worst relative loss difference $w"
else
    failed=$((failed + 1)); echo "FAIL save or resume"; tail -n 2 "$dir/a.out" "$dir/b.out"
fi
# validation: the mean over the evaluated rows' scored tokens, the same on 1 and 2 ranks
v1=$("$DTRAIN" train "${common[@]}" --batch 8 --steps 2 --val-data "$dir/val.jsonl" --eval-batches 4 2>&1 | grep -o "val loss [0-9.]*")
v2=$("$DTRAIN" train "${common[@]}" --batch 4 --nproc 2 --steps 2 --val-data "$dir/val.jsonl" --eval-batches 4 2>&1 | grep -o "val loss [0-9.]*")
a=${v1##* } b=${v2##* }
[ -n "$a" ] && [ -n "$b" ] && awk "BEGIN{d=($a-$b)/$a; if(d<0)d=-d; exit !(d <= 1e-5)}" && ok=1 || ok=0
verdict $ok "--val-data FILE.jsonl: one process $a, DDP 2 $b"
head -c 100000 /usr/share/common-licenses/GPL-3 > "$dir/text"
"$DTRAIN" tokenize --bytes "$dir/text" "$dir/tok.bin" > /dev/null
refused "a token file beside a .jsonl" "is chats or completions" train "${common[@]}" --batch 8 --val-data "$dir/tok.bin"
refused "chats without a tokenizer" "give --tokenizer" train "${shape[@]}" --batch 8
refused "--pack with context parallelism" "not with --cp 2" train "${common[@]}" --batch 8 --nproc 2 --cp 2 --pack
refused "--pack of a token file" "packs the examples of a .jsonl" train "${common[@]}" --batch 8 --data "$dir/tok.bin" --pack
refused "--shuffle-rows of a .jsonl" "rows are whole examples" train "${common[@]}" --batch 8 --shuffle 3 --shuffle-rows
# a line that cJSON would read short: text after its value, a NUL (JSON's \u0000) inside, a raw NUL byte in the file
{ head -n 20 "$dir/train.jsonl"; echo '{"prompt": "a", "completion": "b"} {"prompt": "c"}'; } > "$dir/two.jsonl"
refused "a line with text after its value" "two.jsonl:21: not JSON (or more than one value)" train "${common[@]}" --batch 8 --data "$dir/two.jsonl"
{ head -n 20 "$dir/train.jsonl"; echo '{"prompt": "a\u0000b", "completion": "b"}'; } > "$dir/nul.jsonl"
refused "a NUL inside a line" "nul.jsonl:21: holds a NUL character" train "${common[@]}" --batch 8 --data "$dir/nul.jsonl"
{ head -n 20 "$dir/train.jsonl"; printf '{"prompt": "caf\351", "completion": "b"}\n'; } > "$dir/latin1.jsonl"
refused "a line in Latin-1" "latin1.jsonl:21: byte 15 of the line (0xe9) starts no UTF-8" train "${common[@]}" --batch 8 --data "$dir/latin1.jsonl"
{ head -n 20 "$dir/train.jsonl"; printf 'x\0y\n'; } > "$dir/raw.jsonl"
refused "a NUL byte in the file" "raw.jsonl: byte [0-9]* is a NUL" train "${common[@]}" --batch 8 --data "$dir/raw.jsonl"
echo "sft equivalence: $passed passed, $failed failed"
[ "$failed" = 0 ]
