#!/bin/bash
# A real result of preference tuning: the demo's byte-level model of the King James Bible (make demo) taught by DPO,
# with LoRA adapters, to prefer one answer to another it finds about as likely: "Shout: " and the start of a verse (its
# first words, up to 24 bytes), chosen: the same words in capitals, rejected: the same words as they are (what the
# model, trained on the text, would rather say). Every 20th verse held out. Prints the held-out DPO loss, reward
# accuracy and margin before and during training, and greedy answers to held-out verses from the model alone and
# with the adapters merged (dtrain generate --lora).
# usage: scripts/dpo_kjv.sh [BUILD_DIR] [STEPS (100)] [LR (3e-4)] [BETA (0.1)]
set -euo pipefail
build=${1:-build}
steps=${2:-100}
lr=${3:-3e-4}
beta=${4:-0.1}
dtrain=$build/dtrain
out=$build/dpo_kjv
mkdir -p "$out"
[ -s "$build/demo/kjv.bin" ] || scripts/demo.sh "$build" > /dev/null
# "Ge1:1 In the beginning God created ..." -> {"prompt": "Shout: In the beginning God\n", "chosen": "IN THE BEGINNING GOD\n",
# "rejected": "In the beginning God\n"}; a fifth of the verses to train on (the reference scores each once)
bible -f Gen1:1-Rev22:21 | awk -v out="$out" '{
    $1 = ""; sub(/^ /, ""); gsub(/[\\"]/, ""); s = "";
    for (i = 1; i <= NF && length(s) + length($i) + 1 <= 24; i++) s = s (i > 1 ? " " : "") $i;
    line = sprintf("{\"prompt\": \"Shout: %s\\n\", \"chosen\": \"%s\\n\", \"rejected\": \"%s\\n\"}", s, toupper(s), s);
    if (NR % 20 == 0) print line > (out "/val.jsonl"); else if (NR % 5 == 1) print line > (out "/train.jsonl") }'
echo "== $(wc -l < "$out/train.jsonl") pairs to train on, $(wc -l < "$out/val.jsonl") held out"
ask() { # MODEL [ADAPTERS]: greedy answers to held-out verses
    sed -n '1p;100p;400p;900p;1400p' "$out/val.jsonl" | sed 's/.*"prompt": "Shout: \(.*\)\\n", "chosen".*/\1/' |
        while read -r words; do
            printf '  Shout: %-26s -> ' "$words"
            "$dtrain" generate --model "$1" ${2:+--lora "$2"} --prompt "Shout: $words
" --tokens 30 --temperature 0 2>/dev/null | tail -n +2 | head -1
        done
}
common=(--model "$build/demo/kjv.bin" --data "$out/train.jsonl" --val-data "$out/val.jsonl" --seq 64 --eval-batches 32 --threads 2
        --dpo-beta "$beta" --lora-rank 16 --lora-alpha 32 --lora-targets c_attn,c_proj,c_fc)
echo "== the demo's model alone (the reference): log-probabilities of the held-out answers"
"$dtrain" train "${common[@]}" --batch 16 --steps 0 2>&1 | grep -E "preference|validation loss" | sed 's/^/  /'
ask "$build/demo/kjv.bin"
rm -rf "$out/ck"
every=$((steps / 4))
echo "== DPO (beta $beta) with LoRA (rank 16 on every Linear): $steps steps of 8 pairs, lr $lr"
"$dtrain" train "${common[@]}" --batch 16 --steps "$steps" --lr "$lr" --schedule cosine --warmup 10 --eval-every "$every" \
    --save "$out/ck" --metrics "$out/metrics.jsonl" 2>&1 | grep -E "pairs evaluated" | sed 's/^ */  /' |
    paste -d' ' - <(seq "$every" "$every" "$steps" | sed 's/^/(step /; s/$/)/')
grep -o '"step":[0-9]*,.*"val_loss":[0-9.]*' "$out/metrics.jsonl" | sed 's/"step":\([0-9]*\),.*"val_loss":\([0-9.]*\)/  step \1: held-out DPO loss \2/'
echo "== with the adapters (dtrain generate --lora $out/ck)"
ask "$build/demo/kjv.bin" "$out/ck"
